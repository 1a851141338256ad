"""The training driver: runs a :class:`~pipelines.plan.TrainingPlan` on any executor.

The plan fixes what happens (which tasks, policy versions, shards, learner
steps and RNG streams; see :mod:`pipelines.plan`); the executor only decides
where and when. The loop::

    while learner blocks remain and no planned stop:
        blocks whose policy version exists -> rollout tasks (actor-chained) + one write task that
                                              takes their futures (data never visits the driver)
        next block's write done, learner done with the block before, its stop point decided
                                           -> commit shard s{block} (metadata only reaches the driver)
        learner block committed            -> learn_stage calls planned for the block (rng of the block)
        learner block done                 -> maybe a new version, an evaluation, a checkpoint
        nothing progressed for the stall bound -> StallError naming what it waits for

With the local executor every submit runs at once; with Dask actors step the
next ``actors.policy_lag`` blocks while the learner trains. Either way the
learner's parameters and the committed replay are the same for a seed.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pickle
import socket
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
from pipelines.flight import STALL_MIN_S, Flight, StallError  # noqa: F401  (StallError re-exported)
from pipelines.plan import TrainingPlan


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
    block: int = 0          # learner blocks done: the next one to train (pipelines.plan)


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
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()   # same seed, same parameters, on every executor
        fs.makedirs(path, exist_ok=True)
        if not self.resume:
            self._write_config(fs, path)
        self.spec = env_spec(cfg.env.id)
        self.store_url = urls.join(self.run_dir, "replay")
        if self.resume:   # a run's store exists from its first step: a lost one is an error, not a fresh start
            self.store = ReplayStore.open(self.store_url, **cfg.replay.writer_options())
        else:
            self.store = ReplayStore.open_or_create(self.store_url, env_id=cfg.env.id,
                                                    **cfg.replay.writer_options())
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
        self.plan = TrainingPlan.from_config(cfg)
        self.rng = self.plan.sampler_rng(0)           # replaced per learner block (pipelines.plan)
        self.precommitted: Dict[int, int] = {}        # resume: blocks committed after the checkpoint
        self.version_time: Dict[int, float] = {}     # when each policy version was published
        self.version_params: Dict[int, Any] = {}     # learner params per version (best checkpoint)
        self.version_policy: Dict[int, Any] = {}     # policy-network weights per version (quality probe)
        self.n_evals = 0
        self.loop = LoopState(next_task=[0] * cfg.actors.num_actors)
        if self.resume:
            self._restore()
            self._write_config(fs, path)     # only once the run restored: a failing resume writes nothing
        self.log = MetricsLogger(self.run_dir)
        self.log.write("config", step=0, config=config_lib.to_dict(cfg))
        from core.quality import BroadcastQualityProbe
        self.quality = BroadcastQualityProbe(self.spec.discrete, size=256, seed=cfg.seed)
        first_block = max([self.loop.block - 1, *self.precommitted]) + 1
        self.actor_specs = [ActorSpec(self.run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, a,
                                      cfg.env.max_episode_steps, cfg.threads.litert, self.builder.action_selector,
                                      first_task=first_block * self.plan.tasks_per_block)
                            for a in range(cfg.actors.num_actors)]
        self.log.write("placement", step=self.loop.env_steps, **self._placement())

    def _write_config(self, fs, path: str) -> None:
        """Write ``config.json`` (on resume only if ``--set``/``--config`` changed it)."""
        text = config_lib.to_json(self.cfg)
        if self.resume and fs.exists(f"{path}/config.json"):
            with fs.open(f"{path}/config.json", "r") as f:
                if f.read() == text:
                    return
        with fs.open(f"{path}/config.json", "w") as f:
            f.write(text)

    def _placement(self) -> Dict[str, Any]:
        """Where the learner and each actor run (the ``placement`` record of metrics.jsonl)."""
        where = getattr(self.executor, "placement", None)
        actors = where(self.cfg.actors.num_actors) if where else {}
        return {"learner": f"{socket.gethostname()} pid {os.getpid()} (driver process)",
                "actors": {str(a): w for a, w in actors.items()}, "executor": self.cfg.executor}

    def _restore(self) -> None:
        step = self.ckpt.latest_step()
        if step is None:
            raise FileNotFoundError(f"--resume: no complete checkpoint under {urls.join(self.run_dir, 'checkpoints')}")
        state, meta = self.ckpt.restore(step)
        self.learner.restore(state["learner"])
        loop = json.loads(meta["loop"])
        self.loop = LoopState(**loop)
        if "block" not in loop:     # a checkpoint from before plans: one shard per round of tasks
            self.loop.block = self.loop.shard_seq
        # Blocks committed after the checkpoint (a kill -9 between commit and checkpoint) are never
        # run again: their shards are in the log, the learner trains on them, actors start after them.
        infos = self.store.state().infos          # every shard ever committed, removed ones too
        blocks = {int(sid[1:]): info.rows for sid, info in infos.items() if sid.startswith("s") and sid[1:].isdigit()}
        self.precommitted = {b: r for b, r in blocks.items() if b >= self.loop.block}
        self.loop.shard_seq = max([self.loop.shard_seq, self.loop.block, *[b + 1 for b in blocks]])
        if len(self.loop.next_task) < self.cfg.actors.num_actors:
            self.loop.next_task += [0] * (self.cfg.actors.num_actors - len(self.loop.next_task))
        self.cache.refresh()

    # -- policy versions ------------------------------------------------------
    def _calibration_obs(self, version: int = 0) -> Optional[np.ndarray]:
        if self.cfg.actors.precision != "int8-full":
            return None
        n = self.cfg.actors.calibration_size
        if self.cache.size >= n:   # a stream of its own: calibration never shifts the sampler's
            obs = self.sampler.sample(n, self.plan.calibration_rng(version))["observation"]
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
        calib = self._calibration_obs(version)
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
        """Train through the plan's blocks (or to a planned stop); returns the summary dict."""
        self._setup()
        self._new_version(blocking=True)
        f = Flight.begin(self)
        bar = self._progress_bar()
        t_bar = time.time()
        while not (f.stop or self.loop.block >= f.plan.num_blocks):
            progressed = f.timed("submit", self._submit_blocks, f)        # 1. blocks whose version exists
            progressed |= f.timed("commit", self._commit_next, f, bar)   # 2. next shard, in block order
            progressed |= f.timed("learn", self._learn, f)               # 3. the block's planned learner calls
            self._log_policy_lag(f)
            if bar is not None and time.time() - t_bar > 0.5:
                t_bar = time.time()
                bar.set_postfix(self._postfix(f.start, f.recent_returns, f.lags), refresh=False)
            self._watch(f, progressed)                       # 4. never wait forever
        if bar is not None:
            bar.close()
        return self._close(f)

    def _close(self, f: Flight) -> Dict[str, Any]:
        for _, fut, steps in f.evals:    # the last evaluations still decide the best version, in order
            try:
                self._on_evaluation(self._materialize(f, fut), f.start, env_steps=steps)
            except Exception:  # a final eval lost with the cluster does not fail the run
                pass
        for fut in [*f.writes.values(), *(r for rs in f.rollouts.values() for r in rs)]:
            fut.cancel()       # planned past a stop: never committed (gc removes what they wrote)
        self.driver_bytes_in, self.trajectory_bytes = f.driver_bytes, f.trajectory_bytes
        self.log.write("schedule", step=self.loop.env_steps, blocks=self.loop.block, wall_s=time.time() - f.start,
                       idle_s={k: round(v, 3) for k, v in f.idle_s.items()},
                       busy_s={k: round(v, 3) for k, v in f.busy_s.items()}, task_retries=f.retries)
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

    def _materialize(self, f: Flight, fut) -> Any:
        """``fut.result()``, counting what the driver receives (``driver_bytes_in_per_env_step``)."""
        result = fut.result()
        f.driver_bytes += len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return result

    # -- 1. rollouts and shard writes -------------------------------------------------
    def _submit_blocks(self, f: Flight) -> bool:
        """Submit every block whose policy version is published: its rollouts and its write task."""
        submitted = False
        while f.next_submit < f.plan.num_blocks and not f.stop:
            b = f.next_submit
            version = f.version_for(b)
            if version is None:
                break
            f.block_ref[b] = version
            f.rollouts[b] = [self._submit_rollout(f, a, k, b) for a, k in f.plan.tasks(b)]
            f.writes[b] = self._submit_write(b, f.rollouts[b])
            f.next_submit += 1
            submitted = True
        return submitted

    def _submit_rollout(self, f: Flight, a: int, k: int, block: int, retry: int = 0):
        # Exploration follows the plan's env steps (block start), not the steps that happen to be done.
        explore = self.builder.exploration(self.cfg.agent, block * f.plan.block_rows, a)
        after = {} if retry else {"after": f.last_task.get(a)}   # an actor's tasks run in order
        fut = self.executor.submit(stages.run_rollout_task, self.actor_specs[a], f.block_ref[block][0], k,
                                   self.cfg.actors.steps_per_task, explore, **after,
                                   key=f"rollout-{self.run_id}-a{a}-t{k}" + (f"-r{retry}" if retry else ""),
                                   actor=a)
        if not retry:
            f.last_task[a] = fut
        self.loop.next_task[a] = k + 1
        return fut

    def _submit_write(self, block: int, rollouts: List[Any], retry: int = 0):
        # The rollout futures themselves are the arguments: trajectories go worker -> writer.
        shard_id = stages.shard_id_for(block)
        return self.executor.submit(stages.write_shard_stage, self.store_url, shard_id, list(rollouts),
                                    self.cfg.replay.writer_options(),
                                    key=f"write-{self.run_id}-{shard_id}" + (f"-r{retry}" if retry else ""))

    def _resubmit_lost(self, f: Flight, block: int) -> None:
        """A write Dask cancelled (its inputs were lost with a worker and forgotten): run them again."""
        f.retries += 1
        for i, (a, k) in enumerate(f.plan.tasks(block)):
            if f.rollouts[block][i].cancelled():
                self.log.write("task_lost", step=self.loop.env_steps, task=f"rollout actor {a} task {k}")
                f.rollouts[block][i] = self._submit_rollout(f, a, k, block, retry=f.retries)
        self.log.write("task_lost", step=self.loop.env_steps, task=f"write {stages.shard_id_for(block)}")
        f.writes[block] = self._submit_write(block, f.rollouts[block], retry=f.retries)

    # -- 2. commits -------------------------------------------------------------------
    def _commit_next(self, f: Flight, bar) -> bool:
        """Commit block ``next_commit`` once the learner finished the block before and its stop is decided."""
        c = f.next_commit
        if c >= f.plan.num_blocks or self.loop.block < c or f.stop:
            return False
        if c in f.precommitted:                     # resume: committed before the restart
            self._committed(f, c, f.precommitted.pop(c), {}, bar)
            return True
        fut = f.writes.get(c)
        if fut is None or not fut.done() or not self._stop_decided(f, c) or f.stop:
            return f.stop
        try:
            info = self._materialize(f, fut)
        except concurrent.futures.CancelledError:
            self._resubmit_lost(f, c)
            return True
        log_version = f.timed("log_commit", stages.commit_stage, self.store, [info["shard_id"]],
                              meta={"policy_version": f.block_ref[c][1], "block": c},
                              retention_transitions=self.cfg.replay.retention_transitions)
        if log_version % 100 == 0:  # occasional GC keeps removed/abandoned shard data bounded
            self.log.write("gc", step=self.loop.env_steps,
                           **stages.gc_stage(self.store, self.cfg.replay.gc_grace_s))
        f.trajectory_bytes += info.get("raw_bytes", 0)
        self.log.write("commit", step=self.loop.env_steps + info["rows"], log_version=log_version, shards=1,
                       rows=info["rows"], bytes=info["nbytes"], block=c, write_s=info.get("write_s"))
        self._committed(f, c, info["rows"], info, bar)
        f.writes.pop(c)
        f.rollouts.pop(c)
        f.block_ref.pop(c)
        return True

    def _committed(self, f: Flight, c: int, rows: int, info: Dict[str, Any], bar) -> None:
        """Account block ``c``'s rows and task stats (``write_shard_stage``'s metadata); plan its learner calls."""
        import types
        f.timed("cache_refresh", self.cache.refresh)
        self.loop.env_steps += rows
        self.loop.shard_seq = c + 1
        self.loop.episodes += info.get("episodes", 0)
        f.recent_returns.extend(info.get("returns_tail", []))
        for actor, task, worker, seconds, steps, version in info.get("tasks", []):
            f.slowest_task_s = max(f.slowest_task_s, seconds)
            self.worker_stats.add(types.SimpleNamespace(actor_id=actor, worker=worker, seconds=seconds,
                                                        env_steps=steps))
            f.lags.append((self.loop.policy_version - version,
                           time.time() - self.version_time.get(version, time.time())))
        if info.get("tasks"):
            self.log.write("workers", step=self.loop.env_steps, workers=self.worker_stats.table())
        f.calls = deque(f.plan.calls(self.learner.steps, f.plan.learner_target(self.loop.env_steps)))
        self.rng = f.plan.sampler_rng(c)
        f.next_commit = c + 1
        if bar is not None:
            bar.update(rows)

    def _stop_decided(self, f: Flight, c: int) -> bool:
        """Handle, in order, the evaluations block ``c`` waits for; False while one is running."""
        while f.evals and f.evals[0][0] <= f.plan.decides_stop_before(c):
            _, fut, steps = f.evals[0]
            if not fut.done():
                return False
            f.evals.popleft()
            f.slowest_task_s = max(f.slowest_task_s, time.time() - f.eval_submitted.pop(fut, time.time()))
            f.stop |= self._on_evaluation(self._materialize(f, fut), f.start, env_steps=steps)
        return True

    # -- 3. learner blocks --------------------------------------------------------------
    def _learn(self, f: Flight) -> bool:
        """One planned learner call of the current block, or the block's end."""
        b = self.loop.block
        if f.next_commit <= b or f.stop:
            return False
        if not f.calls:
            f.timed("end_block", self._end_block, f, b)
            return True
        if self.cache.size < self.cfg.replay.min_size:   # would wait forever: say why instead
            raise StallError(
                f"learner block {b} needs {self.cfg.replay.min_size} replay rows but the cache holds "
                f"{self.cache.size} (replay.capacity={self.cfg.replay.capacity}, shards skipped: "
                f"{len(self.cache.skipped)}); valid: replay.capacity >= replay.min_size and readable shards")
        n = f.calls.popleft()
        t0 = time.time()
        m = f.timed("learn_stage", stages.learn_stage, self.learner, self.sampler, n, self.cfg.agent.batch_size,
                    self.rng)
        if self.learner.steps % 500 < n:
            self.log.write("learner", step=self.learner.steps, loss=m["loss"], q_mean=m["q_mean"],
                           steps_per_s=n / max(time.time() - t0, 1e-9))
        return True

    def _end_block(self, f: Flight, b: int) -> None:
        """After learner block ``b``: the planned version, evaluation and checkpoint."""
        cfg = self.cfg
        if self.learner.steps - f.last_broadcast_step >= cfg.actors.broadcast_period:
            f.last_broadcast_step = self.learner.steps
            f.timed("new_version", self._new_version, True)
        f.versions[b] = (self.payload_ref, self.loop.policy_version)
        for old in [v for v in f.versions if v < f.plan.policy_block(f.next_submit)]:
            del f.versions[old]      # no block left to submit acts with it
        if self.loop.env_steps >= f.next_eval and self.learner.steps > 0:
            f.next_eval = (self.loop.env_steps // cfg.eval.every_env_steps + 1) * cfg.eval.every_env_steps
            f.evals.append((b, self._submit_evaluation(), self.loop.env_steps))
            f.eval_submitted[f.evals[-1][1]] = time.time()   # an evaluation's seconds count in the stall bound
        self.loop.block = b + 1
        if self.learner.steps - f.last_ckpt_step >= cfg.checkpoint.every_steps:
            f.last_ckpt_step = self.learner.steps
            f.timed("checkpoint", self._checkpoint)

    def _submit_evaluation(self):
        cfg = self.cfg
        self.n_evals += 1
        self.eval_versions = getattr(self, "eval_versions", set()) | {self.loop.policy_version}
        return self.executor.submit(
            stages.run_evaluation_task, self.payload_ref, cfg.env.id, cfg.eval.episodes,
            cfg.seed + 100_000 + 1_000 * self.n_evals, cfg.env.max_episode_steps,
            self.builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes,
            keep_returns=False, key=f"eval-{self.run_id}-{self.n_evals}")

    # -- 4. stalls ---------------------------------------------------------------------
    def _watch(self, f: Flight, progressed: bool) -> None:
        """Wait for the next thing the plan needs; a StallError after the stall bound without progress."""
        now = time.time()
        if progressed:
            f.last_progress = now
            return
        waiting = f.waiting_for()
        pending = [fut for _, fut in waiting if fut is not None and not fut.done()]
        if pending:
            self.executor.wait(pending, timeout=0.05)
        else:
            time.sleep(0.002)
        f.idle_s[waiting[0][0].split(" ")[0] if waiting else "other"] += time.time() - now
        bound = self.cfg.actors.stall_timeout_s or max(STALL_MIN_S, 10 * f.slowest_task_s)
        if time.time() - f.last_progress > bound:
            what = ", ".join(name for name, _ in waiting) or "nothing (a bug)"
            raise StallError(f"training made no progress for {bound:.0f} s; waiting for {what} "
                             f"(learner block {self.loop.block}, committed blocks {f.next_commit}); "
                             f"valid: a cluster that runs these tasks, or a larger actors.stall_timeout_s")

    def _log_policy_lag(self, f: Flight) -> None:
        """Policy lag in versions and seconds, every 2 s."""
        if not f.lags or time.time() - getattr(self, "_lag_logged", 0.0) <= 2.0:
            return
        self._lag_logged = time.time()
        self.log.write("policy_lag", step=self.loop.env_steps, policy_version=self.loop.policy_version,
                       versions_mean=float(np.mean([l[0] for l in f.lags])),
                       versions_max=int(max(l[0] for l in f.lags)),
                       seconds_mean=float(np.mean([l[1] for l in f.lags])),
                       seconds_max=float(max(l[1] for l in f.lags)))

    def _flush_rows(self) -> int:
        # Freshness bound, deterministic (row-based, not time-based) so that the
        # local executor stays reproducible: small envs give small shards early on.
        if self.cfg.replay.shard_max_rows:
            return self.cfg.replay.shard_max_rows
        per_task = self.cfg.env.num_envs * self.cfg.actors.steps_per_task
        return max(per_task * self.cfg.actors.num_actors, 512)

    def _on_evaluation(self, result: Dict[str, Any], start: float, env_steps: Optional[int] = None) -> bool:
        """Log an evaluation, keep the best version's parameters; True = stop (target reached).

        Versions are ranked by the confirmed mean when there is one (see
        ``run_evaluation_task``), so the kept policy is the most trustworthy.
        ``env_steps``: the committed env steps the evaluation was planned at.
        """
        cfg = self.cfg
        if env_steps is not None:
            result = {**result, "env_steps": int(env_steps)}
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
        calib = self._calibration_obs(self.loop.policy_version) if cfg.actors.precision == "int8-full" else None
        final = summary_lib.final_evaluation(cfg, self.learner, self.builder, self.run_dir,
                                             self.loop.policy_version, calib)
        summary = summary_lib.build_summary(cfg, self.run_dir, self.loop, self.learner.steps, wall,
                                            self.payload.nbytes, lags, final, self.store.latest_version(),
                                            getattr(self, "driver_bytes_in", None),
                                            getattr(self, "trajectory_bytes", None))
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
