"""The Beam launcher: submits one round pipeline after another and reads their JSON records.

It holds no learner and imports neither TensorFlow nor LiteRT (the learner
is the rounds' ``Learn`` stage, :mod:`pipelines.beam_learner`), so it can
run anywhere that reaches the run directory and the runner::

    setup   : latest checkpoint's metadata -> loop counters, next round (or a new run's config.json)
    round r : plan (exploration, evaluation?) -> pipeline (pipelines.rounds.build_round)
              -> rounds/r<r>-learn.json: commit digest, evaluation, loop counters, learner steps
              -> metrics.jsonl (broadcast, commit, workers, eval, round), progress bar
    finish  : rounds/final.json (written by the last round's worker; else one Finish pipeline)
              -> summary.json

Example::

    RoundLauncher(cfg, "gs://bucket/runs/a", pipeline_options(args, run_dir), progress=True,
                  resume=False).run()      # usually through pipelines.rounds.train_in_rounds
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from core import config as config_lib
from core import urls
from core.rollout import ActorSpec
from pipelines import policy_files
from pipelines.beam_learner import LearnPlan
from pipelines.energy import stage_cpu_sink
from pipelines.rounds import RoundPlan, build_finish, build_round, read_record


def _actors_per_shard(cfg, spec) -> int:
    """Group actors so that a shard is about ``replay.shard_target_bytes`` (deterministic)."""
    obs_bytes = int(np.prod(spec.obs_shape or (1,))) * np.dtype(spec.obs_dtype).itemsize
    task_bytes = cfg.env.num_envs * cfg.actors.steps_per_task * (obs_bytes + 48)
    return int(min(cfg.actors.num_actors, max(1, cfg.replay.shard_target_bytes // max(task_bytes, 1))))


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
                                           cfg.env.max_episode_steps, cfg.threads.litert, self.builder.action_selector,
                                           frame_stack=getattr(cfg.agent, "frame_stack", 1))
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
                     builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes, True,
                     getattr(cfg.agent, "frame_stack", 1))
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
