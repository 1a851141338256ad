"""A study's runs go through the product's sweep: the shared options, the job, and each run's record.

The studies (``learning_suite``, ``actorq_study``; ``actorq_ratio_sweep`` reads a sweep directory) keep
no run bookkeeping of their own: their grid is a spec file under ``configs/sweeps/``, their runs are one
sweep (:func:`pipelines.sweeps.job.run_job`: resumable, on the local, dask or beam executor, a failed run
recorded with its one-line error), and they add only their report, read from the sweep directory::

    spec file (+ the study's flags) -> SweepSpec -> run_job(SWEEP_DIR) -> run_record per run -> the report

Each run of a sweep is ``python -m pipelines.train ... --executor local`` with one TensorFlow thread
(:mod:`pipelines.sweeps.launch`); a study's default ``--workers`` is 1 (one run at a time: its times to
target are not shared with another run on this 2-core machine).

Example::

    args = parser.parse_args()                       # after add_sweep_options(parser)
    sweep, runs, result = run_study(spec, "runs/aq", args)
    records = [run_record(sweep, r) for r in runs]
"""
from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks.common import REPO, machine_info
from pipelines.sweeps.job import EXECUTORS, Executor, run_job
from pipelines.sweeps.record import SweepDir
from pipelines.sweeps.spec import THREAD_OVERRIDES, RunSpec, SweepSpec

#: exit status of a study stopped by SIGTERM or Ctrl-C (rerun the same command with --resume to continue)
STOPPED = 130


def add_sweep_options(p: argparse.ArgumentParser) -> None:
    """``--executor``, ``--workers``, ``--dask-address``, ``--no-progress``: passed to the sweep."""
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="where the runs run (python -m pipelines.sweep --executor): local processes, dask tasks, "
                        "beam elements")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="runs at once (default 1: times to target measured one run at a time)")
    p.add_argument("--dask-address", metavar="tcp://HOST:PORT", help="with --executor dask: an existing cluster")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (automatic without a terminal)")


def run_study(spec: SweepSpec, out: str, args: argparse.Namespace,
              resume: bool) -> Tuple[SweepDir, List[RunSpec], Dict[str, List[str]]]:
    """Run ``spec`` as the sweep in ``out`` (continue it with ``resume``); the outcome by run name."""
    from core.config import ConfigError
    if args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: valid: 1 or more")
    if args.dask_address and args.executor != "dask":
        raise ConfigError("--dask-address needs --executor dask")
    progress = not args.no_progress and sys.stderr.isatty()
    return run_job(spec, out, Executor(args.executor, args.workers, args.dask_address), resume=resume,
                   progress=progress, argv=sys.argv[1:])


def repo_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (records name configs as configs/...)."""
    rel = os.path.relpath(os.path.abspath(path), REPO)
    return path if rel.startswith("..") else rel.replace(os.sep, "/")


def own_overrides(run: RunSpec) -> List[str]:
    """The run's overrides without the sweep's thread settings: the entry's set, the spec's set, the setting."""
    return list(run.overrides[len(THREAD_OVERRIDES):])


def run_record(sweep: SweepDir, run: RunSpec, commit: str, dirty: bool) -> Optional[Dict[str, Any]]:
    """What every study records of one run, or None for a run that did not end (pending, stopped).

    ``status`` is ``ok`` (its summary.json is whole) or ``failed`` (with ``error``, its one-line error);
    ``process_wall_s`` is the run's process wall time as the sweep measured it; ``command`` the run's
    ``pipelines.train`` command, as a person would type it from the repository.
    """
    status = sweep.read_status(run.name)
    finished = sweep.finished(run.name)
    if not finished and status.state != "failed":
        return None
    run_dir = sweep.run_dir(run.name)
    started = status.started or status.ended
    date = (datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds")
            if started else None)
    args = [a if a != run.config else repo_path(a) for a in run.train_args(run_dir)]
    rec: Dict[str, Any] = {
        "config": repo_path(run.config), "overrides": own_overrides(run), "seed": run.seed, "run": run.name,
        "status": "ok" if finished else "failed", "returncode": status.returncode, "attempts": status.attempts,
        "process_wall_s": status.wall_s, "git_commit": commit, "git_dirty": dirty, "date": date,
        "machine": machine_info(with_load=False), "command": shlex.join(["python", "-m", "pipelines.train", *args]),
        "run_dir": run_dir, "log": sweep.log_path(run.name)}
    if not finished:
        rec["error"] = status.error
    return rec


def print_outcome(sweep: SweepDir, runs: Sequence[RunSpec], result: Dict[str, List[str]]) -> int:
    """One line per failed run and a count; :data:`STOPPED` (with how to continue) if the sweep was stopped."""
    for name in result["failed"]:
        print(f"failed: {name}: {sweep.read_status(name).error}", file=sys.stderr)
    print(f"{len(runs)} runs: {len(result['done'])} done, {len(result['failed'])} failed, "
          f"{len(result['stopped'])} stopped, {len(result['pending'])} not started; sweep: {sweep.root}", flush=True)
    if result.get("signal"):
        print(f"stopped by {result['signal'][0]}; continue with the same command and --resume", file=sys.stderr)
        return STOPPED
    return 0
