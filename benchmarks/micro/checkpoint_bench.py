"""Checkpoint benchmark: how long save() blocks, and parallel vs single-thread writes.

A learner-like state of ``--mb`` MB of float32 (default 200) in ``--vars``
variables (default 20; weights ~ N(0, 0.05), which zstd barely compresses)
is saved ``--repeats`` times per configuration, side by side in one run:

* ``blocks``: wall time of the ``save()`` call (host copy + hand-off), for the
  first save (fresh host buffers, page faults) and the median of later saves
  (reused buffers: the steady state of a training loop);
* ``full``: from ``save()`` until ``wait()`` returns (the step is committed);
* ``blocks / full`` is the issue's goal (<= 5%);
* ``vs 1 thread``: full-write throughput relative to the same engine with
  ``max_workers=1``.

    python benchmarks/micro/checkpoint_bench.py [--mb 200] [--vars 20] [--repeats 5] [--dir /tmp/x]
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from core.checkpoint import Checkpointer  # noqa: E402


def make_state(total_mb: int, num_vars: int) -> dict:
    rng = np.random.default_rng(0)
    cols = 2500
    rows = max(1, int(total_mb * 1e6 / 4 / num_vars / cols))
    return {"params": {f"layer_{i:02d}": {"kernel": (rng.standard_normal((rows, cols))
                                                     * 0.05).astype(np.float32)}
                       for i in range(num_vars)},
            "counters": {"step": 0}}


def run(root: str, state: dict, engine: str, workers: int, repeats: int, donate: bool = False) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    blocks, fulls = [], []
    with Checkpointer(root, keep_last=1, max_workers=workers, engine=engine) as ckpt:
        for step in range(repeats):
            state["counters"]["step"] = step
            # donate: like learner.state(), a fresh host copy per save that nobody else holds
            fresh = {"params": {k: {"kernel": v["kernel"].copy()} for k, v in state["params"].items()},
                     "counters": dict(state["counters"])} if donate else state
            t0 = time.perf_counter()
            ckpt.save(step, fresh, donate=donate)
            t1 = time.perf_counter()
            ckpt.wait()
            t2 = time.perf_counter()
            blocks.append(t1 - t0)
            fulls.append(t2 - t0)
    shutil.rmtree(root, ignore_errors=True)
    steady = slice(1, None) if repeats > 1 else slice(None)
    return {"block_first": blocks[0], "block_steady": statistics.median(blocks[steady]),
            "full": statistics.median(fulls[steady])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--vars", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dir", default=None, help="scratch directory on the disk to measure")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    state = make_state(args.mb, args.vars)
    mb = sum(a["kernel"].nbytes for a in state["params"].values()) / 1e6
    scratch = tempfile.mkdtemp(dir=args.dir, prefix="ckpt_bench_")
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.platform()}  "
          f"{os.cpu_count()} CPUs  python {platform.python_version()}")
    print(f"# state: {mb:.0f} MB float32 in {args.vars} variables; {args.repeats} saves each; "
          f"scratch {scratch}")
    rows = []
    try:
        for engine in ("tensorstore", "zarr"):
            single = None
            for workers in (1, args.workers):
                r = run(os.path.join(scratch, "c"), state, engine, workers, args.repeats)
                single = single or r["full"]
                rows.append((engine, workers, r, single / r["full"]))
        r = run(os.path.join(scratch, "c"), state, "tensorstore", args.workers, args.repeats, donate=True)
        rows.append(("tensorstore, donate=True", args.workers, r, rows[1][2]["full"] / r["full"]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("| engine | workers | save() blocks, first (ms) | save() blocks, steady (ms) "
          "| full write (s) | MB/s | blocks/full (steady) | blocks/full (first) | vs 1 thread |")
    print("|---|---|---|---|---|---|---|---|---|")
    for engine, workers, r, speedup in rows:
        print(f"| {engine} | {workers} | {r['block_first'] * 1e3:.1f} | "
              f"{r['block_steady'] * 1e3:.1f} | {r['full']:.3f} | {mb / r['full']:.0f} | "
              f"{100 * r['block_steady'] / r['full']:.1f}% | {100 * r['block_first'] / r['full']:.1f}% | "
              f"{speedup:.2f}x |")


if __name__ == "__main__":
    main()
