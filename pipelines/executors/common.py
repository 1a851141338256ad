"""What every executor shares: the JSON round trip of a pass's result, the actors' thread settings, batches.

Executors import these from here, never from their package's ``__init__`` (which imports none of them):
``local``, ``dask`` and ``beam`` return a dataset pass's result through :func:`json_round_trip`, so even
the Python types agree across executors; :func:`thread_env` is what Dask workers and the Beam
DirectRunner's worker processes run with; :func:`submit_batch` submits many calls of one stage at once
(one scheduler message per worker on Dask; one ``submit`` each elsewhere), where a call may take the
future of an earlier call of the same batch (:class:`Earlier`)::

    futures = submit_batch(executor, run_rollout_task, [
        BatchCall(args=(spec, ref, 0, 32), kwargs={"after": None}, key="rollout-a0-t0", actor=0),
        BatchCall(args=(spec, ref, 1, 32), kwargs={"after": Earlier(0)}, key="rollout-a0-t1", actor=0)])
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union


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
class Earlier:
    """In a :func:`submit_batch` call's arguments: the future of the batch's call number ``index`` (an
    earlier call of the same actor: executors that group calls by worker keep an actor's calls together)."""
    index: int


@dataclasses.dataclass(frozen=True)
class BatchCall:
    """One call of a :func:`submit_batch`: ``fn(*args, **kwargs)`` under task ``key``, pinned like ``actor``'s."""
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    key: str
    actor: Optional[int] = None


def resolve_earlier(value: Any, futures: Union[Sequence[Any], Mapping[int, Any]]) -> Any:
    """``value`` with every :class:`Earlier` (top level, or in a list, tuple or dict) replaced by its future."""
    if isinstance(value, Earlier):
        return futures[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(resolve_earlier(v, futures) for v in value)
    if isinstance(value, dict):
        return {k: resolve_earlier(v, futures) for k, v in value.items()}
    return value


def submit_batch(executor, fn: Callable, calls: Sequence[BatchCall]) -> List[Any]:
    """The futures of ``fn`` over ``calls``, in order: ``executor.submit_batch`` where it has one (Dask: one
    scheduler message per worker instead of one per call), else one ``executor.submit`` per call."""
    batch = getattr(executor, "submit_batch", None)
    if batch is not None:
        return batch(fn, calls)
    futures: List[Any] = []
    for c in calls:
        futures.append(executor.submit(fn, *resolve_earlier(c.args, futures), key=c.key, actor=c.actor,
                                       **resolve_earlier(c.kwargs, futures)))
    return futures
