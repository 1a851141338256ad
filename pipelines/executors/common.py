"""What every executor shares: the JSON round trip of a pass's result, the actors' thread settings, batches.

Executors import these from here, never from their package's ``__init__`` (which imports none of them):
``local``, ``dask`` and ``beam`` return a dataset pass's result through :func:`json_round_trip`, so even
the Python types agree across executors; :func:`thread_env` is what Dask workers and the Beam
DirectRunner's worker processes run with; :func:`submit_batch` submits many calls of one stage at once
(one scheduler message per worker on Dask; one ``submit`` each elsewhere); a call may take futures of
earlier batches (an actor's previous rollouts), never of its own::

    futures = submit_batch(executor, run_rollout_group, [
        BatchCall(args=(ref, specs_a0), kwargs={"after": {}, "threads": 1}, key="rollout-r-b0-a0", actor=0),
        BatchCall(args=(ref, specs_a1), kwargs={"after": {}, "threads": 1}, key="rollout-r-b0-a1", actor=1)])
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


def json_round_trip(value: Any) -> Any:
    """``value`` as JSON would return it (tuples become lists, numpy scalars are refused)."""
    return json.loads(json.dumps(value))


def thread_env(cfg) -> dict:
    # Actors run LiteRT + numpy; one BLAS/OpenMP thread each keeps workers
    # from oversubscribing the cores they share with the learner.
    n = str(cfg.threads.litert)
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}


@dataclasses.dataclass(frozen=True)
class BatchCall:
    """One call of a :func:`submit_batch`: ``fn(*args, **kwargs)`` under task ``key``, pinned like ``actor``'s."""
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    key: str
    actor: Optional[int] = None


def submit_batch(executor, fn: Callable, calls: Sequence[BatchCall]) -> List[Any]:
    """The futures of ``fn`` over ``calls``, in order: ``executor.submit_batch`` where it has one (Dask: one
    scheduler message per worker instead of one per call), else one ``executor.submit`` per call."""
    batch = getattr(executor, "submit_batch", None)
    if batch is not None:
        return batch(fn, calls)
    return [executor.submit(fn, *c.args, key=c.key, actor=c.actor, **c.kwargs) for c in calls]
