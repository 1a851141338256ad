"""Run a sweep (configs x grid settings x seeds) as one batch job: ``python -m pipelines.sweep``.

Argument parsing and output only; the work is in :mod:`pipelines.sweeps`.

Examples::

    python -m pipelines.sweep configs/sweeps/precision.yaml --out sweeps/precision --workers 2
    python -m pipelines.sweep --configs configs/default.yaml --seeds 0-9 \\
        --grid actors.precision=fp32,int8-dynamic --set total_env_steps=40000 --executor local --out sweeps/p
    python -m pipelines.sweep --resume sweeps/p                  # after a SIGTERM, Ctrl-C or a lost machine
    python -m pipelines.report sweep sweeps/p                    # IQM, bootstrap CIs, P(improvement), PNGs

Exit status: 0 when every run finished, 1 when any run failed (each recorded with its one-line error),
2 for a bad spec (one ``error:`` line, before any run starts), 130 when stopped (resume with --resume).
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from core.fast_exit import exit_now
from pipelines.cli import check_creatable_dir, check_locations, cli_errors, print_table

EPILOG = """
spec file (YAML; the same as the flags):
  configs: [configs/default.yaml, configs/actorq/cartpole-dqn.yaml]
  seeds: 0-9                         # A-B inclusive, 0,3,7, one seed, or a YAML list
  grid: {actors.precision: [fp32, int8-dynamic], learner.replay_ratio: [0.5, 0.25]}
  set: {total_env_steps: 40000}      # applied to every run
  a config entry may be a mapping: {config: PATH, name: NAME, seeds: 0-4, set: {inference: central}}
  (its name replaces the file's stem in run names; its set comes before the spec's set)
  shipped specs: configs/sweeps/*.yml (learning-suite, actorq-study, actorq-ratio, ...)

every (config, setting, seed) is one run, a process of its own:
  python -m pipelines.train --config C --seed S --set ... --run-dir SWEEP_DIR/runs/NAME --executor local
with one TensorFlow intra-op and inter-op thread (threads.tf_*=1, the spec's set may change it) and
single-threaded BLAS: the parallelism is across runs. NAME reads like default__actors.precision=fp32__s3.

sweep directory:
  sweep.json          the spec and the run list        status/NAME.json  state, attempts, one-line error
  runs/NAME/          each run's directory (summary.json when done)     logs/NAME.log  its output

executors:
  local   up to --workers runs at once as child processes (default: one per core)
  dask    each run a task on an embedded LocalCluster (--workers worker threads in this process) or on the
          cluster at --dask-address (workers need DataBloom installed and SWEEP_DIR on a shared filesystem)
  beam    one Beam pipeline whose elements are runs (DirectRunner, --workers processes); every run is
          started at once and Beam decides how many run together; outcomes are recorded when the job ends

stop and resume:
  SIGTERM or Ctrl-C: no new run starts; each running run checkpoints at its next learner block end and
  stops (a second signal kills them). --resume SWEEP_DIR skips finished runs, continues runs with a
  checkpoint (pipelines.train --resume), restarts runs that had none, and tries failed runs again.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.sweep", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run configs x grid settings x seeds as one resumable batch job, each run its own process "
                    "and run directory; a failed run is recorded and the others go on.")
    p.add_argument("spec", nargs="?", metavar="SPEC", help="YAML spec file (or give --configs and --seeds)")
    p.add_argument("--configs", nargs="+", metavar="CONFIG", help="config files (YAML), one or more")
    p.add_argument("--seeds", metavar="RANGE", help="seeds: A-B (inclusive), a list 0,3,7, or one seed")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="a grid axis: every value is a setting, axes combine (repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run (repeatable; after the spec file's set)")
    p.add_argument("--executor", choices=["local", "dask", "beam"], default="local",
                   help="where runs run: 'local' child processes (default), 'dask' tasks or 'beam' elements")
    p.add_argument("--dask-address", metavar="tcp://HOST:PORT",
                   help="with --executor dask: use this cluster instead of an embedded LocalCluster")
    p.add_argument("--workers", type=int, metavar="N",
                   help="runs at once (local) or embedded Dask workers (default: one per core)")
    p.add_argument("--out", metavar="SWEEP_DIR", help="new sweep directory (local; refused if it holds a sweep)")
    p.add_argument("--resume", metavar="SWEEP_DIR", help="continue the sweep in SWEEP_DIR (no spec options)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _spec_from_args(args):
    """The spec from SPEC and/or the flags; ConfigError (one line) when it is missing or malformed."""
    from core.config import ConfigError
    from pipelines.sweeps.spec import SweepSpec, parse_grid, read_spec_data
    data = read_spec_data(args.spec) if args.spec else {}
    if args.configs:
        data["configs"] = args.configs
    if args.seeds is not None:
        data["seeds"] = args.seeds
    if "configs" not in data:
        raise ConfigError("no configs; valid: a SPEC file or --configs CONFIG... --seeds RANGE")
    spec = SweepSpec.from_dict(data, where=args.spec or "the spec")
    spec.grid.update(parse_grid(args.grid))
    spec.overrides.extend(args.overrides)
    return spec


def _check_args(args) -> None:
    from core.config import ConfigError, check_dask_address
    if args.resume and (args.spec or args.configs or args.seeds or args.grid or args.overrides or args.out):
        raise ConfigError("--resume takes the spec from SWEEP_DIR/sweep.json; valid: --resume SWEEP_DIR "
                          "[--executor, --workers, --dask-address] without SPEC, --configs, --seeds, --grid, "
                          "--set or --out")
    if not args.resume and not args.out:
        raise ConfigError("--out SWEEP_DIR is required for a new sweep (or --resume SWEEP_DIR)")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: valid: 1 or more")
    if args.dask_address:
        if args.executor != "dask":
            raise ConfigError("--dask-address needs --executor dask")
        check_dask_address(args.dask_address)
    check_locations(("--out", args.out), ("--resume", args.resume), probe=False)


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    from pipelines.sweeps.job import Executor, run_job
    spec = None
    if not args.resume:
        check_creatable_dir(args.out, "--out")
        spec = _spec_from_args(args)
    sweep, runs, result = run_job(spec, args.resume or args.out, Executor(args.executor, args.workers,
                                                                           args.dask_address),
                                  resume=bool(args.resume), progress=not args.no_progress,
                                  argv=list(sys.argv[1:] if argv is None else argv))
    return _report(sweep, runs, result)


def _report(sweep, runs, result) -> int:
    statuses = sweep.statuses(runs)
    failed = [statuses[n] for n in result["failed"]]
    for s in failed:
        print(f"failed: {s.name}: {s.error}", file=sys.stderr)
    print_table(["runs", "done", "failed", "stopped", "not started"],
                [[len(runs), len(result["done"]), len(failed), len(result["stopped"]), len(result["pending"])]])
    if result["signal"]:
        print(f"stopped by {result['signal'][0]}; resume with: python -m pipelines.sweep --resume {sweep.root}",
              file=sys.stderr)
        return 130
    print(f"sweep record: {sweep.record_path}; report: python -m pipelines.report sweep {sweep.root}")
    return 1 if failed else 0


if __name__ == "__main__":  # Dask spawns workers that re-import __main__: keep this guard.
    exit_now(main())
