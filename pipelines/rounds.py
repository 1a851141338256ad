"""Training as rounds: one Apache Beam pipeline per round (``--executor beam``).

Each round reads only durable state (the run directory) and leaves only
durable state behind, so a retried bundle, a re-run round or a restarted
launcher does no harm and nothing relies on the launcher's memory::

    policy stage  : restore latest checkpoint -> quantize -> payload v = round + 1   (launcher)
    round pipeline (Beam):
        CreateTasks     one element per actor
        Reshuffle       to prevent fusion: rollouts spread over workers
        RollOut         run_rollout_task(actor, payload side input, task_index=round)
        KeyByShard      actor -> shard group (deterministic)
        GroupShards     one group per shard id  r<round>-g<group>
        WriteShards     write_shard_stage: uncommitted zarr shard (a retry overwrites it)
        ToList          all shard infos of the round on one worker ...
        Commit          ... one commit-log entry (idempotent) + rounds/r<round>.json
      and, on evaluation rounds, in parallel:
        CreateEval -> Evaluate -> rounds/r<round>-eval.json
    learner stage : restore latest checkpoint, refresh the cache from the commit log,
                    train K = replay_ratio * committed_rows - learner_steps steps,
                    checkpoint (step = learner steps; loop counters + round in its metadata)  (launcher)

The learner runs in the launcher between pipelines, not as a Beam step:
it needs TensorFlow (seconds to import per worker process) and one
accelerator-sized process, and a round's pipeline would otherwise pay that
start-up every round. It is still a function of durable state only: the
checkpoint names the last finished round and the loop counters, so
``--resume`` (or a crash) restarts at the first unfinished round.

Episodes and rounds: Beam worker processes do not survive a pipeline, so
actors rebuild their envs each round (seeded by round, see
:mod:`core.rollout`) and a training episode lasts at most
``actors.steps_per_task`` steps. Choose ``steps_per_task`` at least as long
as the episodes that matter (the in-memory runner keeps envs between rounds).

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
from pipelines.energy import stage_cpu_sink
from pipelines import stages

_LEARN_CHUNK = 128   # learner steps per learner call (one TF dispatch, one sampler call)


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
    fs, path = record_path(run_dir, round_index, kind)
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------- stage functions (worker side)
def rollout_round_task(actor_id: int, plan: RoundPlan, payload) -> RolloutResult:
    """One actor's rollout task of the round (task index = round).

    Rounds start every actor afresh, so the result drops the actor's state
    (``next_state``): Beam pickles results between stages, and a snapshot
    nobody reads costs ~2 ms per task.
    """
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


def commit_round(infos: List[Dict[str, Any]], plan: RoundPlan) -> int:
    """The single committer: one idempotent commit entry, then the round record (JSON)."""
    from core.replay import ReplayStore
    infos = sorted(infos, key=lambda i: i["shard_id"])
    store = ReplayStore.open(plan.store_url)
    version = stages.commit_stage(store, [i["shard_id"] for i in infos],
                                  meta={"round": plan.round, "policy_version": plan.policy_version})
    tasks = [t for i in infos for t in i["tasks"]]
    _write_json(plan.run_dir, plan.round, "", {
        "round": plan.round, "log_version": version, "shards": [i["shard_id"] for i in infos],
        "rows": sum(i["rows"] for i in infos), "bytes": sum(i["nbytes"] for i in infos), "tasks": tasks})
    return version


def evaluate_round(_: int, plan: RoundPlan, payload) -> Dict[str, Any]:
    """Evaluate the round's payload (in parallel with its rollouts); result -> rounds/r<round>-eval.json."""
    result = stages.run_evaluation_task(payload, *plan.eval_args)
    _write_json(plan.run_dir, plan.round, "eval", result)
    return result


# --------------------------------------------------------------------------- transforms
class RollOut(beam.PTransform):
    """actor ids -> RolloutResults, spread over workers."""

    def __init__(self, plan: RoundPlan, payload):
        super().__init__()
        self.plan, self.payload = plan, payload

    def expand(self, actor_ids):
        return (actor_ids
                | "Reshuffle" >> beam.Reshuffle()   # to prevent fusion: one task per worker, not all on one
                | "StepEnvs" >> beam.Map(counted(rollout_round_task, self.plan.cpu_sink), self.plan, self.payload))


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


def build_round(pipeline, plan: RoundPlan, payload) -> None:
    """The round's pipeline, top to bottom."""
    policy = beam.pvalue.AsSingleton(pipeline | "Policy" >> beam.Create([payload]))
    (pipeline
     | "CreateTasks" >> beam.Create(list(range(len(plan.actor_specs))))
     | "RollOut" >> RollOut(plan, policy)
     | "WriteShards" >> WriteShards(plan)
     | "CommitShards" >> CommitShards(plan))
    if plan.evaluate:
        (pipeline
         | "CreateEval" >> beam.Create([plan.round])
         | "Evaluate" >> beam.Map(counted(evaluate_round, plan.cpu_sink), plan, policy))


# --------------------------------------------------------------------------- learner stage (launcher side)
class LearnerStage:
    """Learner, replay cache and checkpoints; every call starts from the latest checkpoint.

    The TF learner object and the cache are kept between rounds only to
    avoid rebuilding graphs: ``policy()`` and ``learn()`` first restore the
    latest complete checkpoint, and the cache is refreshed from the commit
    log, so a fresh process computes the same thing.
    """

    def __init__(self, cfg, run_dir: str):
        from core.agents.registry import get_builder
        from core.checkpoint import Checkpointer
        from core.envs import env_spec
        from core.replay import ReplayCache, ReplayStore
        self.cfg, self.run_dir = cfg, run_dir
        self.spec = env_spec(cfg.env.id)
        self.store = ReplayStore.open_or_create(urls.join(run_dir, "replay"), env_id=cfg.env.id,
                                                **cfg.replay.writer_options())
        self.ckpt = Checkpointer(urls.join(run_dir, "checkpoints"), keep_last=cfg.checkpoint.keep_last,
                                 keep_every=cfg.checkpoint.keep_every)
        self.best_ckpt = Checkpointer(urls.join(run_dir, "best"), keep_last=1)
        self.builder = get_builder(cfg.agent.algo)
        self.learner = self.builder.make_learner(self.spec, cfg.agent, cfg.seed)
        self.cache = ReplayCache(self.store, max_transitions=cfg.replay.capacity)
        self.sampler = self.builder.make_sampler(self.cache, cfg.agent)

    def latest(self) -> Optional[Dict[str, Any]]:
        """Metadata of the latest complete checkpoint (``round``, ``loop``), or None."""
        step = self.ckpt.latest_step()
        return None if step is None else self.ckpt.metadata(step)

    def restore_latest(self) -> Dict[str, Any]:
        step = self.ckpt.latest_step()
        state, meta = self.ckpt.restore(step)
        self.learner.restore(state["learner"])
        return meta

    def save(self, round_index: int, loop) -> None:
        self.ckpt.save(self.learner.steps, {"learner": self.learner.state()},
                       metadata={"round": round_index, "loop": json.dumps(dataclasses.asdict(loop)),
                                 "replay_log_version": int(self.store.latest_version()),
                                 "config": config_lib.to_json(self.cfg)})
        self.ckpt.wait()   # the next stage restores it: it must be committed

    def policy(self, version: int, quantizer):
        """Policy stage: the latest checkpoint's policy as payload ``version``."""
        self.restore_latest()
        return quantizer.quantize(self.learner.policy_model, version=version,
                                  calibration_obs=self.calibration_obs())

    def learn(self, round_index: int, loop) -> Tuple[int, Optional[Dict[str, float]]]:
        """Learner stage of ``round_index``: restore, train up to the replay ratio, checkpoint."""
        self.restore_latest()
        self.cache.refresh()
        committed = self.store.state().rows
        k = int(self.cfg.learner.replay_ratio * committed) - self.learner.steps
        metrics = None
        if self.cache.size >= self.cfg.replay.min_size and k > 0:
            rng = np.random.default_rng([self.cfg.seed, 11, round_index])   # a re-run round repeats itself
            for n in [_LEARN_CHUNK] * (k // _LEARN_CHUNK) + ([k % _LEARN_CHUNK] if k % _LEARN_CHUNK else []):
                metrics = stages.learn_stage(self.learner, self.sampler, n, self.cfg.agent.batch_size, rng)
        self.save(round_index, loop)
        return max(k, 0) if metrics else 0, metrics

    def calibration_obs(self) -> Optional[np.ndarray]:
        """Replay observations for int8-full calibration (reset observations before any replay)."""
        cfg = self.cfg
        if cfg.actors.precision != "int8-full":
            return None
        n = cfg.actors.calibration_size
        if self.cache.size >= n:
            obs = self.sampler.sample(n, np.random.default_rng([cfg.seed, 7]))["observation"]
        else:
            from core.envs import make_vector_env
            envs, obs = make_vector_env(cfg.env.id, n, cfg.seed + 999)
            envs.close()
        return obs.reshape(len(obs), -1).astype(np.float32)

    def close(self) -> None:
        self.ckpt.close()
        self.best_ckpt.close()


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
    """Runs rounds until the env-step budget or the eval target; see module docstring."""

    def __init__(self, cfg, run_dir: str, options, progress: bool, resume: bool):
        self.cfg, self.run_dir, self.options = cfg, run_dir, options
        self.progress, self.resume = progress, resume
        self.run_id = f"{cfg.name}-{cfg.seed}-{abs(hash(run_dir)) % 10**8}"

    def _setup(self) -> None:
        from core.metrics import MetricsLogger
        from core.quantize import PolicyQuantizer
        from pipelines.driver import LoopState, configure_threads
        cfg = self.cfg
        configure_threads(cfg)
        fs, path = urls.resolve(self.run_dir)
        fs.makedirs(path, exist_ok=True)
        self.learner = LearnerStage(cfg, self.run_dir)
        meta = self.learner.latest()
        if self.resume:
            if meta is None:
                raise FileNotFoundError(f"--resume: no complete checkpoint under {urls.join(self.run_dir, 'checkpoints')}")
            self.loop = LoopState(**json.loads(meta["loop"]))
            self.next_round = int(meta["round"]) + 1
        else:
            if meta is not None:
                raise config_lib.ConfigError(f"{self.run_dir} already holds a run; valid: --resume {self.run_dir},"
                                             " or a new --run-dir")
            with fs.open(f"{path}/config.json", "w") as f:
                f.write(config_lib.to_json(cfg))
            self.loop = LoopState(next_task=[0] * cfg.actors.num_actors)
            self.next_round = 0
            self.learner.save(-1, self.loop)     # round 0's policy stage restores this
        self.quantizer = PolicyQuantizer(cfg.actors.precision, patch=True)
        self.log = MetricsLogger(self.run_dir)
        self.log.write("config", step=self.loop.env_steps, config=config_lib.to_dict(cfg))
        builder = self.learner.builder
        self.actor_specs = tuple(ActorSpec(self.run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, a,
                                           cfg.env.max_episode_steps, cfg.threads.litert, builder.action_selector,
                                           frame_stack=getattr(cfg.agent, "frame_stack", 1))
                                 for a in range(cfg.actors.num_actors))
        self.per_shard = _actors_per_shard(cfg, self.learner.spec)

    def _plan(self, r: int, version: int, evaluate: bool) -> RoundPlan:
        cfg, builder = self.cfg, self.learner.builder
        steps = self.loop.env_steps
        explore = tuple(builder.exploration(cfg.agent, steps, a) for a in range(cfg.actors.num_actors))
        eval_args = (cfg.env.id, cfg.eval.episodes, cfg.seed + 100_000 + 1_000 * r, cfg.env.max_episode_steps,
                     builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes, True,
                     getattr(cfg.agent, "frame_stack", 1))
        return RoundPlan(self.run_dir, r, self.actor_specs, explore, cfg.actors.steps_per_task,
                         self.per_shard, version, evaluate, eval_args, tuple(cfg.replay.writer_options().items()),
                         stage_cpu_sink(self.energy))

    def run(self) -> Dict[str, Any]:
        from pipelines.executors import beam as beam_executor
        from pipelines.summary import WorkerStats
        self._setup()
        cfg = self.cfg
        from pipelines.energy import start_run_tracker
        self.energy = start_run_tracker(cfg, self.run_dir, None)   # launcher + DirectRunner worker processes
        start = time.time()
        round_steps = cfg.actors.num_actors * cfg.env.num_envs * cfg.actors.steps_per_task
        every = cfg.eval.every_env_steps
        next_eval = (self.loop.env_steps // every + 1) * every if self.loop.env_steps else every
        lags: List[Tuple[int, float]] = []
        workers = WorkerStats()
        recent: List[float] = []
        bar = self._progress_bar(round_steps)
        payload, stop = None, False
        while self.loop.env_steps < cfg.total_env_steps and not stop:
            r = self.next_round
            t0 = time.time()
            payload = self.learner.policy(r + 1, self.quantizer)           # policy stage
            self.loop.policy_version = payload.version
            self.log.write("broadcast", step=self.learner.learner.steps, version=payload.version,
                           payload_bytes=payload.nbytes, convert_seconds=payload.convert_seconds,
                           precision=payload.precision)
            evaluate = self.loop.env_steps >= next_eval or (
                self.loop.env_steps + round_steps >= cfg.total_env_steps and self.learner.learner.steps > 0)
            plan = self._plan(r, payload.version, evaluate)
            beam_executor.run_pipeline(lambda p: build_round(p, plan, payload), self.options)
            pipeline_s = time.time() - t0
            record = read_record(self.run_dir, r)
            if record is None:
                raise RuntimeError(f"round {r}: the pipeline finished but wrote no round record")
            # What the launcher receives of a round: its JSON record (metadata), never trajectories.
            self.driver_bytes_in = getattr(self, "driver_bytes_in", 0) + len(json.dumps(record))
            self.trajectory_bytes = getattr(self, "trajectory_bytes", 0) + int(record["bytes"])
            workers = WorkerStats()   # per round: Beam starts new worker processes each round
            returns = self._account(record, workers, recent)
            lags.append((0, pipeline_s))    # every rollout of a round acts with the newest version
            if evaluate:
                while next_eval <= self.loop.env_steps:
                    next_eval += every
                result = read_record(self.run_dir, r, "eval")
                self.driver_bytes_in += len(json.dumps(result))
                stop = self._on_evaluation(result, start)
            self.loop.shard_seq = r + 1
            t1 = time.time()
            k, m = self.learner.learn(r, self.loop)                       # learner stage (+ checkpoint)
            self.next_round = r + 1
            self.log.write("round", step=self.loop.env_steps, round=r, pipeline_s=pipeline_s,
                           learn_s=time.time() - t1, learner_steps=self.learner.learner.steps, trained=k,
                           loss=m["loss"] if m else None, episodes=len(returns),
                           mean_return=float(np.mean(returns)) if returns else None)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(self._postfix(start, recent, workers), refresh=False)
        if bar is not None:
            bar.close()
        return self._finish(start, lags, payload)

    def _account(self, record: Dict[str, Any], workers, recent: List[float]) -> List[float]:
        returns: List[float] = []
        for t in record["tasks"]:
            stats = _TaskStats(t["actor"], t["worker"], t["env_steps"], t["seconds"])
            workers.add(stats)
            returns += t["returns"]
            self.loop.env_steps += t["env_steps"]
        self.loop.episodes += len(returns)
        recent[:] = (recent + returns)[-20:]
        self.log.write("commit", step=self.loop.env_steps, log_version=record["log_version"],
                       shards=len(record["shards"]), rows=record["rows"], bytes=record["bytes"])
        self.log.write("workers", step=self.loop.env_steps, workers=workers.table())
        return returns

    def _on_evaluation(self, result: Optional[Dict[str, Any]], start: float) -> bool:
        """Log an evaluation and keep the best version's parameters; True = stop (target reached)."""
        from pipelines import summary as summary_lib
        cfg = self.cfg
        if result is None:
            return False
        summary_lib.log_evaluation(self.log, self.loop, result)
        score = summary_lib.evaluation_score(result)
        if score > self.loop.best_return:
            self.loop.best_return, self.loop.best_version = score, result["version"]
            # The learner still holds the evaluated version: it trains after this.
            self.learner.best_ckpt.save(result["version"], {"params": self.learner.learner.state()["params"]},
                                        metadata={"eval": json.dumps(result), "config": config_lib.to_json(cfg)})
        return summary_lib.record_target(cfg, self.loop, result)

    def _finish(self, start: float, lags, payload) -> Dict[str, Any]:
        from pipelines import summary as summary_lib
        cfg, stage = self.cfg, self.learner
        stage.restore_latest()
        if payload is None:   # resumed a finished run: nothing new was broadcast
            payload = stage.policy(self.loop.policy_version, self.quantizer)
        stage.best_ckpt.wait()
        summary_lib.restore_best(stage.best_ckpt, self.loop.best_version, stage.learner)
        wall = time.time() - start
        final = summary_lib.final_evaluation(cfg, stage.learner, stage.builder, self.run_dir,
                                             self.loop.policy_version, stage.calibration_obs())
        summary = summary_lib.build_summary(cfg, self.run_dir, self.loop, stage.learner.steps, wall,
                                            payload.nbytes, lags, final, stage.store.latest_version(),
                                            getattr(self, "driver_bytes_in", None),
                                            getattr(self, "trajectory_bytes", None))
        from pipelines.energy import stop_run_tracker
        summary.update(stop_run_tracker(self.energy))
        summary_lib.write_summary(self.run_dir, self.log, summary)
        stage.close()
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
                "learn": self.learner.learner.steps, "ret": f"{np.mean(recent):.0f}" if recent else "-",
                "best": f"{self.loop.best_return:.0f}" if self.loop.best_version >= 0 else "-",
                "v": self.loop.policy_version, "w(tasks/retries)": workers.postfix()}


@dataclasses.dataclass
class _TaskStats:
    """The fields of RolloutStats that WorkerStats reads, rebuilt from a round record."""
    actor_id: int
    worker: str
    env_steps: int
    seconds: float
