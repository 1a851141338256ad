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

    python -m benchmarks.actorq_study --quick --out /tmp/actorq-quick     # 1 seed, small budgets, ~10 min
    python -m benchmarks.actorq_study --out /tmp/actorq                    # 3 seeds, ~1 hour on 2 cores
    python -m benchmarks.actorq_study --size small --seeds 3 --out /tmp/aq-small
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def machine_info() -> Dict[str, object]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg": os.getloadavg()}


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.actorq_study", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory (runs/ and report/ inside)")
    p.add_argument("--quick", action="store_true", help="1 seed and small budgets (~10 min)")
    p.add_argument("--size", choices=["actorq", "actor-bound", "small"], default="actorq")
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS),
                   choices=["fp32", "fp16", "int8-dynamic", "int8-full"], help="fp32 first: the baseline")
    p.add_argument("--seeds", type=int, help="seeds per task x precision (default 3, --quick 1)")
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=list(TASKS))
    p.add_argument("--carbon-backend", default="process-time", choices=["process-time", "codecarbon", "auto"])
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="extra config override for every run")
    args = p.parse_args(argv)
    seeds = args.seeds or (1 if args.quick else 3)
    if args.quick:  # learning starts sooner, so a short budget is not all replay warm-up
        args.extra = ["replay.min_size=500"] + args.extra
    os.makedirs(args.out, exist_ok=True)
    study = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": machine_info(),
             "argv": sys.argv, "size": args.size, "quick": args.quick, "seeds": seeds, "runs": []}
    run_dirs = []
    for task in args.tasks:
        if args.size not in TASKS[task]:
            print(f"error: task {task!r} has no --size {args.size} config; valid sizes: "
                  f"{', '.join(sorted(TASKS[task]))}", file=sys.stderr)
            return 2
        config, full, quick = TASKS[task][args.size]
        budget = quick if args.quick else full
        for item in args.extra:   # an explicit --set total_env_steps=N wins (it is applied last)
            if item.startswith("total_env_steps="):
                budget = int(float(item.split("=", 1)[1].replace("_", "")))
        for seed in range(seeds):
            for precision in args.precisions:
                run_dir = os.path.join(os.path.abspath(args.out), "runs", f"{task}-{precision}-s{seed}")
                if os.path.exists(os.path.join(run_dir, "summary.json")):
                    print(f"[skip] {run_dir} (done)", flush=True)
                    run_dirs.append(run_dir)
                    continue
                print(f"[run] {task} {precision} seed {seed} ({budget:,} env steps) ...", flush=True)
                r = run_one(config, precision, seed, budget, run_dir, args.carbon_backend, args.extra)
                r.update(task=task, precision=precision, seed=seed, run_dir=run_dir)
                study["runs"].append(r)
                print(f"      rc={r['rc']} {r['seconds']:.0f} s, load {r['loadavg_before']:.1f}"
                      f"->{r['loadavg_after']:.1f}", flush=True)
                if r["rc"] == 0:
                    run_dirs.append(run_dir)
                else:
                    print(r.get("stderr_tail", ""), file=sys.stderr)
                with open(os.path.join(args.out, "study.json"), "w") as f:
                    json.dump(study, f, indent=2)
    from core import report as report_lib
    result = report_lib.write_report(report_lib.load_runs(run_dirs), os.path.join(args.out, "report"))
    study["machine"]["loadavg_end"] = os.getloadavg()
    with open(os.path.join(args.out, "study.json"), "w") as f:
        json.dump(study, f, indent=2)
    print(result["table"])
    print(f"report: {os.path.join(args.out, 'report', 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
