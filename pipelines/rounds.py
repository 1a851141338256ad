"""Training as rounds: one Apache Beam pipeline per round (``--executor beam``).

Each round reads only durable state (the run directory) and leaves only
durable state behind, so a retried bundle, a re-run round or a restarted
launcher does no harm and nothing relies on the launcher's memory. The
learner is a stage of the round's pipeline (:mod:`pipelines.beam_learner`),
so the launcher only builds and submits pipelines and reads JSON records:
it imports neither TensorFlow nor LiteRT and needs no accelerator::

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
import math
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np

from core import config as config_lib
from core import urls
from core.rollout import ActorSpec, RolloutResult, run_rollout_task
from core.stage_cpu import counted
from pipelines import policy_files, stages
from pipelines.beam_learner import LearnPlan
from pipelines.energy import stage_cpu_sink


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


# --------------------------------------------------------------------------- the launcher
def _actors_per_shard(cfg, spec) -> int:
    """Group actors so that a shard is about ``replay.shard_target_bytes`` (deterministic)."""
    obs_bytes = int(np.prod(spec.obs_shape or (1,))) * np.dtype(spec.obs_dtype).itemsize
    task_bytes = cfg.env.num_envs * cfg.actors.steps_per_task * (obs_bytes + 48)
    return int(min(cfg.actors.num_actors, max(1, cfg.replay.shard_target_bytes // max(task_bytes, 1))))


def train_in_rounds(cfg, run_dir: str, pipeline_args: Sequence[str], progress: bool = True,
                    resume: bool = False) -> Dict[str, Any]:
    """Train ``cfg`` as rounds of Beam pipelines into ``run_dir``; returns the summary (see driver)."""
    from pipelines.executors import _thread_env
    from pipelines.executors import beam as beam_executor
    run_dir = urls.normalize(run_dir)
    options = beam_executor.pipeline_options(pipeline_args, run_dir)   # rejects bad runner/run dir first
    if beam_executor.is_local_runner(pipeline_args):
        import os
        for k, v in _thread_env(cfg).items():   # inherited by DirectRunner worker processes
            os.environ.setdefault(k, v)
    return RoundLauncher(cfg, run_dir, options, progress, resume).run()


class RoundLauncher:
    """Submits round pipelines until the env-step budget or the eval target; see module docstring.

    Holds no learner: everything it knows of a round is the round's JSON
    records (commit, evaluation, learn), and everything it needs to resume
    is the latest checkpoint's metadata (round, loop counters).
    """

    def __init__(self, cfg, run_dir: str, options, progress: bool, resume: bool):
        self.cfg, self.run_dir, self.options = cfg, run_dir, options
        self.progress, self.resume = progress, resume
        self.run_id = f"{cfg.name}-{cfg.seed}-{abs(hash(run_dir)) % 10**8}"
        self.driver_bytes_in = self.trajectory_bytes = 0

    def _setup(self) -> None:
        from core.agents.registry import get_builder
        from core.envs import env_spec
        from core.metrics import MetricsLogger
        from pipelines.driver import LoopState
        from pipelines.summary import process_start
        cfg = self.cfg
        fs, path = urls.resolve(self.run_dir)
        fs.makedirs(path, exist_ok=True)
        step, meta = self._latest_checkpoint()
        if self.resume:
            if meta is None:
                raise FileNotFoundError(f"--resume: no complete checkpoint under {urls.join(self.run_dir, 'checkpoints')}")
            self.loop = LoopState(**json.loads(meta["loop"]))
            self.next_round, self.learner_steps = int(meta["round"]) + 1, int(step)
        else:
            if meta is not None:
                raise config_lib.ConfigError(f"{self.run_dir} already holds a run; valid: --resume {self.run_dir},"
                                             " or a new --run-dir")
            with fs.open(f"{path}/config.json", "w") as f:
                f.write(config_lib.to_json(cfg))
            self.loop = LoopState(next_task=[0] * cfg.actors.num_actors)
            self.next_round, self.learner_steps = 0, 0   # round 0's Publish checkpoints the initial network
        self.learn_plan = LearnPlan(cfg, process_start())
        self.log = MetricsLogger(self.run_dir, tensorboard=False)   # TensorBoard would import TensorFlow
        self.log.write("config", step=self.loop.env_steps, config=config_lib.to_dict(cfg))
        self.log.write("placement", step=self.loop.env_steps, executor="beam",
                       learner="Beam stage Learn (a runner worker; rounds/r*-learn.json names it)",
                       actors={str(a): "Beam stage RollOut (runner workers)" for a in range(cfg.actors.num_actors)})
        self.builder = get_builder(cfg.agent.algo)   # the registry imports no TensorFlow
        self.actor_specs = tuple(ActorSpec(self.run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, a,
                                           cfg.env.max_episode_steps, cfg.threads.litert, self.builder.action_selector)
                                 for a in range(cfg.actors.num_actors))
        self.per_shard = _actors_per_shard(cfg, env_spec(cfg.env.id))

    def _latest_checkpoint(self) -> Tuple[Optional[int], Optional[Dict[str, Any]]]:
        """(step, metadata) of the latest complete checkpoint, or (None, None); zarr + JSON only."""
        from core.checkpoint import Checkpointer
        ckpt = Checkpointer(urls.join(self.run_dir, "checkpoints"))
        try:
            step = ckpt.latest_step()
            return step, (None if step is None else ckpt.metadata(step))
        finally:
            ckpt.close()

    def _plan(self, r: int, version: int, evaluate: bool) -> RoundPlan:
        cfg, builder = self.cfg, self.builder
        steps = self.loop.env_steps
        explore = tuple(builder.exploration(cfg.agent, steps, a) for a in range(cfg.actors.num_actors))
        eval_args = (cfg.env.id, cfg.eval.episodes, cfg.seed + 100_000 + 1_000 * r, cfg.env.max_episode_steps,
                     builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes)
        return RoundPlan(self.run_dir, r, self.actor_specs, explore, cfg.actors.steps_per_task,
                         self.per_shard, version, evaluate, eval_args, tuple(cfg.replay.writer_options().items()),
                         stage_cpu_sink(self.energy), self.learn_plan)

    def _read(self, r: int, kind: str = "") -> Dict[str, Any]:
        """A record the pipeline must have written; counted as bytes the launcher received."""
        record = read_record(self.run_dir, r, kind)
        if record is None:
            raise RuntimeError(f"round {r}: the pipeline finished but wrote no {kind or 'round'} record")
        # What the launcher receives of a round: JSON metadata, never trajectories.
        self.driver_bytes_in += len(json.dumps(record))
        return record

    def run(self) -> Dict[str, Any]:
        from pipelines.energy import start_run_tracker
        from pipelines.executors import beam as beam_executor
        from pipelines.summary import WorkerStats
        self._setup()
        cfg = self.cfg
        self.energy = start_run_tracker(cfg, self.run_dir, None)   # launcher + DirectRunner worker processes
        start = time.time()
        round_steps = cfg.actors.num_actors * cfg.env.num_envs * cfg.actors.steps_per_task
        every = cfg.eval.every_env_steps
        next_eval = (self.loop.env_steps // every + 1) * every if self.loop.env_steps else every
        lags: List[Tuple[int, float]] = []
        workers = WorkerStats()
        recent: List[float] = []
        bar = self._progress_bar(round_steps)
        stop = False
        while self.loop.env_steps < cfg.total_env_steps and not stop:
            r = self.next_round
            t0 = time.time()
            evaluate = self.loop.env_steps >= next_eval or (
                self.loop.env_steps + round_steps >= cfg.total_env_steps and self.learner_steps > 0)
            plan = self._plan(r, r + 1, evaluate)
            beam_executor.run_pipeline(lambda p: build_round(p, plan), self.options)
            pipeline_s = time.time() - t0
            self._log_broadcast(plan.policy_version)
            learned = self._read(r, "learn")     # the one record per round the launcher reads
            commit = learned["commit"]
            self.trajectory_bytes += int(commit["raw_bytes"])
            workers = WorkerStats()   # per round: Beam starts new worker processes each round
            self._account(commit, workers, recent, learned["loop"]["env_steps"])
            self.loop = type(self.loop)(**learned["loop"])    # the learner stage's counters (checkpointed)
            lags.append((0, pipeline_s))    # every rollout of a round acts with the newest version
            if evaluate:
                while next_eval <= self.loop.env_steps:
                    next_eval += every
                from pipelines import summary as summary_lib
                summary_lib.log_evaluation(self.log, self.loop, learned["evaluation"])
            stop = learned["stop"]
            self.next_round, self.learner_steps = r + 1, int(learned["learner_steps"])
            self.log.write("round", step=self.loop.env_steps, round=r, pipeline_s=pipeline_s,
                           learn_s=learned.get("learn_s"), learner_setup_s=learned.get("setup_s"),
                           learner_steps=self.learner_steps,
                           trained=learned.get("trained"), loss=learned.get("loss"), episodes=commit["episodes"],
                           mean_return=commit["return_sum"] / commit["episodes"] if commit["episodes"] else None,
                           learner_worker=learned.get("worker"))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(self._postfix(start, recent, workers), refresh=False)
        if bar is not None:
            bar.close()
        return self._finish(start, lags)

    def _log_broadcast(self, version: int) -> None:
        meta = policy_files.describe(self.run_dir, version) or {}
        self.log.write("broadcast", step=self.learner_steps, version=version, payload_bytes=meta.get("nbytes"),
                       convert_seconds=meta.get("convert_seconds"), precision=meta.get("precision"))

    def _account(self, commit: Dict[str, Any], workers, recent: List[float], env_steps: int) -> None:
        """Log a round's commit digest and worker stats (the loop counters are the learner stage's)."""
        for actor, worker, steps, seconds in commit["tasks"]:
            workers.add(_TaskStats(actor, worker, steps, seconds))
        recent[:] = (recent + commit["returns_tail"])[-20:]
        self.log.write("commit", step=env_steps, log_version=commit["log_version"],
                       shards=commit["shards"], rows=commit["rows"], bytes=commit["bytes"])
        self.log.write("workers", step=env_steps, workers=workers.table())

    def _finish(self, start: float, lags) -> Dict[str, Any]:
        """Final evaluation as a pipeline stage, then the summary from JSON records."""
        from core.replay import ReplayStore
        from pipelines import summary as summary_lib
        from pipelines.energy import stop_run_tracker
        from pipelines.executors import beam as beam_executor
        cfg = self.cfg
        wall = time.time() - start
        last = self.next_round - 1
        final = read_record(self.run_dir, -1, "final")
        if final is None or final.get("round") != last:   # not fused into the last round (e.g. a resume)
            beam_executor.run_pipeline(lambda p: build_finish(p, self.run_dir, self.learn_plan, last,
                                                              stage_cpu_sink(self.energy)), self.options)
        final = self._read(-1, "final")
        payload = policy_files.describe(self.run_dir, self.loop.policy_version) or {"nbytes": 0}
        log_version = ReplayStore.open(urls.join(self.run_dir, "replay")).latest_version()
        summary = summary_lib.build_summary(cfg, self.run_dir, self.loop, final["learner_steps"], wall,
                                            payload["nbytes"], lags, final["final"], log_version,
                                            self.driver_bytes_in, self.trajectory_bytes)
        summary.update(stop_run_tracker(self.energy))
        summary_lib.write_summary(self.run_dir, self.log, summary)
        self.log.close()
        return summary

    def _progress_bar(self, round_steps: int):
        if not self.progress:
            return None
        from tqdm.auto import tqdm
        left = max(self.cfg.total_env_steps - self.loop.env_steps, 0)
        return tqdm(total=self.next_round + math.ceil(left / round_steps), initial=self.next_round, unit="round",
                    desc=f"{self.cfg.name} (beam)", dynamic_ncols=True)

    def _postfix(self, start: float, recent: List[float], workers) -> Dict[str, Any]:
        el = max(time.time() - start, 1e-9)
        return {"steps": self.loop.env_steps, "sps": f"{self.loop.env_steps / el:.0f}",
                "learn": self.learner_steps, "ret": f"{np.mean(recent):.0f}" if recent else "-",
                "best": f"{self.loop.best_return:.0f}" if self.loop.best_version >= 0 else "-",
                "v": self.loop.policy_version, "w(tasks/retries)": workers.postfix()}


@dataclasses.dataclass
class _TaskStats:
    """The fields of RolloutStats that WorkerStats reads, rebuilt from a round record."""
    actor_id: int
    worker: str
    env_steps: int
    seconds: float
