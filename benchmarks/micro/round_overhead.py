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

``--part learner`` measures what a training round's learner pays whatever
the round's length (import and build, state restore and replay-cache
refill, state saves), for two checkouts side by side (``--base`` before,
``--tree`` after, alternating): in each, a run of ``--prefix-blocks`` plan
blocks, then ``--resume`` for ``--round-blocks`` more in one round, each on
the checkout's default DirectRunner, with the checkout's ``BlockLearner``
methods timed in every process (``__init__``: import + build, once per
process that learns; ``_hold``: restore + refill; ``_save``: saves).
Learning itself is not counted.

Usage::

    python -m benchmarks.micro.round_overhead                        # 5 rounds, 2 actors x 8 envs x 128 steps
    python -m benchmarks.micro.round_overhead --rounds 3 --steps 512 --beam-mode in_memory
    python -m benchmarks.micro.round_overhead --part learner --base /tmp/base --tree . --repeats 2 \
        --out benchmarks/results/beam-round-learner.json
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


# --------------------------------------------------------------------------- a training round's learner
# Loaded by every process of a probe run (the launcher and the DirectRunner's worker processes) through
# PYTHONPATH: times the checkout's BlockLearner methods, one JSON line per call, to $ROUND_PROBE_FILE.
_SITECUSTOMIZE = r"""
import json, os, time
try:
    import pipelines.beam.learner as _L
except Exception:
    _L = None
if _L is not None and os.environ.get("ROUND_PROBE_FILE"):
    def _timed(name, key):
        f = getattr(_L.BlockLearner, name)
        def g(self, *a, **k):
            t = time.perf_counter()
            try:
                return f(self, *a, **k)
            finally:
                with open(os.environ["ROUND_PROBE_FILE"], "a") as out:
                    out.write(json.dumps({"key": key, "s": time.perf_counter() - t, "pid": os.getpid()}) + "\n")
        setattr(_L.BlockLearner, name, g)
    for _name, _key in (("__init__", "build"), ("_hold", "restore"), ("_save", "save")):
        _timed(_name, _key)
"""

_LEARNER_PROBE = r"""
import json, sys, time
from core.config import load_config
from pipelines.train import train
config, overrides, run_dir, blocks, phase = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
cfg = load_config(config, overrides=["executor=beam", *overrides])
t = time.perf_counter()
train(cfg, run_dir, progress=False, resume=phase == "round", pipeline_args=["--blocks_per_round", str(blocks)])
print(json.dumps({"wall_s": time.perf_counter() - t}))
"""


def _probe(tree: str, config: str, overrides: List[str], run_dir: str, blocks: int, phase: str) -> Dict[str, Any]:
    """One run (``phase`` prefix: new; round: ``--resume``) on the checkout's default DirectRunner; the
    learner's timed calls summed over every process of it."""
    import subprocess
    import sys
    probe_dir = tempfile.mkdtemp(prefix="round-probe-")
    try:
        with open(os.path.join(probe_dir, "sitecustomize.py"), "w") as f:
            f.write(_SITECUSTOMIZE)
        timings = os.path.join(probe_dir, "timings.jsonl")
        env = {**os.environ, "PYTHONPATH": f"{probe_dir}:{os.path.abspath(tree)}", "ROUND_PROBE_FILE": timings}
        proc = subprocess.run([sys.executable, "-c", _LEARNER_PROBE, config, json.dumps(overrides), run_dir,
                               str(blocks), phase], cwd=tree, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise RuntimeError(f"{tree} {phase}: {proc.stderr[-2000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        calls = [json.loads(line) for line in open(timings)] if os.path.exists(timings) else []
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    for key in ("build", "restore", "save"):
        out[key] = sum(c["s"] for c in calls if c["key"] == key)
    out["saves"] = sum(c["key"] == "save" for c in calls)
    out["learner_processes"] = len({c["pid"] for c in calls if c["key"] == "build"})
    return out


def bench_learner(args) -> Dict[str, Any]:
    """Per-round learner fixed cost in ``args.base`` and ``args.tree``, alternating (module docstring)."""
    from core.config import load_config
    from pipelines.run.plan import TrainingPlan
    rows = TrainingPlan.from_config(load_config(args.config, overrides=args.set)).block_rows
    runs: Dict[str, List[Dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(args.repeats):
        for label, tree in (("before", args.base), ("after", args.tree)):
            root = tempfile.mkdtemp(prefix=f"round-learner-{label}-")
            try:
                run_dir = os.path.join(root, "run")
                prefix = [*args.set, f"total_env_steps={args.prefix_blocks * rows}"]
                _probe(tree, args.config, prefix, run_dir, args.prefix_blocks, "prefix")
                total = [*args.set, f"total_env_steps={(args.prefix_blocks + args.round_blocks) * rows}"]
                runs[label].append(_probe(tree, args.config, total, run_dir, args.round_blocks, "round"))
            finally:
                shutil.rmtree(root, ignore_errors=True)
    return runs


def _learner_table(args, runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    import numpy as np
    from pipelines.cli import print_table
    keys = ("build", "restore", "save", "saves", "learner_processes", "wall_s")
    med = {label: {k: float(np.median([r[k] for r in rs])) for k in keys} for label, rs in runs.items()}
    for m in med.values():
        m["fixed"] = m["build"] + m["restore"] + m["save"]
    rows = [[label, f"{m['build']:.2f} ({m['learner_processes']:.0f})", f"{m['restore']:.2f}",
             f"{m['save']:.2f} ({m['saves']:.0f})", f"{m['fixed']:.2f}", f"{m['wall_s']:.1f}"] for label, m in med.items()]
    print(f"{args.config} {' '.join(args.set)}: a round of {args.round_blocks} blocks after {args.prefix_blocks} "
          f"(median of {args.repeats})")
    print_table(["code", "import+build s (processes)", "restore+refill s", "saves s (n)", "fixed s", "round run wall s"], rows)
    ratio = med["before"]["fixed"] / max(med["after"]["fixed"], 1e-9)
    print(f"fixed cost before / after: {ratio:.2f}x")
    return {"median": med, "ratio": ratio}


def learner_main(args) -> None:
    import datetime
    import platform
    runs = bench_learner(args)
    table = _learner_table(args, runs)
    if args.out:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                   platform.processor())
        record = {"schema": "databloom.round_learner/1", "command": "python -m benchmarks.micro.round_overhead "
                  + " ".join(args.argv), "measured_at": datetime.datetime.utcnow().isoformat(timespec="seconds") + "Z",
                  "cpu": cpu, "cores": os.cpu_count(), "load_average": list(os.getloadavg()), "config": args.config,
                  "set": args.set, "prefix_blocks": args.prefix_blocks, "round_blocks": args.round_blocks,
                  "runs": runs, **table}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


def main(argv=None) -> None:
    import sys
    import numpy as np
    from pipelines.cli import print_table
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="rounds", choices=["rounds", "learner"])
    p.add_argument("--base", help="--part learner: the checkout before (e.g. git archive of the older commit)")
    p.add_argument("--tree", default=".", help="--part learner: the checkout after")
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--set", nargs="*", default=[], help="config overrides (--part learner)")
    p.add_argument("--prefix-blocks", type=int, default=16)
    p.add_argument("--round-blocks", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--actors", type=int, default=2)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--beam-mode", default="multi_processing", choices=["multi_processing", "in_memory",
                                                                       "multi_threading"])
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.part == "learner":
        if not args.base:
            p.error("--part learner needs --base (the checkout to compare against)")
        learner_main(args)
        return
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
