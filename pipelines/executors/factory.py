"""Executors by name: ``make_executor`` (training), ``make_pass_executor`` (dataset passes), ``run_with_executor``.

The executors themselves (:mod:`.local`, :mod:`.dask`, :mod:`.beam`) are imported inside these functions,
so choosing one never imports another's engine (Dask, Beam).

Example::

    import contextlib
    from pipelines.executors.factory import make_pass_executor
    with contextlib.closing(make_pass_executor("dask")) as engine:
        engine.map_reduce("stats", fn, shards, reduce)
"""
from __future__ import annotations

from typing import List, Optional

from pipelines.executors.common import thread_env

EXECUTORS = ("beam", "dask", "local")


def make_executor(kind: str, cfg):
    """``local`` or ``dask`` executor for config ``cfg``."""
    if kind == "local":
        from pipelines.executors.local import LocalExecutor
        return LocalExecutor()
    if kind == "dask":
        from pipelines.executors.dask import DaskExecutor
        return DaskExecutor(address=cfg.dask.address, n_workers=cfg.dask.n_workers,
                            threads_per_worker=cfg.dask.threads_per_worker,
                            retries=cfg.dask.task_retries, thread_env=thread_env(cfg),
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
