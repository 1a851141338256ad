"""Env steps/s of a whole training run, Beam DirectRunner vs the local executor, paired and alternating.

Each pair runs ``python -m pipelines.train --executor E --no-progress --set total_env_steps=N`` once
with ``E = local`` and once with ``E = beam`` (the DirectRunner's default multi_processing mode), in a
new run directory each, and reads ``env_steps_per_s`` from the run's ``summary.json``. The order
alternates from pair to pair (local first, then beam first), so a load that drifts during the script
weighs on both; the load average is printed before every run. The figure is the Beam / local ratio per
pair and its median (issue 31's target: >= 0.60 on the default config), on two clocks:

* **whole run**: env steps over the child process's wall time, from its start to its exit, as this script
  measures it. Both executors pay everything on it: imports, the learner's build, the runner's start-up, the
  last evaluation. This is the figure a user waits for, and the one the target is read on.
* **loop**: the summary's ``env_steps_per_s`` (env steps over the training loop). The two executors draw the
  loop's start at different places: the local loop starts after the trainer built its learner (TensorFlow's
  import and the network: its "start-up" row), while a Beam round builds its learner inside the job, in the
  runner's worker, so Beam's loop holds that build and the runner's start-up. Printed beside the whole-run
  figure, not instead of it.

Usage::

    python -m benchmarks.micro.beam_throughput --pairs 3                       # default config, 16,384 steps
    python -m benchmarks.micro.beam_throughput --pairs 3 --steps 8192 --set actors.num_actors=2 \
        --out /tmp/beam-throughput.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Sequence

EXECUTORS = ("local", "beam")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def order(pair: int) -> Sequence[str]:
    """The executors of pair ``pair`` in the order they run: local first in even pairs, beam first in odd."""
    return EXECUTORS if pair % 2 == 0 else EXECUTORS[::-1]


def train_command(executor: str, steps: int, run_dir: str, overrides: Sequence[str] = (),
                  config: str = "") -> List[str]:
    sets = [a for kv in [f"total_env_steps={steps}", *overrides] for a in ("--set", kv)]
    return [sys.executable, "-m", "pipelines.train", *(["--config", config] if config else []),
            "--executor", executor, "--no-progress", "--run-dir", run_dir, *sets]


def run_train(executor: str, steps: int, run_dir: str, overrides: Sequence[str] = (),
              config: str = "") -> Dict[str, float]:
    """One run in a child process: ``{"whole": env steps / the process's wall s, "loop": the summary's
    env steps/s}``."""
    start = time.perf_counter()
    proc = subprocess.run(train_command(executor, steps, run_dir, overrides, config), cwd=REPO,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{executor} run failed (exit {proc.returncode}): {proc.stderr.strip()[-1000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    return {"whole": summary["env_steps"] / wall, "loop": float(summary["env_steps_per_s"])}


def measure(pairs: int, run: Callable[[str, str], Dict[str, float]], root: str,
            log: Callable[[str], None] = print) -> List[Dict[str, float]]:
    """``[{"local": whole-run steps/s, "beam": ..., "ratio": beam / local, "local_loop": loop steps/s,
    "beam_loop": ..., "ratio_loop": ..., "load_*": ...}]``, one per pair; ``run(executor, run_dir)`` trains
    once and returns ``{"whole": ..., "loop": ...}``."""
    out = []
    for p in range(pairs):
        row: Dict[str, float] = {}
        for executor in order(p):
            load = os.getloadavg()[0]
            speed = run(executor, os.path.join(root, f"p{p}-{executor}"))
            row[executor], row[f"{executor}_loop"], row[f"load_{executor}"] = speed["whole"], speed["loop"], load
            log(f"pair {p} {executor}: {speed['whole']:.1f} env steps/s whole run, {speed['loop']:.1f} in the "
                f"loop (load average before: {load:.2f})")
        row["ratio"], row["ratio_loop"] = row["beam"] / row["local"], row["beam_loop"] / row["local_loop"]
        out.append(row)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=16384, help="total_env_steps of every run")
    p.add_argument("--config", default="", help="YAML config (default: the trainer's default)")
    p.add_argument("--set", nargs="*", default=[], help="more config overrides, for both executors")
    p.add_argument("--out", help="write the pairs and the median ratio as JSON")
    args = p.parse_args(argv)
    if args.pairs < 1 or args.steps < 1:
        p.error("--pairs and --steps must be >= 1")
    root = tempfile.mkdtemp(prefix="beam-throughput-")
    try:
        rows = measure(args.pairs, lambda e, d: run_train(e, args.steps, d, args.set, args.config), root)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median = statistics.median(r["ratio"] for r in rows)
    median_loop = statistics.median(r["ratio_loop"] for r in rows)
    print("env steps/s   | whole run (process start to exit) | training loop (summary.json)")
    print("pair          | local     beam      beam/local      | local     beam      beam/local")
    for i, r in enumerate(rows):
        print(f"{i:>4}          | {r['local']:>8.1f}  {r['beam']:>8.1f}  {r['ratio']:>10.2f}      | "
              f"{r['local_loop']:>8.1f}  {r['beam_loop']:>8.1f}  {r['ratio_loop']:>10.2f}")
    print(f"median beam/local: whole run {median:.2f}, loop {median_loop:.2f} ({args.pairs} pairs, "
          f"{args.steps} env steps per run)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python -m benchmarks.micro.beam_throughput " + " ".join(argv or sys.argv[1:]),
                       "pairs": rows, "median_ratio": median, "median_ratio_loop": median_loop}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
