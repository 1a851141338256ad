"""Per-round overhead: Beam DirectRunner (one pipeline per round) vs the Dask executor.

Both engines do the same work per round: ``--actors`` rollout tasks of
``--envs`` CartPole envs x ``--steps`` vector steps with an int8 policy,
one shard write per task, one commit. Dask runs it on a LocalCluster that
stays up between rounds (as in training); Beam builds and runs one
rollout-only pipeline per round (``pipelines.beam.rounds.build_round``). Training
with ``--executor beam`` runs ``--blocks_per_round`` plan blocks (rollouts,
shard writes, commits and learner calls) per round pipeline
(``pipelines.beam.blocks``), so its start-up cost is paid once per that many
blocks, not per block as here.

    overhead per round = round wall time - rollout compute / workers

Usage::

    python -m benchmarks.micro.round_overhead                        # 5 rounds, 2 actors x 8 envs x 128 steps
    python -m benchmarks.micro.round_overhead --rounds 3 --steps 512 --beam-mode in_memory
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Dict, List

from pipelines import cli as _cli  # noqa: F401  (quiets TensorFlow's C++ logging before TF loads)


def _payload():
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("int8-dynamic").quantize(mlp(4, [256, 256], 2, name="q", seed=0), version=1)


def _specs(run_id: str, actors: int, envs: int):
    from core.rollout import ActorSpec
    return tuple(ActorSpec(run_id, "CartPole-v1", envs, 0, a) for a in range(actors))


def bench_dask(args, payload, root: str) -> List[Dict[str, float]]:
    from core.replay import ReplayStore
    from pipelines.run import stages
    from pipelines.executors.dask import DaskExecutor
    store_url = os.path.join(root, "dask", "replay")
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    ex = DaskExecutor(n_workers=args.workers, threads_per_worker=1,
                      thread_env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    specs = _specs("bench-dask", args.actors, args.envs)
    out = []
    try:
        ref = ex.broadcast(payload)
        for r in range(args.rounds + 1):          # round 0 warms the workers up (imports), not reported
            t0 = time.perf_counter()
            rolls = [ex.submit(stages.run_rollout_task, s, ref, r, args.steps, {"epsilon": 0.1},
                               key=f"roll-{r}-{s.actor_id}", actor=s.actor_id) for s in specs]
            writes = [ex.submit(stages.write_shard_stage, store_url, f"r{r:06d}-g{i:04d}", [f],
                                key=f"write-{r}-{i}") for i, f in enumerate(rolls)]
            infos = [w.result() for w in writes]
            stages.commit_stage(store, [i["shard_id"] for i in infos], meta={"round": r})
            wall = time.perf_counter() - t0
            compute = sum(f.result().stats.seconds for f in rolls)
            if r:
                out.append({"wall_s": wall, "compute_s": compute})
    finally:
        ex.close()
    return out


def bench_beam(args, payload, root: str) -> List[Dict[str, float]]:
    from core.replay import ReplayStore
    from pipelines.beam import rounds
    from pipelines.executors import beam as beam_executor
    run_dir = os.path.join(root, "beam")
    ReplayStore.open_or_create(os.path.join(run_dir, "replay"), env_id="CartPole-v1")
    options = beam_executor.pipeline_options(["--direct_running_mode", args.beam_mode], run_dir,
                                             num_workers=args.workers)
    specs = _specs("bench-beam", args.actors, args.envs)
    out = []
    for r in range(args.rounds + 1):
        plan = rounds.RoundPlan(run_dir, r, specs, tuple({"epsilon": 0.1} for _ in specs), args.steps,
                                actors_per_shard=1, policy_version=1)
        t0 = time.perf_counter()
        beam_executor.run_pipeline(lambda p: rounds.build_round(p, plan, payload), options)
        wall = time.perf_counter() - t0
        compute = sum(t["seconds"] for t in rounds.read_record(run_dir, r)["tasks"])
        if r:                                      # same warm-up rule as Dask (Beam has no warm state)
            out.append({"wall_s": wall, "compute_s": compute})
    return out


def main(argv=None) -> None:
    import numpy as np
    from pipelines.cli import print_table
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--beam-mode", default="multi_processing", choices=["multi_processing", "in_memory",
                                                                       "multi_threading"])
    args = p.parse_args(argv)
    payload = _payload()
    root = tempfile.mkdtemp(prefix="round-overhead-")
    try:
        results = {"dask": bench_dask(args, payload, root),
                   f"beam ({args.beam_mode})": bench_beam(args, payload, root)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows, base = [], None
    for name, res in results.items():
        wall = float(np.median([x["wall_s"] for x in res]))
        compute = float(np.median([x["compute_s"] for x in res])) / args.workers
        overhead = max(wall - compute, 0.0)
        base = base or (wall, overhead)
        rows.append([name, f"{wall:.3f}", f"{compute:.3f}", f"{overhead:.3f}",
                     f"{wall / base[0]:.1f}x", f"{overhead / max(base[1], 1e-9):.1f}x"])
    print(f"{args.rounds} rounds (median), {args.actors} actors x {args.envs} envs x {args.steps} steps "
          f"= {args.actors * args.envs * args.steps} env steps/round, {args.workers} workers")
    print_table(["engine", "round wall s", "rollout compute s / worker", "overhead s", "wall vs dask",
                 "overhead vs dask"], rows)


if __name__ == "__main__":   # Dask and Beam worker processes re-import __main__
    main()
