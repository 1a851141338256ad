"""Training as rounds: one Apache Beam pipeline per round (``--executor beam``).

Each round reads only durable state (the run directory) and leaves only
durable state behind, so a retried bundle, a re-run round or a restarted
launcher does no harm and nothing relies on the launcher's memory. The
learner is a stage of the round's pipeline (:mod:`pipelines.beam_learner`),
so the launcher (:mod:`pipelines.round_launcher`) only builds and submits
pipelines and reads JSON records: it imports neither TensorFlow nor LiteRT
and needs no accelerator::

    round pipeline r (Beam):
        Policy/Publish  the path of policy v = r + 1 (written by round r-1's learner stage; a new
                        run's round 0 quantizes the initial network); a side input, never the bytes
        CreateTasks     one element per actor
        Reshuffle       to prevent fusion: rollouts spread over workers
        RollOut         run_rollout_task(actor, payload read from its path, task_index=round)
        KeyByShard      actor -> shard group (deterministic)
        GroupShards     one group per shard id  r<round>-g<group>
        WriteShards     write_shard_stage: uncommitted zarr shard (a retry overwrites it)
        ToList          all shard infos of the round on one worker ...
        Commit          ... one commit-log entry (idempotent) + rounds/r<round>.json
        Learn           restore the latest checkpoint, keep the best (evaluation side input), train
                        K = replay_ratio * committed_rows - learner_steps steps, checkpoint,
                        publish policy v + 1 -> rounds/r<round>-learn.json (loop counters)
        FinishIfLast    after the run's last learner block, in the same worker: best parameters,
                        final evaluation -> rounds/final.json
      and, on evaluation rounds, in parallel with the rollouts:
        CreateEval -> Evaluate -> rounds/r<round>-eval.json   (an input of Learn)
    (a resumed run whose last round has no final record: one pipeline of Finish alone)

The checkpoint names the last finished round and carries the loop
counters, so ``--resume`` (or a crash) restarts at the first unfinished
round. Policies travel by path (:mod:`pipelines.policy_files`): ActorQ-size
payloads (8.6-34 MB) would otherwise be part of every job request.

Cost of the learner as a stage: a DirectRunner (or Dataflow) worker process
lives for one pipeline, so each round's Learn imports TensorFlow, builds the
learner and reloads the replay cache from the commit log.

Episodes and rounds: Beam worker processes do not survive a pipeline, so
actors rebuild their envs each round (seeded by round, see
:mod:`core.rollout`) and a training episode lasts at most
``actors.steps_per_task`` steps. Choose ``steps_per_task`` at least as long
as the episodes that matter (the in-memory runner keeps envs between rounds).

Reproducibility: a Beam run is a function of config + seed (rollouts seeded
by ``(seed, actor, round)``, the learner's sampler by ``(seed, 11, round)``,
TF op determinism on), but it is not yet the :mod:`pipelines.plan` schedule
that local and Dask run, so it is not bit-identical to them: a round is one
task per actor (a plan block is ``tasks_per_block`` of them, shard
``s<block>``), every round acts with the newest version (the plan: the
version after learner block ``b - 1 - policy_lag``, one per
``broadcast_period`` steps), actors restart each round (the plan carries env
state), the learner trains in 128-step calls with its own RNG stream (the
plan: ``steps_per_call``, ``sampler_rng(b)``), and evaluation seeds,
checkpoint cadence and the stop rule (``STOP_DELAY``) differ.

Example::

    summary = train_in_rounds(cfg, "gs://bucket/runs/a",
                              ["--runner", "DataflowRunner", "--project", "p", "--region", "us-central1",
                               "--temp_location", "gs://bucket/tmp", "--setup_file", "./setup.py"])
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam

from core import urls
from core.rollout import ActorSpec, RolloutResult, run_rollout_task
from core.stage_cpu import counted
from pipelines import policy_files, stages
from pipelines.beam_learner import LearnPlan


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
    learn: Optional[LearnPlan] = None        # None: rollouts + commit only (tests, benchmarks)

    @property
    def store_url(self) -> str:
        return urls.join(self.run_dir, "replay")

    def shard_id(self, group: int) -> str:
        """Deterministic: the same round and group always write the same shard."""
        return f"r{self.round:06d}-g{group:04d}"


def record_path(run_dir: str, round_index: int, kind: str = "") -> Tuple[Any, str]:
    fs, path = urls.resolve(run_dir)
    return fs, f"{path}/rounds/r{round_index:06d}{'-' + kind if kind else ''}.json"


def final_record_path(run_dir: str) -> Tuple[Any, str]:
    fs, path = urls.resolve(run_dir)
    return fs, f"{path}/rounds/final.json"


def _write_json(run_dir: str, round_index: int, kind: str, data: Dict[str, Any]) -> None:
    fs, path = record_path(run_dir, round_index, kind) if kind != "final" else final_record_path(run_dir)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        json.dump(data, f)


def read_record(run_dir: str, round_index: int, kind: str = "") -> Optional[Dict[str, Any]]:
    """A round's JSON record (kind "", "eval", "learn"; "final" ignores ``round_index``), or None."""
    fs, path = record_path(run_dir, round_index, kind) if kind != "final" else final_record_path(run_dir)
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------- stage functions (worker side)
def publish_round_policy(version: int, plan: RoundPlan) -> str:
    """The path of the round's policy; quantized by the learner stage only if not written yet."""
    if policy_files.exists(plan.run_dir, version):       # the usual case: no TensorFlow here
        return policy_files.payload_path(plan.run_dir, version)
    if plan.learn is None:
        raise FileNotFoundError(f"round {plan.round}: no policy v{version} under "
                                f"{urls.join(plan.run_dir, 'policies')} and no learner in the plan to publish it")
    from pipelines.beam_learner import stage_for
    return stage_for(plan.learn.cfg, plan.run_dir).publish(version)


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


def learn_round(record: Dict[str, Any], plan: RoundPlan, evaluations: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The round's learner block (:mod:`pipelines.beam_learner`); result -> rounds/r<round>-learn.json."""
    from pipelines.beam_learner import stage_for
    t0 = time.time()
    stage = stage_for(plan.learn.cfg, plan.run_dir)   # a fresh worker: imports TensorFlow, builds the learner
    setup_s = time.time() - t0
    result = stage.learn(plan.round, record, evaluations[0] if evaluations else None, plan.learn.started_at)
    result = {**result, "setup_s": setup_s}
    _write_json(plan.run_dir, plan.round, "learn", result)
    return result


def finish_run(_: int, run_dir: str, learn: LearnPlan, last_round: int) -> Dict[str, Any]:
    """The run's final evaluation (best parameters) after round ``last_round`` -> rounds/final.json."""
    from pipelines.beam_learner import stage_for
    result = {**stage_for(learn.cfg, run_dir).finish(), "round": last_round}
    _write_json(run_dir, -1, "final", result)
    return result


def finish_if_last(learned: Dict[str, Any], plan: RoundPlan) -> Optional[Dict[str, Any]]:
    """:func:`finish_run` right after the run's last learner block (fused with Learn: same process)."""
    if learned["stop"] or learned["loop"]["env_steps"] >= plan.learn.cfg.total_env_steps:
        return finish_run(0, plan.run_dir, plan.learn, plan.round)
    return None


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
    publish = counted(publish_round_policy, plan.cpu_sink) if plan.learn else publish_round_policy
    policy = beam.pvalue.AsSingleton(pipeline
                                     | "Policy" >> beam.Create([plan.policy_version])
                                     | "Publish" >> beam.Map(publish, plan))
    record = (pipeline
              | "CreateTasks" >> beam.Create(list(range(len(plan.actor_specs))))
              | "RollOut" >> RollOut(plan, policy)
              | "WriteShards" >> WriteShards(plan)
              | "CommitShards" >> CommitShards(plan))
    evaluations = None
    if plan.evaluate:
        evaluations = (pipeline
                       | "CreateEval" >> beam.Create([plan.round])
                       | "Evaluate" >> beam.Map(counted(evaluate_round, plan.cpu_sink), plan, policy))
    if plan.learn is not None:
        # After the commit; the evaluation decides the best version from the restored parameters.
        side = beam.pvalue.AsList(evaluations) if evaluations is not None else []
        (record
         | "Learn" >> beam.Map(counted(learn_round, plan.cpu_sink), plan, side)
         | "FinishIfLast" >> beam.Map(counted(finish_if_last, plan.cpu_sink), plan))


def build_finish(pipeline, run_dir: str, learn: LearnPlan, last_round: int, cpu_sink: str = "") -> None:
    """A pipeline of the final evaluation alone (a resumed run whose last round has no final record)."""
    (pipeline
     | "CreateFinal" >> beam.Create([0])
     | "Finish" >> beam.Map(counted(finish_run, cpu_sink), run_dir, learn, last_round))


# --------------------------------------------------------------------------- entry point
def train_in_rounds(cfg, run_dir: str, pipeline_args: Sequence[str], progress: bool = True,
                    resume: bool = False) -> Dict[str, Any]:
    """Train ``cfg`` as rounds of Beam pipelines into ``run_dir``; returns the summary (see driver)."""
    from pipelines.executors import _thread_env
    from pipelines.executors import beam as beam_executor
    from pipelines.round_launcher import RoundLauncher
    run_dir = urls.normalize(run_dir)
    options = beam_executor.pipeline_options(pipeline_args, run_dir)   # rejects bad runner/run dir first
    if beam_executor.is_local_runner(pipeline_args):
        import os
        for k, v in _thread_env(cfg).items():   # inherited by DirectRunner worker processes
            os.environ.setdefault(k, v)
    return RoundLauncher(cfg, run_dir, options, progress, resume).run()
