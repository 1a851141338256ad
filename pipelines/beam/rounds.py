"""Rounds as Beam pipelines (``--executor beam``): the entry point, and rollout-only rounds.

:func:`train_in_rounds` runs a training run as round pipelines of the
plan's blocks (:mod:`pipelines.beam.launcher` submits them,
:mod:`pipelines.beam.blocks` builds them, :mod:`pipelines.beam.learner` is
their learner stage). Local, Dask and Beam run the same
:mod:`pipelines.run.plan` schedule, so a config and seed give bit-identical
learner parameters and committed replay on all of them
(tests/test_beam_identity.py).

Reproducibility, in detail: a Beam round holds ``blocks_per_round``
consecutive plan blocks; block ``b``'s tasks are ``plan.tasks(b)`` into shard
``s<b>``, acting with the version published after learner block
``b - 1 - policy_lag`` (one version per ``broadcast_period`` learner steps,
as the driver publishes them); actors keep their env state from task to task
(pipeline data within a round, ``core.actor_state`` documents across
rounds); the learner trains the plan's ``steps_per_call`` calls with
``sampler_rng(b)`` from its exact state after block ``b - 1``; evaluation
blocks, seeds, the stop rule (``STOP_DELAY``), best-version keeping and
checkpoint cadence are the driver's.

:class:`RoundPlan` / :func:`build_round` remain as a rollout-only round
(one task per actor, shards ``r<round>-g<group>``, one commit, an optional
evaluation; no learner): what ``benchmarks/round_overhead.py`` measures and
tests of stage CPU accounting use::

    round pipeline r (Beam):
        Policy/Publish  the path of the round's policy (a side input, never the bytes)
        CreateTasks     one element per actor
        Reshuffle       to prevent fusion: rollouts spread over workers
        RollOut         run_rollout_task(actor, payload read from its path, task_index=round)
        KeyByShard      actor -> shard group (deterministic)
        GroupShards     one group per shard id  r<round>-g<group>
        WriteShards     write_shard_stage: uncommitted zarr shard (a retry overwrites it)
        ToList          all shard infos of the round on one worker ...
        Commit          ... one commit-log entry (idempotent) + rounds/r<round>.json
      and, with ``evaluate``: CreateEval -> Evaluate -> rounds/r<round>-eval.json

Example::

    summary = train_in_rounds(cfg, "gs://bucket/runs/a",
                              ["--runner", "DataflowRunner", "--project", "p", "--region", "us-central1",
                               "--temp_location", "gs://bucket/tmp", "--setup_file", "./setup.py",
                               "--blocks_per_round", "8"])
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam

from core import urls
from core.rollout import ActorSpec, RolloutResult, run_rollout_task
from core.stage_cpu import counted
from pipelines.beam import policy_files
from pipelines.run import stages


# --------------------------------------------------------------------------- the round plan
@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """Everything a round's workers need: small, picklable, derived from config + durable state."""
    run_dir: str
    round: int
    actor_specs: Tuple[ActorSpec, ...]
    explore: Tuple[Dict[str, float], ...]   # selector params per actor
    steps_per_task: int
    actors_per_shard: int
    policy_version: int
    evaluate: bool = False
    eval_args: Tuple[Any, ...] = ()          # run_evaluation_task(payload, *eval_args)
    writer_options: Tuple[Tuple[str, Any], ...] = ()   # cfg.replay.writer_options(), as items
    cpu_sink: str = ""                       # stages record their process CPU here (core.stage_cpu)

    @property
    def store_url(self) -> str:
        return urls.join(self.run_dir, "replay")

    def shard_id(self, group: int) -> str:
        """Deterministic: the same round and group always write the same shard."""
        return f"r{self.round:06d}-g{group:04d}"


def record_path(run_dir: str, round_index: int, kind: str = "") -> Tuple[Any, str]:
    fs, path = urls.resolve(run_dir)
    return fs, f"{path}/rounds/r{round_index:06d}{'-' + kind if kind else ''}.json"


def _write_json(run_dir: str, round_index: int, kind: str, data: Dict[str, Any]) -> None:
    fs, path = record_path(run_dir, round_index, kind)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        json.dump(data, f)


def read_record(run_dir: str, round_index: int, kind: str = "") -> Optional[Dict[str, Any]]:
    """A rollout-only round's JSON record (kind "" or "eval"), or None."""
    fs, path = record_path(run_dir, round_index, kind)
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------- stage functions (worker side)
def publish_round_policy(version: int, plan: RoundPlan) -> str:
    """The path of the round's policy (written before the pipeline runs)."""
    if not policy_files.exists(plan.run_dir, version):
        raise FileNotFoundError(f"round {plan.round}: no policy v{version} under {urls.join(plan.run_dir, 'policies')}")
    return policy_files.payload_path(plan.run_dir, version)


def rollout_round_task(actor_id: int, plan: RoundPlan, policy_path: str) -> RolloutResult:
    """One actor's rollout task of the round (task index = round), with the policy read from its path.

    Rounds start every actor afresh, so the result drops the actor's state
    (``next_state``): Beam pickles results between stages, and a snapshot
    nobody reads costs ~2 ms per task.
    """
    payload = policy_files.read_payload(policy_path)
    result = run_rollout_task(plan.actor_specs[actor_id], payload, plan.round, plan.steps_per_task,
                              plan.explore[actor_id])
    result.next_state = None
    return result


def write_round_shard(group_results: Tuple[int, Sequence[RolloutResult]], plan: RoundPlan) -> Dict[str, Any]:
    """Write one ``(group, results)`` as an uncommitted shard; returns its info plus the tasks' stats."""
    group, results = group_results
    results = sorted(results, key=lambda r: r.stats.actor_id)   # grouping order is not deterministic
    info = stages.write_shard_stage(plan.store_url, plan.shard_id(group), results, dict(plan.writer_options))
    info["tasks"] = [{"actor": r.stats.actor_id, "worker": r.stats.worker, "env_steps": r.stats.env_steps,
                      "seconds": r.stats.seconds, "returns": r.stats.episode_returns} for r in results]
    return info


def commit_round(infos: List[Dict[str, Any]], plan: RoundPlan) -> Dict[str, Any]:
    """The single committer: one idempotent commit entry, then the round record (JSON, returned)."""
    from core.replay import ReplayStore
    infos = sorted(infos, key=lambda i: i["shard_id"])
    store = ReplayStore.open(plan.store_url)
    version = stages.commit_stage(store, [i["shard_id"] for i in infos],
                                  meta={"round": plan.round, "policy_version": plan.policy_version})
    tasks = [t for i in infos for t in i["tasks"]]
    record = {"round": plan.round, "log_version": version, "shards": [i["shard_id"] for i in infos],
              "rows": sum(i["rows"] for i in infos), "bytes": sum(i["nbytes"] for i in infos),
              "raw_bytes": sum(i["raw_bytes"] for i in infos), "tasks": tasks}
    _write_json(plan.run_dir, plan.round, "", record)
    return record


def evaluate_round(_: int, plan: RoundPlan, policy_path: str) -> Dict[str, Any]:
    """Evaluate the round's policy (in parallel with its rollouts); result -> rounds/r<round>-eval.json."""
    result = stages.run_evaluation_task(policy_files.read_payload(policy_path), *plan.eval_args)
    _write_json(plan.run_dir, plan.round, "eval", result)
    return result


# --------------------------------------------------------------------------- transforms
class RollOut(beam.PTransform):
    """actor ids -> RolloutResults, spread over workers."""

    def __init__(self, plan: RoundPlan, policy_path):
        super().__init__()
        self.plan, self.policy_path = plan, policy_path

    def expand(self, actor_ids):
        return (actor_ids
                | "Reshuffle" >> beam.Reshuffle()   # to prevent fusion: one task per worker, not all on one
                | "StepEnvs" >> beam.Map(counted(rollout_round_task, self.plan.cpu_sink), self.plan,
                                         self.policy_path))


class WriteShards(beam.PTransform):
    """RolloutResults -> one uncommitted shard per group of ``actors_per_shard`` actors."""

    def __init__(self, plan: RoundPlan):
        super().__init__()
        self.plan = plan

    def expand(self, results):
        per = self.plan.actors_per_shard
        return (results
                | "KeyByShard" >> beam.Map(lambda r: (r.stats.actor_id // per, r))
                | "GroupShards" >> beam.GroupByKey()
                | "Write" >> beam.Map(counted(write_round_shard, self.plan.cpu_sink), self.plan))


class CommitShards(beam.PTransform):
    """Shard infos -> one commit-log entry, through a single committer."""

    def __init__(self, plan: RoundPlan):
        super().__init__()
        self.plan = plan

    def expand(self, infos):
        return (infos
                | "ToList" >> beam.combiners.ToList()   # all of the round's shards in one element
                | "Commit" >> beam.Map(counted(commit_round, self.plan.cpu_sink), self.plan))


def build_round(pipeline, plan: RoundPlan, payload=None) -> None:
    """The round's pipeline, top to bottom.

    The policy enters as its path (a side input of a few bytes), never as
    bytes in the graph. ``payload``: for tests and benchmarks without a
    learner, written to the run directory as the plan's version now.
    """
    if payload is not None:
        policy_files.write_payload(plan.run_dir, payload, plan.policy_version)
    policy = beam.pvalue.AsSingleton(pipeline
                                     | "Policy" >> beam.Create([plan.policy_version])
                                     | "Publish" >> beam.Map(publish_round_policy, plan))
    record = (pipeline
              | "CreateTasks" >> beam.Create(list(range(len(plan.actor_specs))))
              | "RollOut" >> RollOut(plan, policy)
              | "WriteShards" >> WriteShards(plan)
              | "CommitShards" >> CommitShards(plan))
    del record   # the commit writes its own record
    if plan.evaluate:
        (pipeline
         | "CreateEval" >> beam.Create([plan.round])
         | "Evaluate" >> beam.Map(counted(evaluate_round, plan.cpu_sink), plan, policy))


# --------------------------------------------------------------------------- entry point
def train_in_rounds(cfg, run_dir: str, pipeline_args: Sequence[str], progress: bool = True,
                    resume: bool = False) -> Dict[str, Any]:
    """Train ``cfg`` as rounds of Beam pipelines into ``run_dir``; returns the summary (see driver)."""
    from pipelines.executors import _thread_env
    from pipelines.executors import beam as beam_executor
    from pipelines.beam.launcher import RoundLauncher
    run_dir = urls.normalize(run_dir)
    pipeline_args, blocks_per_round = blocks_per_round_arg(pipeline_args)
    options = beam_executor.pipeline_options(pipeline_args, run_dir)   # rejects bad runner/run dir first
    if beam_executor.is_local_runner(pipeline_args):
        import os
        for k, v in _thread_env(cfg).items():   # inherited by DirectRunner worker processes
            os.environ.setdefault(k, v)
    return RoundLauncher(cfg, run_dir, options, progress, resume, blocks_per_round).run()


def blocks_per_round_arg(pipeline_args: Sequence[str]) -> Tuple[List[str], int]:
    """``--blocks_per_round N`` (ours, not Beam's) taken out of the pipeline options; default the launcher's.

    Raises:
        ConfigError: N is not an integer >= 1.
    """
    from core.config import ConfigError
    from pipelines.beam.launcher import BLOCKS_PER_ROUND
    args, value, i = list(pipeline_args), None, 0
    while i < len(args):
        a = args[i]
        if a == "--blocks_per_round" or a.startswith("--blocks_per_round="):
            if "=" in a:
                value = a.split("=", 1)[1]
                del args[i]
            else:
                value = args[i + 1] if i + 1 < len(args) else ""
                del args[i:i + 2]
            continue
        i += 1
    if value is None:
        return args, BLOCKS_PER_ROUND
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"--blocks_per_round {value!r} is not valid; valid: an integer >= 1 "
                          f"(plan blocks per round pipeline, default {BLOCKS_PER_ROUND})")
    return args, int(value)
