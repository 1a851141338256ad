"""The ActorQ study on this machine: fp32 vs int8 actors, time to target, energy, carbon.

Tasks: CartPole-v1 DQN, Pendulum-v1 D4PG, dm_control cartpole-balance D4PG.
Precisions: fp32 and int8 (``int8-dynamic``: int8 weights and GEMM kernels,
patched into a prebuilt flatbuffer per version). Every run is a fresh
``python -m pipelines.train`` process (time to target counts from process
start; carbon.json covers the process and its Dask workers). Runs are
interleaved (task, seed, then fp32/int8 back to back) so that slow drifts in
machine load hit both precisions alike. The report (``pipelines.report``)
goes to ``OUT/report``; ``OUT/study.json`` records the commands, the date,
the machine and its load.

Sizes:

* ``--size actorq`` (default): ``configs/actorq/`` (3x2048 policy MLP, the
  ActorQ paper's actor), with env-step budgets that fit the time box;
* ``--size actor-bound``: ``configs/actorq/*-actor-bound.yaml`` (the same
  policy, low samples-per-insert, small learner batch, more envs per actor);
* ``--size small``: the tuned configs (256x256) that reach the targets fast.

``--precisions fp32 int8-dynamic int8-full`` adds full-integer actors.

Energy uses the ``process-time`` backend by default (CPU seconds of this
run's processes x 4 W/thread + RAM): on a shared machine codecarbon's
machine mode would also charge other users' load. ``--carbon-backend
codecarbon`` switches.

Usage::

    python -m benchmarks.studies.actorq_study --quick --out /tmp/actorq-quick     # 1 seed, small budgets, ~10 min
    python -m benchmarks.studies.actorq_study --out /tmp/actorq                    # 3 seeds, ~1 hour on 2 cores
    python -m benchmarks.studies.actorq_study --size small --seeds 3 --out /tmp/aq-small
    # the target-reaching study, kept per seed so it can grow over several sessions:
    python -m benchmarks.studies.actorq_study --to-target --out /tmp/aq --keep benchmarks/results/actorq-study-runs
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:   # run as a script or imported by tests: this checkout's core/benchmarks
    sys.path.insert(0, REPO)

from benchmarks.common import git_state, machine_info, slug  # noqa: E402

#: task -> {size: (config, env-step budget full, env-step budget quick)}
TASKS: Dict[str, Dict[str, tuple]] = {
    "cartpole-dqn": {"actorq": ("configs/actorq/cartpole-dqn.yaml", 8_000, 2_000),
                     "actor-bound": ("configs/actorq/cartpole-dqn-actor-bound.yaml", 100_000, 30_000),
                     "small": ("configs/default.yaml", 60_000, 30_000)},
    "pendulum-d4pg": {"actorq": ("configs/actorq/pendulum-d4pg.yaml", 4_000, 2_000),
                      "small": ("configs/pendulum-d4pg.yaml", 12_000, 8_000)},
    "dmc-cartpole-balance-d4pg": {"actorq": ("configs/actorq/dmc-cartpole-balance-d4pg.yaml", 4_000, 2_000),
                                  "small": ("configs/dmc-cartpole-balance-d4pg.yaml", 12_000, 8_000)},
}
PRECISIONS = ("fp32", "int8-dynamic")


EPILOG = """
records:
  With --keep DIR every seed whose precisions all finished is kept as small report records (config,
  summary, carbon, evaluations, the last workers record, and record.json: command, seconds, load,
  commit, date) in DIR/<task>-<size>-<budget>[--<overrides>]/<precision>-s<seed>/, a few kB each.
  A later study with the same --keep skips the seeds kept there and reports them with the new ones, so
  the 3-seed, target-reaching study can be made over several sessions and committed as it grows. The
  precisions of one seed always run back to back in one session; the report refuses kept runs whose
  configs differ (a config edited between sessions) by naming the keys. The committed records are packed:
  tar xzf benchmarks/results/actorq-study-runs.tar.gz -C benchmarks/results (and repack after adding seeds).

examples:
  python -m benchmarks.studies.actorq_study --quick --out /tmp/actorq-quick
  python -m benchmarks.studies.actorq_study --to-target --tasks cartpole-dqn --seeds 3 --out /tmp/aq \\
      --keep benchmarks/results/actorq-study-runs
  python -m benchmarks.studies.actorq_study --to-target --tasks cartpole-dqn --seeds 3 --out /tmp/aq-r0.125 \\
      --keep benchmarks/results/actorq-study-runs --set learner.replay_ratio=0.125
"""


def run_one(config: str, precision: str, seed: int, budget: int, run_dir: str, backend: str,
            extra: List[str]) -> Dict[str, object]:
    cmd = [sys.executable, "-m", "pipelines.train", "--config", config, "--seed", str(seed),
           "--run-dir", run_dir, "--no-progress", "--set", f"actors.precision={precision}",
           "--set", f"total_env_steps={budget}", "--set", f"carbon.backend={backend}"]
    for item in extra:
        cmd += ["--set", item]
    load_before = os.getloadavg()[0]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    out = {"cmd": " ".join(cmd[1:]), "rc": proc.returncode, "seconds": time.time() - t0,
           "loadavg_before": load_before, "loadavg_after": os.getloadavg()[0]}
    if proc.returncode != 0:
        out["stderr_tail"] = proc.stderr[-2000:]
    return out


def budget_for(task: str, size: str, quick: bool, to_target: bool, extra: List[str]) -> int:
    """The env-step budget of a task's runs: an explicit ``total_env_steps=N`` override wins."""
    config, full, short = TASKS[task][size]
    budget = short if quick else full
    if to_target:
        from core import config as config_lib
        cfg = config_lib.load_config(os.path.join(REPO, config))
        if not cfg.eval.stop_at_target:
            raise SystemExit(f"error: {config} does not stop at its target (eval.stop_at_target: false); "
                             f"--to-target needs runs that end when they reach it")
        budget = cfg.total_env_steps
    for item in extra:   # applied last by pipelines.train, so it is the budget the run gets
        if item.startswith("total_env_steps="):
            budget = int(float(item.split("=", 1)[1].replace("_", "")))
    return budget


def study_label(task: str, size: str, budget: int, extra: List[str]) -> str:
    """Name of one study setting (task, size, budget, overrides): the kept records' folder."""
    # the learning suite's run-directory names, the same way
    label = slug("--".join(x for x in extra if not x.startswith("total_env_steps=")))
    return f"{task}-{size}-{budget}" + (f"--{label}" if label else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.actorq_study", description=__doc__.split("\n\n")[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (runs/ and report/ inside)")
    p.add_argument("--quick", action="store_true", help="1 seed and small budgets (~10 min)")
    p.add_argument("--size", choices=["actorq", "actor-bound", "small"], default="actorq",
                   help="which configs: actorq (3x2048 policy), actor-bound (the same policy at a low replay "
                        "ratio), small (the tuned 256x256 configs)")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS),
                   choices=["fp32", "fp16", "int8-dynamic", "int8-full"], help="fp32 first: the baseline")
    p.add_argument("--seeds", type=int, help="seeds per task x precision (default 3, --quick 1)")
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    p.add_argument("--to-target", action="store_true",
                   help="budget each run with its config's total_env_steps (runs stop when they reach the "
                        "target), instead of the short budgets that fit a time box")
    p.add_argument("--keep", metavar="DIR",
                   help="keep each finished seed's runs as small report records in DIR/<setting>/ (commit them) "
                        "and skip seeds already kept there: a study can span sessions (see records)")
    p.add_argument("--carbon-backend", default="process-time", choices=["process-time", "codecarbon", "auto"])
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    seeds = args.seeds or (1 if args.quick else 3)
    if args.quick:  # learning starts sooner, so a short budget is not all replay warm-up
        args.extra = ["replay.min_size=500"] + args.extra
    if args.precisions[0] != "fp32":
        print("error: --precisions must start with fp32 (the baseline every ratio is taken against)",
              file=sys.stderr)
        return 2
    for task in args.tasks:
        if args.size not in TASKS[task]:
            print(f"error: task {task!r} has no --size {args.size} config; valid sizes: "
                  f"{', '.join(sorted(TASKS[task]))}", file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    from core import report as report_lib
    commit, dirty = git_state()
    study = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": machine_info(),
             "argv": sys.argv, "size": args.size, "quick": args.quick, "seeds": seeds, "commit": commit,
             "dirty": dirty, "runs": []}
    try:   # an earlier invocation into the same --out: its runs' commands stay on record
        with open(os.path.join(args.out, "study.json")) as f:
            earlier = {r["run_dir"]: r for r in json.load(f).get("runs", []) if "run_dir" in r}
    except (OSError, ValueError):
        earlier = {}
    report_dirs = []
    for task in args.tasks:
        config = TASKS[task][args.size][0]
        budget = budget_for(task, args.size, args.quick, args.to_target, args.extra)
        label = study_label(task, args.size, budget, args.extra)
        for seed in range(seeds):
            kept = {pr: os.path.join(args.keep, label, f"{pr}-s{seed}") for pr in args.precisions} if args.keep else {}
            if kept and all(os.path.isfile(os.path.join(d, "summary.json")) for d in kept.values()):
                print(f"[kept] {label} seed {seed}: {', '.join(args.precisions)} (skipped)", flush=True)
                report_dirs += kept.values()
                continue
            # every precision of a seed runs in this session, back to back, so each ratio compares
            # runs made minutes apart on the same machine (never a kept fp32 with a fresh int8)
            finished = {}
            for precision in args.precisions:
                run_dir = os.path.join(os.path.abspath(args.out), "runs", f"{task}-{precision}-s{seed}")
                if os.path.exists(os.path.join(run_dir, "summary.json")):
                    print(f"[skip] {run_dir} (done)", flush=True)
                    finished[precision] = dict(earlier.get(run_dir, {}), run_dir=run_dir, reused=True)
                    study["runs"].append(finished[precision])
                    continue
                print(f"[run] {task} {precision} seed {seed} ({budget:,} env steps) ...", flush=True)
                r = run_one(config, precision, seed, budget, run_dir, args.carbon_backend, args.extra)
                r.update(task=task, precision=precision, seed=seed, run_dir=run_dir, label=label,
                         commit=commit, dirty=dirty,
                         date=datetime.datetime.now(datetime.timezone.utc).isoformat())
                study["runs"].append(r)
                print(f"      rc={r['rc']} {r['seconds']:.0f} s, load {r['loadavg_before']:.1f}"
                      f"->{r['loadavg_after']:.1f}", flush=True)
                if r["rc"] == 0:
                    finished[precision] = r
                else:
                    print(r.get("stderr_tail", ""), file=sys.stderr)
                with open(os.path.join(args.out, "study.json"), "w") as f:
                    json.dump(study, f, indent=2)
            if len(finished) < len(args.precisions):
                continue   # a seed with a failed precision has no ratio: nothing of it is kept or reported
            for precision, r in finished.items():
                if kept:
                    report_lib.save_report_record(r["run_dir"], kept[precision], extra=r)
                    report_dirs.append(kept[precision])
                else:
                    report_dirs.append(r["run_dir"])
    if not report_dirs:
        print("error: no seed finished every precision; nothing to report (see study.json)", file=sys.stderr)
        return 1
    result = report_lib.write_report(report_lib.load_runs(report_dirs), os.path.join(args.out, "report"))
    study["machine"]["loadavg_end"] = os.getloadavg()
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump(study, f, indent=2)
    print(result["table"])
    print(f"report: {os.path.join(args.out, 'report', 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
