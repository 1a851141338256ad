"""Thin executors: they schedule stage functions and hold no algorithm logic.

One protocol serves training (:mod:`pipelines.run.driver`) and dataset passes
(:mod:`pipelines.process`, :mod:`core.dataset`)::

    ex.broadcast(payload) -> ref      # send once, pass ref to many tasks
    ex.submit(fn, *args, key=..., actor=None) -> future   # .done(), .result()
    ex.wait(futures, timeout) -> list of done futures
    ex.map_reduce(label, fn, items, reduce) -> JSON-able result   # one dataset pass
    ex.workers() -> dict of per-worker info
    ex.close()

``map_reduce`` holds no dataset logic: ``fn`` and ``reduce`` are plain
module-level functions of :mod:`core.dataset`, and ``reduce`` sorts its
inputs, so a pass's result does not depend on the executor or on the order
results arrived. Every executor returns it after a JSON round trip, so even
the Python types agree across executors (a test checks this).

Executors: ``local`` (this process, in order; deterministic), ``dask``
(:mod:`.dask`: an embedded LocalCluster or an existing scheduler), ``beam``
(:mod:`.beam`: dataset passes as one pipeline each; training on Beam runs as
rounds, :mod:`pipelines.beam.rounds`).

The Dask executor has one call more, for a stage that holds state (the learner)::

    ex.place(cls, *args, resources={"GPU": 1}) -> handle   # pipelines.executors.dask_stage
"""
from __future__ import annotations

import json
from typing import Any, List, Optional

EXECUTORS = ("beam", "dask", "local")


def json_round_trip(value: Any) -> Any:
    """``value`` as JSON would return it (tuples become lists, numpy scalars are refused)."""
    return json.loads(json.dumps(value))


def make_executor(kind: str, cfg):
    """``local`` or ``dask`` executor for config ``cfg``."""
    if kind == "local":
        from pipelines.executors.local import LocalExecutor
        return LocalExecutor()
    if kind == "dask":
        from pipelines.executors.dask import DaskExecutor
        return DaskExecutor(address=cfg.dask.address, n_workers=cfg.dask.n_workers,
                            threads_per_worker=cfg.dask.threads_per_worker,
                            retries=cfg.dask.task_retries, thread_env=_thread_env(cfg),
                            learner_resources=cfg.learner.resources)
    raise ValueError(f"unknown executor {kind!r}; valid: local, dask")


def make_pass_executor(kind: str, pipeline_args: Optional[List[str]] = None, dask_address: Optional[str] = None,
                       n_workers: int = 0):
    """An executor for dataset passes by name; DatasetError (one line) for unknown names or misplaced Beam options.

    Close it when done (``contextlib.closing``).
    """
    from core.dataset.errors import DatasetError
    if kind not in EXECUTORS:
        raise DatasetError(f"unknown executor {kind!r}; valid: {', '.join(EXECUTORS)}")
    if pipeline_args and kind != "beam":
        raise DatasetError(f"unrecognized arguments: {' '.join(pipeline_args)} (Beam pipeline options pass"
                           " through only with --executor beam)")
    if kind == "beam":
        from pipelines.executors.beam import BeamExecutor
        return BeamExecutor(pipeline_args)
    if kind == "dask":
        from pipelines.executors.dask import DaskExecutor
        return DaskExecutor(address=dask_address, n_workers=n_workers, retries=2)
    from pipelines.executors.local import LocalExecutor
    return LocalExecutor()


def run_with_executor(trainer_cls, cfg, run_dir: str, progress: bool = True, resume: bool = False) -> dict:
    """Start ``cfg.executor``, run ``trainer_cls(cfg, run_dir, executor, ...)``, always close the executor.

    While an embedded Dask cluster starts (its worker processes boot on the other cores and this
    process mostly waits), TensorFlow imports on a background thread: the learner's set-up then
    finds it imported, and start-up overlaps instead of adding up.
    """
    if cfg.executor == "dask":
        import_in_background("tensorflow")
    executor = make_executor(cfg.executor, cfg)
    try:
        return trainer_cls(cfg, run_dir, executor, progress=progress, resume=resume).run()
    finally:
        executor.close()


def import_in_background(module: str):
    """Import ``module`` on a daemon thread; returns the thread (a later ``import`` waits for it).

    numpy and distributed are imported first, here: the modules both threads need are then
    complete before the threads overlap, so neither waits on the other's half-imported module.
    Only imports run there (no TF ops), so thread-pool settings made later still apply.
    """
    import importlib
    import threading

    import distributed  # noqa: F401
    import numpy  # noqa: F401
    thread = threading.Thread(target=importlib.import_module, args=(module,), name=f"import-{module}",
                              daemon=True)
    thread.start()
    return thread


def _thread_env(cfg) -> dict:
    # Actors run LiteRT + numpy; one BLAS/OpenMP thread each keeps workers
    # from oversubscribing the cores they share with the learner.
    n = str(cfg.threads.litert)
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
