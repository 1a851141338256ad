"""The ActorQ study on this machine: fp32 vs int8 actors, time to target, energy, carbon.

Tasks: CartPole-v1 DQN, Pendulum-v1 D4PG, dm_control cartpole-balance D4PG. Precisions: fp32 and
int8 (``int8-dynamic``: int8 weights and GEMM kernels, patched into a prebuilt flatbuffer per version).
The grid is a sweep spec (``configs/sweeps/actorq-study*.yml``: tasks x precisions x seeds) and the runs
are one sweep of the product (:mod:`benchmarks.studies.suite_runs`) in ``OUT``: every run a fresh
``pipelines.train`` process (time to target counts from process start; carbon.json covers the process),
one at a time by default (``--workers``), resumable by running the same command again. The study adds
its report only (:func:`core.report.write_report`, to ``OUT/report``) over the seeds whose precisions
all finished, and ``OUT/study.json`` (the runs' commands, the date, the machine).

Sizes (``--size``, each a spec file):

* ``actorq`` (default, ``actorq-study.yml``): ``configs/actorq/`` (3x2048 policy MLP, the ActorQ paper's
  actor), with env-step budgets that fit the time box;
* ``actor-bound`` (``actorq-study-actor-bound.yml``): the same policy, low samples-per-insert, small
  learner batch, more envs per actor;
* ``small`` (``actorq-study-small.yml``): the tuned configs (256x256) that reach the targets fast.

Energy uses the ``process-time`` carbon backend (CPU seconds of the run's processes x 4 W/thread + RAM):
on a shared machine codecarbon's machine mode would also charge other users' load.

The runs go in the sweep's order (task, precision, seed). Records made before 2026-12-05 came from the
old loop (task, seed, then fp32 and int8 back to back, each run with its config's executor); runs in a
sweep use the local executor and one TensorFlow thread.

Usage::

    python -m benchmarks.studies.actorq_study --quick --out /tmp/actorq-quick     # 1 seed, 2,000 env steps
    python -m benchmarks.studies.actorq_study --out /tmp/actorq                    # 3 seeds
    python -m benchmarks.studies.actorq_study --size small --seeds 3 --out /tmp/aq-small
    python -m benchmarks.studies.actorq_study --to-target --out /tmp/aq --keep benchmarks/results/actorq-study-runs
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:   # run as a script or imported by tests: this checkout's core/benchmarks
    sys.path.insert(0, REPO)

from benchmarks.common import git_state, machine_info, slug  # noqa: E402
from benchmarks.studies import suite_runs  # noqa: E402
from pipelines.cli import cli_errors  # noqa: E402

#: the study's tasks: the entry names of its spec files
TASKS = ("cartpole-dqn", "pendulum-d4pg", "dmc-cartpole-balance-d4pg")
SPECS = {"actorq": "actorq-study.yml", "actor-bound": "actorq-study-actor-bound.yml",
         "small": "actorq-study-small.yml", "quick": "actorq-study-quick.yml"}
PRECISIONS = ("fp32", "int8-dynamic")

EPILOG = """
sweep and resume:
  OUT is a sweep directory (python -m pipelines.sweep): runs/, status/, logs/, sweep.json, plus report/
  and study.json. The same command again continues it: finished runs are not run again, stopped ones
  continue from their checkpoint, failed ones run again (python -m pipelines.sweep --resume OUT does too).

records:
  With --keep DIR every seed whose precisions all finished is saved as small report records (config,
  summary, carbon, evaluations, the last workers record, and record.json: command, seconds, commit,
  date) in DIR/<task>-<size>-<budget>[--<overrides>]/<precision>-s<seed>/, a few kB each, to commit. The
  committed records are packed: tar xzf benchmarks/results/actorq-study-runs.tar.gz -C benchmarks/results.

examples:
  python -m benchmarks.studies.actorq_study --quick --out /tmp/actorq-quick
  python -m benchmarks.studies.actorq_study --to-target --tasks cartpole-dqn --seeds 3 --out /tmp/aq \\
      --keep benchmarks/results/actorq-study-runs
  python -m benchmarks.studies.actorq_study --to-target --tasks cartpole-dqn --seeds 3 --out /tmp/aq-r0.125 \\
      --set learner.replay_ratio=0.125 --workers 2
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.actorq_study", description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the study's sweep directory (report/ inside)")
    p.add_argument("--quick", action="store_true", help=f"configs/sweeps/{SPECS['quick']}: 1 seed, small budgets")
    p.add_argument("--size", choices=["actorq", "actor-bound", "small"], default="actorq",
                   help="which configs: actorq (3x2048 policy), actor-bound (the same policy at a low replay "
                        "ratio), small (the tuned 256x256 configs)")
    p.add_argument("--spec", metavar="YML", help="another sweep spec file (entries named by task)")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "fp16", "int8-dynamic", "int8-full"],
                   help="fp32 first: the baseline (default: the spec's, fp32 int8-dynamic)")
    p.add_argument("--seeds", type=int, help="seeds per task x precision: 0..N-1 (default: the spec's, 3; --quick 1)")
    p.add_argument("--tasks", nargs="+", metavar="TASK", help=f"the spec's entries to run (default all: {', '.join(TASKS)})")
    p.add_argument("--to-target", action="store_true",
                   help="budget each run with its config's total_env_steps (runs stop when they reach the "
                        "target), instead of the spec's short budgets")
    p.add_argument("--keep", metavar="DIR", help="save each finished seed's runs as small report records (see records)")
    p.add_argument("--carbon-backend", choices=["process-time", "codecarbon", "auto"],
                   help="the runs' carbon.backend (default: the spec's, process-time)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    suite_runs.add_sweep_options(p)
    return p


def study_spec(args: argparse.Namespace):
    """The size's spec file narrowed to --tasks, with --precisions, --seeds, --to-target and --set applied."""
    from core.config import ConfigError, load_config
    from pipelines.sweeps.spec import read_spec
    if args.quick and args.size != "actorq":
        raise ConfigError(f"--quick is the actorq size's quick spec; valid for --size {args.size}: --seeds 1 "
                          f"--set total_env_steps=N")
    name = SPECS["quick" if args.quick else args.size]
    spec = read_spec(args.spec or os.path.join(REPO, "configs", "sweeps", name))
    entries = spec.entries()
    names = [e.label for e in entries]
    for task in args.tasks or []:
        if task not in names:
            raise ConfigError(f"task {task!r} is not in the --size {args.size} spec; valid: {', '.join(names)}")
    entries = [e for e in entries if not args.tasks or e.label in args.tasks]
    if args.precisions:
        if args.precisions[0] != "fp32":
            raise ConfigError("--precisions must start with fp32 (the baseline every ratio is taken against)")
        spec.grid["actors.precision"] = list(args.precisions)
    if args.seeds is not None:
        if args.seeds < 1:
            raise ConfigError(f"--seeds {args.seeds}: valid: 1 or more")
        spec.seeds = list(range(args.seeds))
        entries = [dataclasses.replace(e, seeds=None) for e in entries]
    if args.to_target:
        for i, e in enumerate(entries):
            config = os.path.join(REPO, e.config)
            if not load_config(config).eval.stop_at_target:
                raise ConfigError(f"{e.config} does not stop at its target (eval.stop_at_target: false); "
                                  f"--to-target needs runs that end when they reach it")
            entries[i] = dataclasses.replace(e, overrides=[o for o in e.overrides
                                                           if not o.startswith("total_env_steps=")])
    spec.configs = [dataclasses.replace(e, config=os.path.join(REPO, e.config)) for e in entries]
    spec.overrides += ([f"carbon.backend={args.carbon_backend}"] if args.carbon_backend else []) + list(args.extra)
    return spec


def study_label(task: str, size: str, budget: int, extra: List[str]) -> str:
    """Name of one study setting (task, size, budget, overrides): the kept records' folder."""
    label = slug("--".join(x for x in extra if not x.startswith("total_env_steps=")))
    return f"{task}-{size}-{budget}" + (f"--{label}" if label else "")


def complete_seeds(sweep, runs, precisions: List[str]) -> Dict[tuple, Dict[str, object]]:
    """``{(task, seed): {precision: run}}`` for every task and seed whose precisions all finished, in run order."""
    by_seed: Dict[tuple, Dict[str, object]] = {}
    for run in runs:
        by_seed.setdefault((run.label, run.seed), {})[run.setting.get("actors.precision", "fp32")] = run
    return {k: v for k, v in by_seed.items()
            if set(v) == set(precisions) and all(sweep.finished(r.name) for r in v.values())}


def _report(sweep, runs, args, spec) -> int:
    from core import report as report_lib
    from core.config import load_config
    commit, dirty = git_state()
    precisions = spec.grid.get("actors.precision", ["fp32"])
    study = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": machine_info(),
             "argv": sys.argv, "size": args.size, "quick": args.quick, "seeds": spec.seeds, "commit": commit,
             "dirty": dirty, "sweep": sweep.root, "runs": []}
    for run in runs:
        rec = suite_runs.run_record(sweep, run, commit, dirty)
        if rec is not None:
            study["runs"].append(dict(rec, task=run.label, precision=run.setting.get("actors.precision")))
    report_dirs = []
    for (task, seed), by_precision in complete_seeds(sweep, runs, precisions).items():
        for precision in precisions:
            run = by_precision[precision]
            report_dirs.append(sweep.run_dir(run.name))
            if args.keep:
                budget = int(load_config(run.config, list(run.overrides)).total_env_steps)
                label = study_label(task, args.size, budget, args.extra)
                dest = os.path.join(args.keep, label, f"{precision}-s{seed}")
                if not os.path.isdir(dest):
                    rec = suite_runs.run_record(sweep, run, commit, dirty)
                    report_lib.save_report_record(report_dirs[-1], dest, extra=dict(
                        rec, task=task, precision=precision, label=label))
    with open(os.path.join(sweep.root, "study.json"), "w") as f:
        json.dump(study, f, indent=2)
    if not report_dirs:
        print("error: no seed finished every precision; nothing to report (see study.json)", file=sys.stderr)
        return 1
    result = report_lib.write_report(report_lib.load_runs(report_dirs), os.path.join(sweep.root, "report"))
    print(result["table"])
    print(f"report: {os.path.join(sweep.root, 'report', 'report.md')}")
    return 0


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    spec = study_spec(args)
    resume = os.path.exists(os.path.join(args.out, "sweep.json"))
    sweep, runs, result = suite_runs.run_study(spec, args.out, args, resume=resume)
    code = suite_runs.print_outcome(sweep, runs, result)
    if code == suite_runs.STOPPED:
        return code
    return _report(sweep, runs, args, spec)


if __name__ == "__main__":
    sys.exit(main())
