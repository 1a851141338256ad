"""The training driver: one loop that schedules stages on any executor.

The loop keeps ``num_actors`` rollout tasks in flight, aggregates their
results into replay shards, commits them, and trains the learner on
committed replay at a fixed replay ratio, broadcasting a new quantized policy
version every ``broadcast_period`` learner steps::

    while env_steps < total:
        finished rollouts -> stats, resubmit the actor with the latest policy ref
        pending rollouts big enough      -> write_shard task (deterministic id)
        finished shard writes            -> one commit entry -> learner cache refresh
        learner behind replay_ratio      -> learn_stage(steps_per_call)
        every broadcast_period steps     -> quantize (async) -> executor.broadcast
        every eval.every_env_steps       -> evaluation task; keep the best version
        every checkpoint.every_steps     -> async checkpoint (learner + loop state)

With the local executor every submit runs at once, in order, so a run is
deterministic for a seed. With Dask the same calls overlap: actors keep
stepping while the learner trains.

Actors are throttled when they run ahead of the learner (env steps beyond
``learner_steps / replay_ratio`` plus one round of slack), and the learner
waits for data when it is ahead, so the replay ratio holds on any machine.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time
from collections import deque
from typing import Any, Dict, List, Optional

import numpy as np

from core import config as config_lib
from core import urls
from core.metrics import MetricsLogger
from core.rollout import ActorSpec
from pipelines import stages
from pipelines import summary as summary_lib
from pipelines.summary import WorkerStats



def configure_threads(cfg) -> None:
    """Pin TensorFlow's thread pools before TF creates them (see core.config)."""
    import tensorflow as tf
    try:
        if cfg.threads.tf_intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(cfg.threads.tf_intra_op)
        if cfg.threads.tf_inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(cfg.threads.tf_inter_op)
    except RuntimeError:
        pass  # already initialized in this process (e.g. a second run in tests)


@dataclasses.dataclass
class LoopState:
    """Driver counters, checkpointed with the learner so --resume continues."""
    env_steps: int = 0
    next_task: List[int] = dataclasses.field(default_factory=list)
    shard_seq: int = 0
    policy_version: int = 0
    best_return: float = -float("inf")
    best_version: int = -1
    episodes: int = 0
    time_to_target_s: Optional[float] = None
    env_steps_to_target: Optional[int] = None


@dataclasses.dataclass
class _Flight:
    """Bookkeeping of one ``Trainer.run`` that is not checkpointed (rebuilt on resume)."""
    start: float
    steps_per_task: int
    committed_env_steps: int
    submitted_steps: int
    next_eval: int
    last_ckpt_step: int
    last_broadcast_step: int
    idle: List[int]
    in_flight: Dict[Any, int] = dataclasses.field(default_factory=dict)   # rollout future -> actor
    pending: List[Any] = dataclasses.field(default_factory=list)          # results not yet in a shard
    pending_rows: int = 0
    pending_bytes: int = 0
    writes: deque = dataclasses.field(default_factory=deque)   # (shard_id, future, results), in order
    evals: List[Any] = dataclasses.field(default_factory=list)
    recent_returns: deque = dataclasses.field(default_factory=lambda: deque(maxlen=20))
    lags: deque = dataclasses.field(default_factory=lambda: deque(maxlen=50))   # (versions, seconds)
    lag_logged: float = 0.0
    stop: bool = False

    @classmethod
    def begin(cls, trainer: "Trainer") -> "_Flight":
        cfg, loop = trainer.cfg, trainer.loop
        trainer.worker_stats = WorkerStats()   # per-worker tasks / retries / env steps/s (progress + metrics)
        every = cfg.eval.every_env_steps
        return cls(start=time.time(), steps_per_task=cfg.env.num_envs * cfg.actors.steps_per_task,
                   committed_env_steps=trainer.cache.size if trainer.resume else 0,
                   submitted_steps=loop.env_steps, next_eval=(loop.env_steps // every + 1) * every,
                   last_ckpt_step=trainer.learner.steps, last_broadcast_step=trainer.learner.steps,
                   idle=list(range(cfg.actors.num_actors)))


class Trainer:
    """One training run (see module docstring). ``run()`` returns the summary dict."""

    def __init__(self, cfg, run_dir: str, executor, progress: bool = True, resume: bool = False):
        self.cfg = cfg
        self.run_dir = urls.normalize(run_dir)
        self.executor = executor
        self.progress = progress
        self.resume = resume
        self.run_id = f"{cfg.name}-{cfg.seed}-{abs(hash(self.run_dir)) % 10**8}"

    # -- setup ---------------------------------------------------------------
    def _setup(self) -> None:
        from core.agents.registry import get_builder
        from core.checkpoint import Checkpointer
        from core.envs import env_spec
        from core.quantize import AsyncQuantizer, PolicyQuantizer
        from core.replay import ReplayCache, ReplayStore

        cfg = self.cfg
        fs, path = urls.resolve(self.run_dir)
        if not self.resume and fs.exists(f"{path}/config.json"):
            # A second run would reuse committed shard ids and overwrite the config: refuse, touch nothing.
            raise config_lib.ConfigError(f"{self.run_dir} already holds a run; valid: --resume {self.run_dir},"
                                         " or a new --run-dir")
        from pipelines.energy import start_run_tracker
        self.energy = start_run_tracker(cfg, self.run_dir, self.executor)   # whole run: setup .. final eval
        configure_threads(cfg)
        if getattr(self.executor, "deterministic", False):
            import tensorflow as tf
            tf.config.experimental.enable_op_determinism()
        fs.makedirs(path, exist_ok=True)
        with fs.open(f"{path}/config.json", "w") as f:
            f.write(config_lib.to_json(cfg))
        self.spec = env_spec(cfg.env.id)
        self.store_url = urls.join(self.run_dir, "replay")
        self.store = ReplayStore.open_or_create(self.store_url, env_id=cfg.env.id, **cfg.replay.writer_options())
        dask_engine = ({"engine": "dask", "dask_client": self.executor.client}
                       if cfg.checkpoint.engine == "dask" else {})    # validated: executor is dask
        self.ckpt = Checkpointer(urls.join(self.run_dir, "checkpoints"), keep_last=cfg.checkpoint.keep_last,
                                 keep_every=cfg.checkpoint.keep_every, **dask_engine)
        self.best_ckpt = Checkpointer(urls.join(self.run_dir, "best"), keep_last=1)
        self.builder = get_builder(cfg.agent.algo)
        self.learner = self.builder.make_learner(self.spec, cfg.agent, cfg.seed)
        self.cache = ReplayCache(self.store, max_transitions=cfg.replay.capacity)
        self.sampler = self.builder.make_sampler(self.cache, cfg.agent)
        self.quantizer = PolicyQuantizer(cfg.actors.precision, patch=True)
        self.async_quantizer = None
        if not getattr(self.executor, "deterministic", False):
            self.async_quantizer = AsyncQuantizer(self.learner.policy_model, cfg.actors.precision)
        self.rng = np.random.default_rng([cfg.seed, 7])
        self.version_time: Dict[int, float] = {}     # when each policy version was published
        self.version_params: Dict[int, Any] = {}     # learner params per version (best checkpoint)
        self.version_policy: Dict[int, Any] = {}     # policy-network weights per version (quality probe)
        self.n_evals = 0
        self.loop = LoopState(next_task=[0] * cfg.actors.num_actors)
        if self.resume:
            self._restore()
        self.log = MetricsLogger(self.run_dir)
        self.log.write("config", step=0, config=config_lib.to_dict(cfg))
        from core.quality import BroadcastQualityProbe
        self.quality = BroadcastQualityProbe(self.spec.discrete, size=256, seed=cfg.seed)
        self.actor_specs = [ActorSpec(self.run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, a,
                                      cfg.env.max_episode_steps, cfg.threads.litert, self.builder.action_selector)
                            for a in range(cfg.actors.num_actors)]

    def _restore(self) -> None:
        step = self.ckpt.latest_step()
        if step is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {urls.join(self.run_dir, 'checkpoints')}")
        state, meta = self.ckpt.restore(step)
        self.learner.restore(state["learner"])
        loop = json.loads(meta["loop"])
        self.loop = LoopState(**loop)
        # Shards committed after the checkpoint keep their ids: continue after them.
        committed = [s.shard_id if hasattr(s, "shard_id") else s.id for s in self.store.snapshot().shards]
        seqs = [int(s[1:]) for s in committed if s.startswith("s") and s[1:].isdigit()]
        self.loop.shard_seq = max([self.loop.shard_seq] + [q + 1 for q in seqs])
        if len(self.loop.next_task) < self.cfg.actors.num_actors:
            self.loop.next_task += [0] * (self.cfg.actors.num_actors - len(self.loop.next_task))
        self.cache.refresh()

    # -- policy versions ------------------------------------------------------
    def _calibration_obs(self) -> Optional[np.ndarray]:
        if self.cfg.actors.precision != "int8-full":
            return None
        n = self.cfg.actors.calibration_size
        if self.cache.size >= n:
            obs = self.sampler.sample(n, self.rng)["observation"]
        else:  # before any replay: observations from a short random-action rollout
            from core.envs import make_vector_env
            envs, o = make_vector_env(self.cfg.env.id, 8, self.cfg.seed + 999)
            rows = [o]
            while sum(len(r) for r in rows) < n:
                o, *_ = envs.step(envs.action_space.sample())
                rows.append(o)
            envs.close()
            obs = np.concatenate(rows)[:n]
        return obs.reshape(len(obs), -1).astype(np.float32)

    def _new_version(self, blocking: bool) -> None:
        """Quantize the learner's policy as the next version and broadcast it."""
        version = max(self.loop.policy_version, max(self.version_params, default=0)) + 1
        # Parameters only: the full state() also copies optimizer slots (3x more at ActorQ size).
        self.version_params[version] = (self.learner.params() if hasattr(self.learner, "params")
                                        else self.learner.state()["params"])
        self.version_policy[version] = [np.array(w) for w in self.learner.policy_model.get_weights()]
        calib = self._calibration_obs()
        if self.async_quantizer is not None and not blocking:
            self.async_quantizer.submit(self.learner.policy_model, version, calib)
            return
        payload = self.quantizer.quantize(self.learner.policy_model, version=version, calibration_obs=calib)
        self._publish(payload)

    def _publish(self, payload) -> None:
        self.payload = payload
        self.payload_ref = self.executor.broadcast(payload)
        self.loop.policy_version = payload.version
        self.version_time[payload.version] = time.time()
        # Keep the params of versions still being evaluated: a slow evaluation (dm_control) may end
        # after more than 8 newer versions, and its version must still be savable as the best one.
        keep = {self.loop.best_version} | getattr(self, "eval_versions", set())
        for v in [v for v in self.version_params if v < payload.version - 8 and v not in keep]:
            del self.version_params[v]
            self.version_policy.pop(v, None)
        self.log.write("broadcast", step=self.learner.steps, version=payload.version,
                       payload_bytes=payload.nbytes, convert_seconds=payload.convert_seconds,
                       precision=payload.precision)
        # Quality vs fp32 on a fixed replay probe batch, scored in the background (core.quality).
        self.quality.submit(payload, self.version_policy.get(payload.version), self.learner.policy_model,
                            self.sampler, self.cache)
        for q in self.quality.collect():
            self.log.write("broadcast_quality", step=self.learner.steps, **q)

    def _poll_async_version(self) -> None:
        if self.async_quantizer is None:
            return
        payload = self.async_quantizer.latest()
        if payload is not None and payload.version > self.loop.policy_version:
            self._publish(payload)

    # -- main loop --------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """Train until ``total_env_steps`` (or a confirmed target); returns the summary dict."""
        self._setup()
        self._new_version(blocking=True)
        f = _Flight.begin(self)
        bar = self._progress_bar()
        t_bar = time.time()
        while True:
            while f.idle and self._actors_may_run(f):           # 1. actors the learner can afford
                self._submit_actor(f, f.idle.pop(0))
            self._collect_rollouts(f, bar)                       # 2. finished rollouts
            self._log_policy_lag(f)
            ending = not f.in_flight and (f.stop or f.submitted_steps >= self.cfg.total_env_steps)
            self._maybe_write_shard(f, ending)                   # 3. aggregate into a shard
            self._commit_finished_writes(f)                      # 4. one log entry
            self._learn(f)                                       # 5. keep the replay ratio
            self._maybe_new_version(f)                           # 6. policy versions
            self._evaluate(f)                                    # 7. keep the best; stop at target
            if self.learner.steps - f.last_ckpt_step >= self.cfg.checkpoint.every_steps:
                f.last_ckpt_step = self.learner.steps            # 8. checkpoints
                self._checkpoint()
            if bar is not None and time.time() - t_bar > 0.5:   # 9. progress
                t_bar = time.time()
                bar.set_postfix(self._postfix(f.start, f.recent_returns, f.lags), refresh=False)
            if ending and not f.writes and not f.pending:
                if f.evals and not f.stop:   # the last evaluations decide the best version
                    self.executor.wait(f.evals, timeout=60)
                    continue
                break
        if bar is not None:
            bar.close()
        return self._close(f)

    def _close(self, f: "_Flight") -> Dict[str, Any]:
        for fut in f.evals:
            try:
                self._on_evaluation(fut.result(), f.start)
            except Exception:  # a final eval lost with the cluster does not fail the run
                pass
        for fut in f.in_flight:
            fut.cancel()
        self._checkpoint()
        self.ckpt.wait()
        summary = self._finish(f.start, f.lags)
        self._shutdown()
        return summary

    def _shutdown(self) -> None:
        """Close checkpointers (waiting for their writes), the quantizer thread and the metrics log."""
        self.ckpt.close()
        self.best_ckpt.close()
        if self.async_quantizer is not None:
            self.async_quantizer.close()
        self.log.close()

    def _submit_actor(self, f: "_Flight", a: int) -> None:
        cfg = self.cfg
        k = self.loop.next_task[a]
        self.loop.next_task[a] += 1
        explore = self.builder.exploration(cfg.agent, f.submitted_steps, a)
        fut = self.executor.submit(stages.run_rollout_task, self.actor_specs[a], self.payload_ref, k,
                                   cfg.actors.steps_per_task, explore, key=f"rollout-{self.run_id}-a{a}-t{k}",
                                   actor=a)
        f.in_flight[fut] = a
        f.submitted_steps += f.steps_per_task

    def _actors_may_run(self, f: "_Flight") -> bool:
        """Throttle: actors may run ahead of the learner by one round of tasks (plus min_size)."""
        cfg = self.cfg
        if f.stop or f.submitted_steps >= cfg.total_env_steps:
            return False
        if f.committed_env_steps < cfg.replay.min_size:
            return True
        allowed = self.learner.steps / cfg.learner.replay_ratio + f.steps_per_task * cfg.actors.num_actors
        return f.submitted_steps < allowed + cfg.replay.min_size

    def _collect_rollouts(self, f: "_Flight", bar) -> None:
        cfg = self.cfg
        can_learn = (self.cache.size >= cfg.replay.min_size and
                     self.learner.steps < cfg.learner.replay_ratio * f.committed_env_steps)
        for fut in self.executor.wait(list(f.in_flight), timeout=0 if can_learn else 0.05):
            a = f.in_flight.pop(fut)
            # Materialize the result now and drop the future: if its worker dies later, Dask
            # would otherwise *recompute* this stateful rollout on a rebuilt actor, and the
            # shard could mix two actor histories (duplicate episode rows). Retried in-flight
            # tasks are fine: their first completed result is the only one ever used.
            try:
                result = fut.result()
            except concurrent.futures.CancelledError:  # lost with a killed worker, forgotten by Dask:
                self.log.write("task_lost", step=self.loop.env_steps, task=f"rollout actor {a}")
                f.submitted_steps -= f.steps_per_task    # its steps never arrive: submit them again
                f.idle.append(a)                         # the actor's next task starts it afresh
                continue
            stats = result.stats
            self.loop.env_steps += stats.env_steps
            self.loop.episodes += len(stats.episode_returns)
            f.recent_returns.extend(stats.episode_returns)
            self.worker_stats.add(stats)
            f.lags.append((self.loop.policy_version - stats.policy_version,
                           time.time() - self.version_time.get(stats.policy_version, time.time())))
            f.pending.append(result)
            f.pending_rows += stats.env_steps
            f.pending_bytes += result.batch.nbytes
            f.idle.append(a)
            if bar is not None:
                bar.update(stats.env_steps)

    def _log_policy_lag(self, f: "_Flight") -> None:
        """Policy lag in versions and seconds, every 2 s."""
        if not f.lags or time.time() - f.lag_logged <= 2.0:
            return
        f.lag_logged = time.time()
        self.log.write("policy_lag", step=self.loop.env_steps, policy_version=self.loop.policy_version,
                       versions_mean=float(np.mean([l[0] for l in f.lags])),
                       versions_max=int(max(l[0] for l in f.lags)),
                       seconds_mean=float(np.mean([l[1] for l in f.lags])),
                       seconds_max=float(max(l[1] for l in f.lags)))

    def _maybe_write_shard(self, f: "_Flight", ending: bool) -> None:
        """Aggregate pending rollout results into one shard when big enough (or the run is ending)."""
        if not f.pending or not (f.pending_bytes >= self.cfg.replay.shard_target_bytes
                                 or f.pending_rows >= self._flush_rows() or ending):
            return
        shard_id = stages.shard_id_for(self.loop.shard_seq)
        self.loop.shard_seq += 1
        f.writes.append((shard_id, self._submit_write(shard_id, f.pending), f.pending))
        f.pending, f.pending_rows, f.pending_bytes = [], 0, 0

    def _submit_write(self, shard_id: str, results: List[Any]):
        return self.executor.submit(stages.write_shard_stage, self.store_url, shard_id, list(results),
                                    self.cfg.replay.writer_options(), key=f"write-{self.run_id}-{shard_id}")

    def _commit_finished_writes(self, f: "_Flight") -> None:
        """Commit finished shard writes, in submission order, in one log entry; refresh the cache."""
        cfg = self.cfg
        ready = []
        while f.writes and f.writes[0][1].done():
            shard_id, fut, results = f.writes[0]
            try:
                ready.append(fut.result())
            except concurrent.futures.CancelledError:  # lost with a killed worker, forgotten by Dask
                self.log.write("task_lost", step=self.loop.env_steps, task=f"write {shard_id}")
                f.writes[0] = (shard_id, self._submit_write(shard_id, results), results)  # same id: overwrites
                break
            f.writes.popleft()
        if not ready:
            return
        version = stages.commit_stage(self.store, [r["shard_id"] for r in ready],
                                      meta={"policy_version": self.loop.policy_version},
                                      retention_transitions=cfg.replay.retention_transitions)
        if version % 100 == 0:  # occasional GC keeps removed/abandoned shard data bounded
            self.log.write("gc", step=self.loop.env_steps, **stages.gc_stage(self.store, cfg.replay.gc_grace_s))
        self.cache.refresh()
        f.committed_env_steps += sum(r["rows"] for r in ready)
        self.log.write("commit", step=self.loop.env_steps, log_version=version, shards=len(ready),
                       rows=sum(r["rows"] for r in ready), bytes=sum(r["nbytes"] for r in ready))
        self.log.write("workers", step=self.loop.env_steps, workers=self.worker_stats.table())

    def _learn(self, f: "_Flight") -> None:
        """Up to ``steps_per_call`` learner steps while behind ``replay_ratio`` x committed env steps."""
        cfg = self.cfg
        if self.cache.size < cfg.replay.min_size:
            return
        budget = int(cfg.learner.replay_ratio * f.committed_env_steps) - self.learner.steps
        if budget <= 0:
            return
        n = min(budget, cfg.learner.steps_per_call)
        t0 = time.time()
        m = stages.learn_stage(self.learner, self.sampler, n, cfg.agent.batch_size, self.rng)
        if self.learner.steps % 500 < n:
            self.log.write("learner", step=self.learner.steps, loss=m["loss"], q_mean=m["q_mean"],
                           steps_per_s=n / max(time.time() - t0, 1e-9))

    def _maybe_new_version(self, f: "_Flight") -> None:
        self._poll_async_version()
        if self.learner.steps - f.last_broadcast_step >= self.cfg.actors.broadcast_period:
            f.last_broadcast_step = self.learner.steps
            self._new_version(blocking=False)

    def _evaluate(self, f: "_Flight") -> None:
        """Submit an evaluation task every ``eval.every_env_steps``; handle finished ones."""
        cfg = self.cfg
        if self.loop.env_steps >= f.next_eval and self.learner.steps > 0:
            f.next_eval += cfg.eval.every_env_steps
            self.n_evals += 1
            self.eval_versions = getattr(self, "eval_versions", set()) | {self.loop.policy_version}
            f.evals.append(self.executor.submit(
                stages.run_evaluation_task, self.payload_ref, cfg.env.id, cfg.eval.episodes,
                cfg.seed + 100_000 + 1_000 * self.n_evals, cfg.env.max_episode_steps,
                self.builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes,
                key=f"eval-{self.run_id}-{self.n_evals}"))
        for fut in [e for e in f.evals if e.done()]:
            f.evals.remove(fut)
            f.stop |= self._on_evaluation(fut.result(), f.start)

    def _flush_rows(self) -> int:
        # Freshness bound, deterministic (row-based, not time-based) so that the
        # local executor stays reproducible: small envs give small shards early on.
        if self.cfg.replay.shard_max_rows:
            return self.cfg.replay.shard_max_rows
        per_task = self.cfg.env.num_envs * self.cfg.actors.steps_per_task
        return max(per_task * self.cfg.actors.num_actors, 512)

    def _on_evaluation(self, result: Dict[str, Any], start: float) -> bool:
        """Log an evaluation, keep the best version's parameters; True = stop (target reached).

        Versions are ranked by the confirmed mean when there is one (see
        ``run_evaluation_task``), so the kept policy is the most trustworthy.
        """
        cfg = self.cfg
        score = summary_lib.evaluation_score(result)
        getattr(self, "eval_versions", set()).discard(result["version"])
        summary_lib.log_evaluation(self.log, self.loop, result)
        if score > self.loop.best_return:
            self.loop.best_return = score
            self.loop.best_version = result["version"]
            params = self.version_params.get(result["version"])
            if params is not None:
                self.best_ckpt.save(result["version"], {"params": params}, donate=True,   # never mutated
                                    metadata={"eval": json.dumps(result), "config": config_lib.to_json(cfg)})
        return summary_lib.record_target(cfg, self.loop, result)

    def _checkpoint(self) -> None:
        self.ckpt.save(self.learner.steps, {"learner": self.learner.state()}, donate=True,  # fresh host copies
                       metadata={"loop": json.dumps(dataclasses.asdict(self.loop)),
                                 "replay_log_version": int(self.store.latest_version()),
                                 "config": config_lib.to_json(self.cfg)})

    # -- end of run -------------------------------------------------------------
    def _finish(self, start: float, lags) -> Dict[str, Any]:
        """Evaluate the best (or final) policy at fp32 and at the actors' precision."""
        cfg = self.cfg
        self.best_ckpt.wait()
        summary_lib.restore_best(self.best_ckpt, self.loop.best_version, self.learner)
        wall = time.time() - start
        calib = self._calibration_obs() if cfg.actors.precision == "int8-full" else None
        final = summary_lib.final_evaluation(cfg, self.learner, self.builder, self.run_dir,
                                             self.loop.policy_version, calib)
        summary = summary_lib.build_summary(cfg, self.run_dir, self.loop, self.learner.steps, wall,
                                            self.payload.nbytes, lags, final, self.store.latest_version())
        for q in self.quality.collect(wait=True):
            self.log.write("broadcast_quality", step=self.learner.steps, **q)
        self.quality.close()
        from pipelines.energy import stop_run_tracker
        summary.update(stop_run_tracker(self.energy))
        summary_lib.write_summary(self.run_dir, self.log, summary)
        return summary

    def _progress_bar(self):
        if not self.progress:
            return None
        from tqdm.auto import tqdm
        return tqdm(total=self.cfg.total_env_steps, initial=self.loop.env_steps, unit="step",
                    desc=f"{self.cfg.name}", dynamic_ncols=True, mininterval=0.5)

    def _postfix(self, start: float, recent_returns, lags) -> Dict[str, Any]:
        el = max(time.time() - start, 1e-9)
        return {"sps": f"{self.loop.env_steps / el:.0f}", "learn": self.learner.steps,
                "ret": f"{np.mean(recent_returns):.0f}" if recent_returns else "-",
                "best": f"{self.loop.best_return:.0f}" if self.loop.best_version >= 0 else "-",
                "v": self.loop.policy_version, "lag": f"{np.mean([l[0] for l in lags]):.1f}" if lags else "-",
                **({"w(tasks/retries)": self.worker_stats.postfix()} if len(self.worker_stats) > 1 else {})}


def default_run_dir(cfg) -> str:
    return os.path.join("runs", cfg.name)
