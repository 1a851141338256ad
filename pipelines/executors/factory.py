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

    Nothing imports alongside an embedded Dask cluster's start: its worker processes booting keep
    both cores of a 2-core machine busy, so TensorFlow importing on a thread beside them (as until
    2026-12-06) only slowed the cluster (LocalCluster 0.8 s alone, 1.8-2.2 s beside it, measured)
    and with it the first env step. TensorFlow now imports in the learner's set-up, after block 0's
    rollouts are submitted (``Trainer._setup``), while they step.
    """
    executor = make_executor(cfg.executor, cfg)
    try:
        return trainer_cls(cfg, run_dir, executor, progress=progress, resume=resume).run()
    finally:
        executor.close()

