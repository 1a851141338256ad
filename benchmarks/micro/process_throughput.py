"""Throughput of ``process stats`` and ``process compact`` (steps/s) on Dask and on Beam.

Builds a synthetic CartPole store (default 5 million steps, in shards of
``--shard-rows`` rows written through the replay store API, so the layout is
what training writes), then times, per engine:

* ``stats``: the whole statistics computation (per-shard episode index and
  policy-version reads, reduce) over every row;
* ``compact``: merging all shards into ``--target-mib`` shards and the atomic
  swap, on a fresh copy of the store.

Engine start-up (Dask LocalCluster) is excluded; Beam builds one pipeline
per pass, which is included (it is what a user waits for).

    python benchmarks/micro/process_throughput.py                     # 5M steps
    python benchmarks/micro/process_throughput.py --steps 500000 --engines dask
    python benchmarks/micro/process_throughput.py \
        --beam-args="--direct_running_mode=multi_processing --direct_num_workers=2"
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def synthetic_batch(seed: int, T: int, E: int, actor: int):
    """A CartPole-like rollout [T, E]: reward 1, episodes end w.p. 1/25 (terminated) per step."""
    from core.trajectory import TrajectoryBatch, make_episode_id
    rng = np.random.default_rng(seed)
    term = rng.random((T, E)) < 0.04
    step = np.zeros((T, E), np.int32)
    counter = np.zeros((T, E), np.int64)
    for t in range(1, T):
        step[t] = np.where(term[t - 1], 0, step[t - 1] + 1)
        counter[t] = counter[t - 1] + term[t - 1]
    stream = actor * E + np.arange(E)[None, :]
    return TrajectoryBatch(
        observation=rng.standard_normal((T, E, 4)).astype(np.float32),
        action=rng.integers(0, 2, (T, E)).astype(np.int64), reward=np.where(term, 0.0, 1.0).astype(np.float32),
        discount=(~term).astype(np.float32), terminated=term, truncated=np.zeros((T, E), bool),
        episode_id=make_episode_id(stream, counter + (seed << 20)), step=step,
        policy_version=np.full((T, E), seed % 7, np.int64), env_id="CartPole-v1", actor_id=actor,
        task_id=f"a{actor:04d}-t{seed:07d}", seed=seed)


def build_store(url: str, steps: int, shard_rows: int, envs: int = 16) -> float:
    from core.replay import ReplayStore
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    t0 = time.perf_counter()
    ids = []
    for i in range(max(1, steps // shard_rows)):
        ids.append(store.write_shard(f"s{i:06d}", [synthetic_batch(i, shard_rows // envs, envs, i % 4)]).id)
    store.commit(ids)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5_000_000)
    p.add_argument("--shard-rows", type=int, default=50_000)
    p.add_argument("--target-mib", type=float, default=64)
    p.add_argument("--engines", default="dask,beam")
    p.add_argument("--beam-args", default="", help="Beam pipeline options, e.g. --direct_running_mode=...")
    p.add_argument("--dir", default=None, help="scratch folder (default: a temp dir, deleted)")
    p.add_argument("--json", default=None, help="write results as JSON here")
    args = p.parse_args()
    from core.dataset import compact, stats
    from pipelines.executors.factory import make_pass_executor
    from core.replay import ReplayStore
    root = args.dir or tempfile.mkdtemp(prefix="process-bench-")
    base = os.path.join(root, "base")
    build_s = build_store(base, args.steps, args.shard_rows)
    rows = ReplayStore.open(base).snapshot().num_rows
    print(f"store: {rows:,} steps in {rows // args.shard_rows} shards, built in {build_s:.1f} s")
    results = []
    for kind in args.engines.split(","):
        engine = make_pass_executor(kind, shlex.split(args.beam_args) if kind == "beam" else None)
        try:
            t0 = time.perf_counter()
            s = stats.compute_stats(engine, base)
            stats_s = time.perf_counter() - t0
            copy = os.path.join(root, f"compact-{kind}")
            shutil.copytree(base, copy)
            t0 = time.perf_counter()
            c = compact.compact_store(engine, copy, target_bytes=int(args.target_mib * (1 << 20)))
            compact_s = time.perf_counter() - t0
            shutil.rmtree(copy)
        finally:
            engine.close()
        assert s["rows"] == rows and c["rows"] == rows
        results.append({"engine": kind, "steps": rows, "stats_s": stats_s, "stats_steps_per_s": rows / stats_s,
                        "compact_s": compact_s, "compact_steps_per_s": rows / compact_s,
                        "shards_before": c["shards_before"], "shards_after": c["shards_after"],
                        "episodes": s["episodes"]})
        r = results[-1]
        print(f"{kind:5s} stats {r['stats_s']:7.2f} s {r['stats_steps_per_s']:>12,.0f} steps/s | compact "
              f"{r['compact_s']:7.2f} s {r['compact_steps_per_s']:>12,.0f} steps/s "
              f"({r['shards_before']} -> {r['shards_after']} shards)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "build_s": build_s, "results": results}, f, indent=1)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # Dask workers re-import __main__
    main()
