"""Local executor: every stage runs in this process, at submit time, in order.

Deterministic for a given seed (same seed, same final parameters), which
makes it the executor for debugging and tests.
"""
from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Callable, Dict, List, Sequence

from pipelines.executors.common import json_round_trip


class LocalExecutor:
    name = "local"
    deterministic = True
    in_process = True     # memory:// stores are visible to its stages

    def broadcast(self, payload: Any) -> Any:
        return payload

    def submit(self, fn: Callable, *args: Any, key: str | None = None, actor: int | None = None,
               **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*[_resolve(a) for a in args], **kwargs))
        except Exception as e:  # surfaced by .result(), like a remote failure
            future.set_exception(e)
        return future

    def wait(self, futures: Sequence[concurrent.futures.Future], timeout: float | None = None) -> List:
        return [f for f in futures if f.done()]

    def workers(self) -> Dict[str, Dict[str, Any]]:
        return {f"pid{os.getpid()}": {"kind": "in-process"}}

    def placement(self, num_actors: int) -> Dict[int, str]:
        """Where each actor runs: this process."""
        return {a: f"pid{os.getpid()} (in-process)" for a in range(num_actors)}

    def worker_pids(self) -> List[int]:
        """No worker processes: every stage runs in the driver (energy attribution)."""
        return []

    def map_reduce(self, label: str, fn: Callable, items: Sequence[Any], reduce: Callable) -> Any:
        """A dataset pass (:mod:`core.dataset`): ``reduce([fn(i) for i in items])``, here, in order."""
        return json_round_trip(reduce([fn(i) for i in items]))

    def close(self) -> None:
        pass


def _resolve(arg: Any) -> Any:
    # Futures passed as arguments (e.g. rollout results to the shard writer).
    if isinstance(arg, concurrent.futures.Future):
        return arg.result()
    if isinstance(arg, list):
        return [_resolve(a) for a in arg]
    return arg
