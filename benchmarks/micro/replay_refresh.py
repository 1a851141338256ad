"""The learner's storage path per block as the replay store fills: shard write, commit, cache refresh.

A training run commits one shard per block and the learner refreshes its
replay cache to it before it trains (``pipelines.run.resume.refresh_cache``); in
actor-bound ActorQ runs that refresh sits on the learner's critical path at
every block. This replays the path with real actor rollouts (the ActorQ-size
CartPole policy at int8-dynamic, ``--actors`` actors x ``--envs`` envs, 4 tasks
of 32 steps per block: 512 rows at the defaults, as
``configs/actorq/cartpole-dqn.yaml`` with ``env.num_envs=1``) and prints, per
16 blocks, the medians of:

* ``write``: ``write_shard_stage`` (on a worker in a run);
* ``commit``: ``commit_stage``;
* ``refresh``: the cache refresh, with the cache's rows and its cross-shard
  link bookkeeping (segment heads and tails), which grow with the cache.

Then, side by side on the committed shards (alternating, median): a shard's
fields read by ``ShardReader.read_all`` (tensorstore where the store has a
tensorstore kvstore) and field by field through zarr-python (``read``).

Usage::

    python -m benchmarks.micro.replay_refresh                  # 128 blocks, ~1 min on 2 cores
    python -m benchmarks.micro.replay_refresh --blocks 32 --out /tmp/refresh.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence


def rollouts(cfg, builder, payload, specs, prev: List[Any], block: int, tasks: int) -> List[Any]:
    """One block's actor tasks, each actor's tasks chained as in a run."""
    from core.rollout import run_rollout_task
    explore = builder.exploration(cfg.agent, 0, 0)
    out = []
    for t in range(tasks):
        for a, spec in enumerate(specs):
            prev[a] = run_rollout_task(spec, payload, block * tasks + t, cfg.actors.steps_per_task, explore,
                                       after=prev[a])
            out.append(prev[a])
    return out


def fill(cfg, blocks: int, url: str, report_every: int = 16) -> List[Dict[str, float]]:
    """Write, commit and refresh ``blocks`` blocks; returns one row of timings per block."""
    from core.agents.registry import get_builder
    from core.envs import env_spec
    from core.quantize import PolicyQuantizer
    from core.replay import ReplayCache, ReplayStore
    from core.actor import ActorSpec
    from pipelines.run import resume as resume_lib
    from pipelines.run import stages
    from pipelines.run.plan import TrainingPlan
    builder = get_builder(cfg.agent.algo)
    learner = builder.make_learner(env_spec(cfg.env.id), cfg.agent, cfg.seed)
    payload = PolicyQuantizer(cfg.actors.precision).quantize(learner.policy_model, 1, None)
    specs = [ActorSpec("refresh-bench", cfg.env.id, cfg.env.num_envs, cfg.seed, a, cfg.env.max_episode_steps,
                       cfg.threads.litert, builder.action_selector) for a in range(cfg.actors.num_actors)]
    store = ReplayStore.open_or_create(url, env_id=cfg.env.id, **cfg.replay.writer_options())
    cache = ReplayCache(store, max_transitions=cfg.replay.capacity)
    tasks, prev, rows = TrainingPlan.from_config(cfg).tasks_per_block, [None] * len(specs), []
    for b in range(blocks):
        results = rollouts(cfg, builder, payload, specs, prev, b, tasks)
        sid = stages.shard_id_for(b)
        t0 = time.perf_counter()
        stages.write_shard_stage(url, sid, results, cfg.replay.writer_options())
        t1 = time.perf_counter()
        stages.commit_stage(store, [sid])
        t2 = time.perf_counter()
        resume_lib.refresh_cache(cache, store, b)
        t3 = time.perf_counter()
        rows.append({"block": b, "write_s": t1 - t0, "commit_s": t2 - t1, "refresh_s": t3 - t2,
                     "cache_rows": cache.size, **cache.pending_links})
        if (b + 1) % report_every == 0 or b + 1 == blocks:
            seg = rows[-report_every:]
            med = lambda k: 1e3 * statistics.median(r[k] for r in seg)  # noqa: E731
            links = cache.pending_links
            print(f"blocks {seg[0]['block']:4d}-{b:4d}  cache rows {cache.size:6d}  heads {links['heads']:5d}  "
                  f"tails {links['tails']:5d}  write {med('write_s'):6.1f} ms  commit {med('commit_s'):5.1f} ms  "
                  f"refresh {med('refresh_s'):5.1f} ms", flush=True)
    return rows


def compare_reads(shards_url: str, shard_ids: Sequence[str]) -> Dict[str, float]:
    """Median seconds per shard: ``read_all`` vs field-by-field zarr-python reads, alternating."""
    from core.replay.shard_reader import ShardReader
    fast, zarr = [], []
    for sid in shard_ids:
        for kind, out in (("read_all", fast), ("zarr", zarr)):
            reader = ShardReader(shards_url, sid)
            t0 = time.perf_counter()
            reader.read_all() if kind == "read_all" else {n: reader.read(n) for n in reader.field_names}
            out.append(time.perf_counter() - t0)
    return {"read_all_s": statistics.median(fast), "zarr_fields_s": statistics.median(zarr)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    from core.config import load_config
    from pipelines.run.stages import shard_id_for
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=128, help="blocks (shards) to write, commit and refresh")
    ap.add_argument("--actors", type=int, default=4, help="actors per block (each runs 4 tasks of 32 steps)")
    ap.add_argument("--envs", type=int, default=1, help="envs per actor (rows per block: 128 x actors x envs)")
    ap.add_argument("--out", help="write the per-block timings and the read comparison as JSON")
    args = ap.parse_args(argv)
    if args.blocks < 2 or args.actors < 1 or args.envs < 1:
        print(f"error: --blocks must be >= 2 (got {args.blocks}), --actors and --envs >= 1", file=sys.stderr)
        return 2
    cfg = load_config(os.path.join("configs", "actorq", "cartpole-dqn.yaml"),
                      [f"env.num_envs={args.envs}", f"actors.num_actors={args.actors}",
                       "actors.precision=int8-dynamic", "threads.tf_intra_op=1"])
    with tempfile.TemporaryDirectory(prefix="replay-refresh-") as tmp:
        url = os.path.join(tmp, "replay")
        rows = fill(cfg, args.blocks, url)
        reads = compare_reads(os.path.join(url, "shards"), [shard_id_for(r["block"]) for r in rows[2:]])
    ratio = reads["zarr_fields_s"] / reads["read_all_s"]
    print(f"\nreading one shard's fields, median over {len(rows) - 2} shards: read_all "
          f"{reads['read_all_s'] * 1e3:.1f} ms, zarr-python field by field {reads['zarr_fields_s'] * 1e3:.1f} ms "
          f"({ratio:.1f}x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"blocks": rows, "reads": reads, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                    time.gmtime())}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
