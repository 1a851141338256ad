"""Sweep speed-up: N short default runs one at a time against ``python -m pipelines.sweep`` with 1, 2, 4 workers.

All in one invocation, side by side, so every number shares the machine's state. Each run is the default
config with a short budget (``--steps`` env steps, no early stop), ``--executor local``, one TensorFlow
thread and the sweep's run environment (:func:`pipelines.sweeps.launch.run_env`), in both cases:

* **one at a time**: ``python -m pipelines.train --config configs/default.yaml --seed S --set ...
  --run-dir ... --executor local --no-progress`` for seeds ``0..N-1``, each after the last ended;
* **sweep, W workers**: ``python -m pipelines.sweep --configs configs/default.yaml --seeds 0-(N-1)
  --set ... --executor dask --workers W`` (an embedded Dask LocalCluster; ``--executor local`` with
  ``--local``), the same runs.

It prints, per case, the wall seconds, the speed-up over one at a time (``t_serial / t_case``) and, for
one worker, the sweep's overhead per run, ``(t_sweep_1 - t_serial) / N``, as a share of the mean run's
wall time. With more workers than cores the runs share cores, so the speed-up stops at about the
number of cores (2 on the development machine).

Example::

    python benchmarks/micro/sweep_speedup.py                       # 8 runs, workers 1 2 4, Dask
    python benchmarks/micro/sweep_speedup.py --runs 4 --workers 1 2 --local --steps 2048
    python benchmarks/micro/sweep_speedup.py --runs 4 --workers 1 --repeats 2   # ABBA on a loaded machine
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
from pipelines.sweeps.launch import run_env  # noqa: E402 - after the path

#: the environment of a sweep's run (single-threaded BLAS/OpenMP) for the runs one at a time too: the cases
#: differ only in who starts the run (without it, 2 BLAS threads per run on a loaded machine made the
#: runs alone slower than the sweep's: 28-32 s against 18 s, 2026-12-05)
ENV = run_env()


def settings(steps: int) -> List[str]:
    return [f"total_env_steps={steps}", "eval.stop_at_target=false", f"eval.every_env_steps={steps}",
            "eval.episodes=5", "eval.confirm_episodes=0", "threads.tf_intra_op=1", "threads.tf_inter_op=1"]


def serial(n: int, steps: int, root: str) -> Dict[str, float]:
    """Seconds for ``n`` runs one after another, and the runs' own wall times."""
    sets = [a for s in settings(steps) for a in ("--set", s)]
    walls, start = [], time.perf_counter()
    for seed in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pipelines.train", "--config", "configs/default.yaml",
                               "--seed", str(seed), *sets, "--run-dir", os.path.join(root, f"s{seed}"),
                               "--executor", "local", "--no-progress"], cwd=REPO, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: run {seed} failed: {proc.stderr.strip().splitlines()[-1:]}")
        walls.append(time.perf_counter() - t0)
    return {"wall_s": time.perf_counter() - start, "mean_run_s": sum(walls) / len(walls)}


def sweep(n: int, steps: int, workers: int, root: str, executor: str) -> Dict[str, float]:
    sets = [a for s in settings(steps) for a in ("--set", s)]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipelines.sweep", "--configs", "configs/default.yaml",
                           "--seeds", f"0-{n - 1}", *sets, "--executor", executor, "--workers", str(workers),
                           "--out", root, "--no-progress"], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"error: the {workers}-worker sweep failed: {proc.stderr.strip().splitlines()[-1:]}")
    runs = []
    for name in sorted(os.listdir(os.path.join(root, "status"))):
        with open(os.path.join(root, "status", name)) as f:
            runs.append(json.load(f)["wall_s"])
    return {"wall_s": wall, "mean_run_s": sum(runs) / len(runs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8, help="runs per case (seeds 0..N-1; default 8)")
    p.add_argument("--steps", type=int, default=4096, help="env steps per run (default 4096)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="sweep worker counts (default 1 2 4)")
    p.add_argument("--local", action="store_true", help="sweeps with --executor local instead of dask")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every case, the order reversed every other round (ABBA), medians reported")
    args = p.parse_args(argv)
    executor = "local" if args.local else "dask"
    cases = [0, *args.workers]                   # 0: one at a time
    walls: Dict[int, List[float]] = {c: [] for c in cases}
    runs: Dict[int, List[float]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory(prefix="sweep-speedup-") as tmp:
        for rep in range(args.repeats):
            for c in (cases if rep % 2 == 0 else cases[::-1]):
                root = os.path.join(tmp, f"r{rep}-{c}")
                r = serial(args.runs, args.steps, root) if c == 0 else sweep(args.runs, args.steps, c, root, executor)
                walls[c].append(r["wall_s"])
                runs[c].append(r["mean_run_s"])
                print(f"round {rep}: {'one at a time' if c == 0 else f'sweep, {c} worker(s)'}: "
                      f"{r['wall_s']:.1f} s ({r['mean_run_s']:.1f} s per run)", flush=True)
    med = {c: float(np.median(walls[c])) for c in cases}
    run_med = {c: float(np.median(runs[c])) for c in cases}
    print(f"\n| case ({args.runs} runs of {args.steps:,} env steps, median of {args.repeats}) | wall s | "
          "speed-up vs one at a time | mean run s |")
    print("|---|---|---|---|")
    for c in cases:
        label = "one at a time" if c == 0 else f"sweep, {executor}, {c} worker(s)"
        print(f"| {label} | {med[c]:.1f} | {med[0] / med[c]:.2f}x | {run_med[c]:.1f} |")
    if 1 in walls:
        per_run = [(s1 - s0) / args.runs for s0, s1 in zip(walls[0], walls[1])]     # paired, round by round
        share = [100 * d / m for d, m in zip(per_run, runs[0])]
        print(f"\nsweep overhead per run (1 worker vs one at a time, per round): "
              + ", ".join(f"{d:+.2f} s ({x:+.1f}%)" for d, x in zip(per_run, share))
              + f"; median {float(np.median(per_run)):+.2f} s ({float(np.median(share)):+.1f}% of a run)")
    return 0

if __name__ == "__main__":
    sys.exit(main())
