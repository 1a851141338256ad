"""Thin executors: they schedule stage functions and hold no algorithm logic.

Every executor offers the same five calls, used by :mod:`pipelines.driver`::

    ex.broadcast(payload) -> ref      # send once, pass ref to many tasks
    ex.submit(fn, *args, key=..., actor=None) -> future   # .done(), .result()
    ex.wait(futures, timeout) -> list of done futures
    ex.workers() -> dict of per-worker info
    ex.close()

and the Dask executor one more, for a stage that holds state (the learner)::

    ex.place(cls, *args, resources={"GPU": 1}) -> handle   # pipelines.executors.dask_stage
"""
from __future__ import annotations


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


def run_with_executor(trainer_cls, cfg, run_dir: str, progress: bool = True, resume: bool = False) -> dict:
    """Start ``cfg.executor``, run ``trainer_cls(cfg, run_dir, executor, ...)``, always close the executor."""
    executor = make_executor(cfg.executor, cfg)
    try:
        return trainer_cls(cfg, run_dir, executor, progress=progress, resume=resume).run()
    finally:
        executor.close()


def _thread_env(cfg) -> dict:
    # Actors run LiteRT + numpy; one BLAS/OpenMP thread each keeps workers
    # from oversubscribing the cores they share with the learner.
    n = str(cfg.threads.litert)
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
