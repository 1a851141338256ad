"""Start-up of a training run: seconds from process start to its ``config`` record and to its first commit.

With ``--whole-run`` every run is the default run to its end (its own
budget and evaluations, as a user runs it), and the table adds its env
steps/s (``summary.json``: env steps / training wall) and the ratio of each
checkout's median to the first checkout's.

Runs ``python -m pipelines.train`` (the default config, a short budget, no
evaluation) from each given checkout in turn, alternating, ``--pairs`` times,
and prints per run the seconds from the process's start (``psutil``
create time) to the first ``config`` record (imports, the embedded Dask
cluster, the learner's set-up) and to the first ``commit`` record (the first
shard of env steps in the replay). Compare two commits side by side::

    git worktree add /tmp/base <commit>
    python benchmarks/micro/startup.py /tmp/base .          # base vs this checkout, 3 alternating pairs
    python benchmarks/micro/startup.py . --pairs 5 --set executor=local
    python benchmarks/micro/startup.py /tmp/base . --pairs 5 --whole-run     # env steps/s, side by side
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence


def one_run(checkout: str, overrides: Sequence[str], whole: bool = False) -> Dict[str, float]:
    """One default run from ``checkout`` (short unless ``whole``); seconds to its first config/commit record."""
    import psutil
    with tempfile.TemporaryDirectory(prefix="startup-") as d:
        cmd = [sys.executable, "-m", "pipelines.train", "--no-progress", "--run-dir", f"{d}/run"]
        if not whole:
            cmd += ["--set", "total_env_steps=4096", "--set", "eval.every_env_steps=100000"]
        for o in overrides:
            cmd += ["--set", o]
        proc = subprocess.Popen(cmd, cwd=checkout, env={**os.environ, "PYTHONPATH": os.path.abspath(checkout)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        start = psutil.Process(proc.pid).create_time()
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"error: the run from {checkout} failed (exit {proc.returncode}): "
                             f"{err.strip().splitlines()[-1] if err.strip() else ''}")
        with open(f"{d}/run/metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
        with open(f"{d}/run/summary.json") as f:
            summary = json.load(f)
    first = {kind: next(r["time"] for r in records if r["kind"] == kind) - start for kind in ("config", "commit")}
    return {"config_s": first["config"], "first_commit_s": first["commit"], "load": os.getloadavg()[0],
            "env_steps": summary["env_steps"], "env_steps_per_s": summary["env_steps_per_s"]}


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/micro/startup.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("checkouts", nargs="+", help="repository checkouts to run from, alternating")
    p.add_argument("--pairs", type=int, default=3, help="runs per checkout (default 3)")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="extra config override for every run (repeatable)")
    p.add_argument("--whole-run", action="store_true",
                   help="run the default config to its end and compare env steps/s (default: a 4,096-step start)")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs} invalid; valid: >= 1")
    for c in args.checkouts:
        if not os.path.isfile(os.path.join(c, "pipelines", "train.py")):
            p.error(f"{c!r} is not a DataBloom checkout (no pipelines/train.py)")
    runs: Dict[str, List[Dict[str, float]]] = {c: [] for c in args.checkouts}
    for _ in range(args.pairs):
        for c in args.checkouts:
            r = one_run(c, args.overrides, args.whole_run)
            runs[c].append(r)
            print(f"{c}: config record at {r['config_s']:.2f} s, first commit at {r['first_commit_s']:.2f} s, "
                  f"{r['env_steps']:,} env steps at {r['env_steps_per_s']:,.0f}/s (load {r['load']:.1f})", flush=True)
    base = statistics.median(r["env_steps_per_s"] for r in runs[args.checkouts[0]])
    print("\n| checkout | median s to config record | median s to first commit | median env steps/s | vs first |"
          "\n|---|---|---|---|---|")
    for c, rs in runs.items():
        speed = statistics.median(r["env_steps_per_s"] for r in rs)
        print(f"| {c} | {statistics.median(r['config_s'] for r in rs):.2f} | "
              f"{statistics.median(r['first_commit_s'] for r in rs):.2f} | {speed:,.0f} | {speed / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
