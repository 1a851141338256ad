"""Per-round overhead: Beam DirectRunner (one pipeline per round) vs the Dask executor.

Both engines do the same work per round: ``--actors`` rollout tasks of
``--envs`` CartPole envs x ``--steps`` vector steps with an int8 policy,
one shard write per task, one commit. Dask runs it on a LocalCluster that
stays up between rounds (as in training); Beam builds and runs one
rollout-only pipeline per round (:func:`build_round`, below). Training
with ``--executor beam`` runs ``--blocks_per_round`` plan blocks (rollouts,
shard writes, commits and learner calls) per round pipeline
(``pipelines.beam.graph``), so its start-up cost is paid once per that many
blocks, not per block as here.

    overhead per round = round wall time - rollout compute / workers

Usage::

    python -m benchmarks.micro.round_overhead                        # 5 rounds, 2 actors x 8 envs x 128 steps
    python -m benchmarks.micro.round_overhead --rounds 3 --steps 512 --beam-mode in_memory
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pipelines import cli as _cli  # noqa: F401  (quiets TensorFlow's C++ logging before TF loads)


def _payload():
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("int8-dynamic").quantize(mlp(4, [256, 256], 2, name="q", seed=0), version=1)


def _specs(run_id: str, actors: int, envs: int):
    from core.actor import ActorSpec
    return tuple(ActorSpec(run_id, "CartPole-v1", envs, 0, a) for a in range(actors))


# --------------------------------------------------------------------------- the rollout-only round (Beam)
# One task per actor (task index = round), shards r<round>-g<group>, one commit; no learner. Training
# rounds (pipelines.beam.graph) chain plan blocks with their learner instead.
@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """Everything a round's workers need: small, picklable."""
    run_dir: str
    round: int
    actor_specs: Tuple[Any, ...]            # core.actor.ActorSpec per actor
    explore: Tuple[Dict[str, float], ...]   # selector params per actor
    steps_per_task: int
    actors_per_shard: int
    policy_version: int

    @property
    def store_url(self) -> str:
        return os.path.join(self.run_dir, "replay")

    def shard_id(self, group: int) -> str:
        """Deterministic: the same round and group always write the same shard."""
        return f"r{self.round:06d}-g{group:04d}"


def record_path(run_dir: str, round_index: int) -> str:
    return os.path.join(run_dir, "rounds", f"r{round_index:06d}.json")


def read_record(run_dir: str, round_index: int) -> Optional[Dict[str, Any]]:
    """A round's JSON record (written by its commit), or None."""
    path = record_path(run_dir, round_index)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def publish_round_policy(version: int, plan: RoundPlan) -> str:
    """The path of the round's policy (written before the pipeline runs)."""
    from pipelines.beam import policy_files
    if not policy_files.exists(plan.run_dir, version):
        raise FileNotFoundError(f"round {plan.round}: no policy v{version} under {plan.run_dir}/policies")
    return policy_files.payload_path(plan.run_dir, version)


def rollout_round_task(actor_id: int, plan: RoundPlan, policy_path: str):
    """One actor's rollout task of the round, with the policy read from its path (its state dropped:
    rounds start every actor afresh, and Beam would pickle a snapshot nobody reads)."""
    from core.rollout import run_rollout_task
    from pipelines.beam import policy_files
    payload = policy_files.read_payload(policy_path)
    result = run_rollout_task(plan.actor_specs[actor_id], payload, plan.round, plan.steps_per_task,
                              plan.explore[actor_id])
    result.next_state = None
    return result


def write_round_shard(group_results: Tuple[int, Sequence[Any]], plan: RoundPlan) -> Dict[str, Any]:
    """Write one ``(group, results)`` as an uncommitted shard; returns its info plus the tasks' stats."""
    from pipelines.run import stages
    group, results = group_results
    results = sorted(results, key=lambda r: r.stats.actor_id)   # grouping order is not deterministic
    info = stages.write_shard_stage(plan.store_url, plan.shard_id(group), results, {})
    info["tasks"] = [{"actor": r.stats.actor_id, "worker": r.stats.worker, "env_steps": r.stats.env_steps,
                      "seconds": r.stats.seconds, "returns": r.stats.episode_returns} for r in results]
    return info


def commit_round(infos: List[Dict[str, Any]], plan: RoundPlan) -> Dict[str, Any]:
    """The single committer: one idempotent commit entry, then the round record (JSON, returned)."""
    from core.replay import ReplayStore
    from pipelines.run import stages
    infos = sorted(infos, key=lambda i: i["shard_id"])
    store = ReplayStore.open(plan.store_url)
    version = stages.commit_stage(store, [i["shard_id"] for i in infos],
                                  meta={"round": plan.round, "policy_version": plan.policy_version})
    record = {"round": plan.round, "log_version": version, "shards": [i["shard_id"] for i in infos],
              "rows": sum(i["rows"] for i in infos), "tasks": [t for i in infos for t in i["tasks"]]}
    path = record_path(plan.run_dir, plan.round)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f)
    return record


def build_round(pipeline, plan: RoundPlan, payload) -> None:
    """The round's pipeline; the policy enters as its path (a side input), written here as the plan's version."""
    import apache_beam as beam
    from pipelines.beam import policy_files
    policy_files.write_payload(plan.run_dir, payload, plan.policy_version)
    policy = beam.pvalue.AsSingleton(pipeline
                                     | "Policy" >> beam.Create([plan.policy_version])
                                     | "Publish" >> beam.Map(publish_round_policy, plan))
    per = plan.actors_per_shard
    (pipeline
     | "CreateTasks" >> beam.Create(list(range(len(plan.actor_specs))))
     | "Reshuffle" >> beam.Reshuffle()      # to prevent fusion: one task per worker, not all on one
     | "StepEnvs" >> beam.Map(rollout_round_task, plan, policy)
     | "KeyByShard" >> beam.Map(lambda r: (r.stats.actor_id // per, r))
     | "GroupShards" >> beam.GroupByKey()
     | "Write" >> beam.Map(write_round_shard, plan)
     | "ToList" >> beam.combiners.ToList()  # all of the round's shards in one element
     | "Commit" >> beam.Map(commit_round, plan))


# --------------------------------------------------------------------------- the two engines
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
    from pipelines.executors import beam as beam_executor
    run_dir = os.path.join(root, "beam")
    ReplayStore.open_or_create(os.path.join(run_dir, "replay"), env_id="CartPole-v1")
    options = beam_executor.pipeline_options(["--direct_running_mode", args.beam_mode], run_dir,
                                             num_workers=args.workers)
    specs = _specs("bench-beam", args.actors, args.envs)
    out = []
    for r in range(args.rounds + 1):
        plan = RoundPlan(run_dir, r, specs, tuple({"epsilon": 0.1} for _ in specs), args.steps,
                         actors_per_shard=1, policy_version=1)
        t0 = time.perf_counter()
        beam_executor.run_pipeline(lambda p: build_round(p, plan, payload), options)
        wall = time.perf_counter() - t0
        compute = sum(t["seconds"] for t in read_record(run_dir, r)["tasks"])
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
