"""A sweep as one call: start or continue it in SWEEP_DIR, under its lock, on a chosen executor.

``python -m pipelines.sweep`` and the studies in ``benchmarks/studies`` (a spec file each, plus their own
report) start sweeps through these two functions, so every sweep is resumable and runs on any executor::

    spec -> expand -> validate_runs (every run's config, before any run starts)
         -> SweepDir.create (new) | SweepDir.load (continue) -> RunLock -> run_sweep(backend) -> outcome

Example::

    sweep, runs, result = run_job(spec, "sweeps/p", Executor("local", workers=2))
    sweep, runs, result = run_job(None, "sweeps/p", Executor("dask"), resume=True)   # after a stop
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, List, Optional, Sequence, Tuple

from core.config import ConfigError
from pipelines.sweeps.record import SweepDir
from pipelines.sweeps.spec import RunSpec, SweepSpec, expand, validate_runs

EXECUTORS = ("local", "dask", "beam")


@dataclasses.dataclass
class Executor:
    """Where a sweep's runs run: ``kind`` (local, dask, beam), ``workers`` (default: one per core)."""
    kind: str = "local"
    workers: Optional[int] = None
    dask_address: Optional[str] = None

    def backend(self):
        """The backend of :mod:`pipelines.sweeps.runner`'s protocol for this executor."""
        if self.kind not in EXECUTORS:
            raise ConfigError(f"executor {self.kind!r} is not valid; valid: {', '.join(EXECUTORS)}")
        workers = self.workers or os.cpu_count() or 1
        if self.kind == "dask":
            from pipelines.sweeps.dask_runner import DaskBackend
            return DaskBackend(self.dask_address, workers)
        if self.kind == "beam":
            from pipelines.sweeps.beam_runner import BeamBackend
            return BeamBackend(workers)
        from pipelines.sweeps.launch import LocalBackend
        return LocalBackend(workers)


def prepare(spec: Optional[SweepSpec], out: str, resume: bool) -> Tuple[SweepDir, SweepSpec, List[RunSpec]]:
    """The sweep directory, spec and runs; every run's config is validated before anything is written.

    A new sweep (``resume`` False) refuses a directory that holds one (naming ``--resume``). To continue
    (``resume`` True), ``spec`` is None (take SWEEP_DIR's) or must expand to the same runs as SWEEP_DIR's.
    """
    sweep = SweepDir(out)
    if resume:
        stored, runs = sweep.load()
        if spec is not None and [r.to_dict() for r in expand(spec)] != [r.to_dict() for r in runs]:
            raise ConfigError(f"{sweep.root} holds a sweep of other runs than these; valid: the same spec and "
                              f"options as when it started, or a new directory")
        validate_runs([r for r in runs if not sweep.finished(r.name)])
        return sweep, stored, runs
    if spec is None:
        raise ConfigError("a new sweep needs a spec; valid: a SPEC file or --configs CONFIG... --seeds RANGE")
    runs = expand(spec)
    validate_runs(runs)
    if sweep.exists():
        sweep.create(spec, runs)         # refuses, with the --resume hint
    return sweep, spec, runs


def run_job(spec: Optional[SweepSpec], out: str, executor: Executor, resume: bool = False, progress: bool = True,
            argv: Optional[Sequence[str]] = None) -> Tuple[SweepDir, List[RunSpec], Dict[str, List[str]]]:
    """Start (or with ``resume`` continue) the sweep in ``out`` and run it; returns the outcome by run name."""
    from core.run_lock import RunLock
    from pipelines.sweeps.runner import run_sweep
    sweep, spec, runs = prepare(spec, out, resume)
    os.makedirs(sweep.root, exist_ok=True)
    with RunLock(sweep.root):            # a second sweep on this directory is refused
        if not resume:
            sweep.create(spec, runs, argv=list(argv) if argv is not None else None)
        backend = executor.backend()
        try:
            result = run_sweep(sweep, runs, backend, progress=progress)
        finally:
            backend.close()
    return sweep, runs, result
