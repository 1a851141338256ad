"""Sweep speed-up: N short default runs one at a time against ``python -m pipelines.sweep`` with 1, 2, 4 workers.

All in one invocation, side by side, so every number shares the machine's state. Each run is the default
config with a short budget (``--steps`` env steps, no early stop), ``--executor local``, the sweep's per-run
thread settings (:data:`pipelines.sweeps.spec.THREAD_OVERRIDES`: one TensorFlow intra-op and inter-op thread,
one shard-encoding thread, one checkpoint-writer thread) and the sweep's run environment
(:func:`pipelines.sweeps.launch.run_env`: single-threaded BLAS/OpenMP), in both cases:

* **one at a time**: ``python -m pipelines.train --config configs/default.yaml --seed S --set ...
  --run-dir ... --executor local --no-progress`` for seeds ``0..N-1``, each after the last ended;
* **sweep, W workers**: ``python -m pipelines.sweep --configs configs/default.yaml --seeds 0-(N-1)
  --set ... --executor dask --workers W`` (an embedded Dask LocalCluster; ``--executor local`` with
  ``--local``), the same runs.

It prints the CPU model, the cores and the 1-minute load (sampled every 2 s during each case), then per case
the wall seconds, the speed-up over one at a time (``t_serial / t_case``), the mean run's wall and the CPU
seconds per run (user + system of every process the case started: the runs and, for a sweep, the sweep
process with its Dask cluster). For one worker it gives the sweep's overhead per run, in wall seconds
``(t_sweep_1 - t_serial) / N`` as a share of the mean run's wall alone, and in CPU seconds, paired round by
round. Last, the cap the cores put on the speed-up: a run alone uses ``c / w`` cores (CPU seconds over wall),
so on K idle cores W workers are at most ``min(W, K * w / c)`` times faster. On a loaded machine ``w`` grows
with the wait for a core (and the cap with it) while ``c`` barely moves: then the CPU seconds are the figure
to compare.

Example::

    python benchmarks/micro/sweep_speedup.py                       # 8 runs, workers 1 2 4, Dask
    python benchmarks/micro/sweep_speedup.py --runs 4 --workers 1 2 --local --steps 2048
    python benchmarks/micro/sweep_speedup.py --runs 4 --workers 1 --repeats 2   # ABBA on a loaded machine
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
from pipelines.sweeps.launch import run_env  # noqa: E402 - after the path
from pipelines.sweeps.spec import THREAD_OVERRIDES  # noqa: E402

#: the environment of a sweep's run (single-threaded BLAS/OpenMP) for the runs one at a time too: the cases
#: differ only in who starts the run (without it, 2 BLAS threads per run on a loaded machine made the
#: runs alone slower than the sweep's: 28-32 s against 18 s, 2026-12-05)
ENV = run_env()


def settings(steps: int) -> List[str]:
    """The budget of every run (the sweep puts :data:`THREAD_OVERRIDES` before it; the runs alone get both)."""
    return [f"total_env_steps={steps}", "eval.stop_at_target=false", f"eval.every_env_steps={steps}",
            "eval.episodes=5", "eval.confirm_episodes=0"]


def children_cpu_s() -> float:
    """User + system seconds of every waited-for child process of this one (and theirs)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds, in a thread, while a case runs."""

    def __init__(self, every_s: float = 2.0):
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def close(self) -> List[float]:
        self._stop.set()
        self._thread.join()
        return self.samples


def serial(n: int, steps: int, root: str) -> Dict[str, float]:
    """Seconds for ``n`` runs one after another, and the runs' own wall times."""
    sets = [a for s in (*THREAD_OVERRIDES, *settings(steps)) for a in ("--set", s)]
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


def machine() -> str:
    """``CPU model, K cores`` as lscpu and os.cpu_count() give them."""
    model = platform.processor() or "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in out.splitlines() if l.startswith("Model name")), model)
    except (OSError, subprocess.CalledProcessError):
        pass
    return f"{model}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=8, help="runs per case (seeds 0..N-1; default 8)")
    p.add_argument("--steps", type=int, default=4096, help="env steps per run (default 4096)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4], help="sweep worker counts (default 1 2 4)")
    p.add_argument("--local", action="store_true", help="sweeps with --executor local instead of dask")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every case, the order reversed every other round (ABBA), medians reported")
    args = p.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.repeats < 1 or min(args.workers) < 1:
        raise SystemExit("error: --runs, --steps, --repeats and --workers must be 1 or more")
    executor = "local" if args.local else "dask"
    cases = [0, *args.workers]                   # 0: one at a time
    walls: Dict[int, List[float]] = {c: [] for c in cases}
    runs: Dict[int, List[float]] = {c: [] for c in cases}
    cpus: Dict[int, List[float]] = {c: [] for c in cases}
    loads: Dict[int, List[float]] = {c: [] for c in cases}
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {machine()}; 1/5/15-min load at start "
          + "/".join(f"{x:.1f}" for x in os.getloadavg()), flush=True)
    with tempfile.TemporaryDirectory(prefix="sweep-speedup-") as tmp:
        for rep in range(args.repeats):
            for c in (cases if rep % 2 == 0 else cases[::-1]):
                root = os.path.join(tmp, f"r{rep}-{c}")
                sampler, cpu0 = LoadSampler(), children_cpu_s()
                r = serial(args.runs, args.steps, root) if c == 0 else sweep(args.runs, args.steps, c, root, executor)
                cpu, load = children_cpu_s() - cpu0, sampler.close()
                walls[c].append(r["wall_s"])
                runs[c].append(r["mean_run_s"])
                cpus[c].append(cpu / args.runs)
                loads[c] += load
                print(f"round {rep}: {'one at a time' if c == 0 else f'sweep, {c} worker(s)'}: "
                      f"{r['wall_s']:.1f} s ({r['mean_run_s']:.1f} s per run, {cpu / args.runs:.2f} CPU s per run, "
                      f"load {min(load):.1f}-{max(load):.1f})", flush=True)
    report(args, executor, cases, walls, runs, cpus, loads)
    return 0


def report(args, executor: str, cases: List[int], walls, runs, cpus, loads) -> None:
    med = {c: float(np.median(walls[c])) for c in cases}
    print(f"\n| case ({args.runs} runs of {args.steps:,} env steps, median of {args.repeats}) | wall s | "
          "speed-up vs one at a time | mean run s | CPU s per run | 1-min load |")
    print("|---|---|---|---|---|---|")
    for c in cases:
        label = "one at a time" if c == 0 else f"sweep, {executor}, {c} worker(s)"
        print(f"| {label} | {med[c]:.1f} | {med[0] / med[c]:.2f}x | {float(np.median(runs[c])):.1f} | "
              f"{float(np.median(cpus[c])):.2f} | {min(loads[c]):.1f}-{max(loads[c]):.1f} |")
    if 1 in walls:
        per_run = [(s1 - s0) / args.runs for s0, s1 in zip(walls[0], walls[1])]     # paired, round by round
        share = [100 * d / m for d, m in zip(per_run, runs[0])]
        cpu_d = [c1 - c0 for c0, c1 in zip(cpus[0], cpus[1])]
        cpu_share = [100 * d / c0 for d, c0 in zip(cpu_d, cpus[0])]
        print("\nsweep overhead per run (1 worker vs one at a time, per round): wall "
              + ", ".join(f"{d:+.2f} s ({x:+.1f}%)" for d, x in zip(per_run, share))
              + f"; median {float(np.median(per_run)):+.2f} s ({float(np.median(share)):+.1f}% of a run); CPU "
              + ", ".join(f"{d:+.2f} s ({x:+.1f}%)" for d, x in zip(cpu_d, cpu_share))
              + f"; median {float(np.median(cpu_d)):+.2f} s ({float(np.median(cpu_share)):+.1f}%)")
    w, c = float(np.median(runs[0])), float(np.median(cpus[0]))
    k = os.cpu_count() or 1
    print(f"\na run alone: {c:.2f} CPU s in {w:.2f} s wall = {c / w:.2f} cores; the cap the {k} cores put on "
          f"W workers, min(W, {k} x wall / CPU): "
          + ", ".join(f"{x}: {min(x, k * w / c):.2f}x" for x in cases[1:])
          + " (on a loaded machine the wall includes waits for a core, so this cap is too high)")


if __name__ == "__main__":
    sys.exit(main())
