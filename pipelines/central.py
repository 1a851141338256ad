"""Central (SEED) mode training: ``inference: central``.

The learner process hosts an :class:`core.inference.server.InferenceServer`;
env-only actors (:func:`core.inference.client.run_env_actor_task`) run as
long-lived tasks (local: spawned processes; Dask: one task per actor, pinned to
a worker) and stream observations to it. Nothing is broadcast to actors: a
new policy version is swapped into the server's LiteRT interpreter. The loop::

    while env_steps < total and not solved:
        server.drain()                    -> unrolls (TrajectoryBatch [T, E]) built server-side
        enough rows                       -> ReplayStore.write_shard + commit (the commit log)
        learner behind replay_ratio       -> learn_stage(steps_per_call)
        server.set_step_budget(...)       -> actors wait when they run ahead of the learner
        every broadcast_period steps      -> quantize (async) -> server.set_policy
        every eval.every_env_steps        -> evaluation (background thread), keep the best version
        every checkpoint.every_steps      -> async checkpoint

Everything else (setup, versions, evaluation bookkeeping, checkpoints, the
final fp32/int8 evaluation and summary) is the driver's
(:class:`pipelines.driver.Trainer`), reused unchanged.

Addresses (:mod:`core.inference.endpoint`): a unix-domain socket in a private
0700 directory for the local executor, TCP on ``127.0.0.1`` (an ephemeral
port) for a Dask LocalCluster, and the interface that routes to the scheduler
when joining a remote Dask cluster (``inference_server.bind_host`` overrides;
never a wildcard by default). Every actor is handed a
:class:`~core.inference.endpoint.ServerEndpoint` with the address it can
dial, the run's secret token and, with ``inference_server.tls_cert``, the
certificate to trust.
"""
from __future__ import annotations

import concurrent.futures
import functools
import time
from collections import deque
from typing import Any, Dict, List

import numpy as np

from core.evaluation import run_evaluation_task
from pipelines import stages
from pipelines.driver import Trainer


def server_listen_plan(cfg):
    """Where this run's inference server listens and what actors dial (see module docstring)."""
    from core.config import ConfigError
    from core.inference.endpoint import EndpointError, listen_plan
    try:
        return listen_plan(cfg.executor, cfg.dask.address, cfg.inference_server.bind_host)
    except EndpointError as e:
        raise ConfigError(str(e)) from None


def server_tls(cfg):
    """``(cert chain, key)`` PEM bytes from ``inference_server.tls_cert/tls_key``, or None."""
    from core.config import ConfigError
    from core.inference.endpoint import EndpointError, load_tls
    try:
        return load_tls(cfg.inference_server.tls_cert, cfg.inference_server.tls_key)
    except EndpointError as e:      # checked at config time; a file removed since is still one line
        raise ConfigError(str(e)) from None


class _ProcessFuture:
    """A spawned env-only actor process, with the executor-future calls the loop uses."""

    def __init__(self, target, args):
        import multiprocessing
        self.process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
        self.process.start()

    def done(self) -> bool:
        return not self.process.is_alive()

    def result(self, timeout: float | None = None):
        self.process.join(timeout)
        return {"exitcode": self.process.exitcode}

    def cancel(self) -> None:
        if self.process.is_alive():
            self.process.terminate()


def _actor_process(endpoint, spec) -> None:
    from core.inference.client import run_env_actor_task
    run_env_actor_task(endpoint, spec)


class CentralTrainer(Trainer):
    """One SEED-mode training run; ``run()`` returns the same summary as :class:`Trainer`."""

    def _setup(self) -> None:
        super()._setup()
        torso = getattr(self.cfg.agent, "torso", "mlp")
        if isinstance(torso, str) and torso != "mlp":    # r2d2's torso is a list of Dense widths
            # Flatbuffer weight patching handles Dense-only policies; conv torsos are converted each version.
            from core.quantize import AsyncQuantizer, PolicyQuantizer
            self.quantizer = PolicyQuantizer(self.cfg.actors.precision, patch=False)
            if self.async_quantizer is not None:
                self.async_quantizer.close()
                self.async_quantizer = AsyncQuantizer(self.learner.policy_model, self.cfg.actors.precision,
                                                      patch=False)

    def _publish(self, payload) -> None:
        super()._publish(payload)
        server = getattr(self, "server", None)
        if server is not None:
            server.set_policy(payload)

    def _exploration(self):
        """Each actor's selector parameters at the current env step (R2D2: its rung of the ladder)."""
        return functools.partial(self.builder.exploration, self.cfg.agent, self.loop.env_steps)

    def _start_actors(self) -> List[Any]:
        from core.inference.client import run_env_actor_task
        if self.cfg.executor == "local":
            return [_ProcessFuture(_actor_process, (self.endpoint, spec)) for spec in self.actor_specs]
        return [self.executor.submit(run_env_actor_task, self.endpoint, spec,
                                     key=f"env-actor-{self.run_id}-a{spec.actor_id}", actor=spec.actor_id)
                for spec in self.actor_specs]

    def run(self) -> Dict[str, Any]:
        self._setup()
        self._new_version(blocking=True)
        plan = server_listen_plan(self.cfg)
        try:
            try:
                self.server = self._start_server(plan)
            except BaseException:
                self._shutdown()    # checkpointer, quantizer threads and the metrics log
                raise
            return self._serve()
        finally:
            plan.cleanup()          # the private socket directory goes with the run

    def _start_server(self, plan):
        """The inference server on ``plan.bind``; actors get ``self.endpoint`` (address, token, TLS root)."""
        from core.inference.endpoint import new_token
        from core.inference.server import InferenceServer
        cfg = self.cfg
        server = InferenceServer(
            plan.bind, self.payload, self.spec, unroll_length=cfg.actors.steps_per_task,
            selector=self.builder.action_selector, explore=self._exploration(),
            max_batch_size=max(cfg.env.num_envs * cfg.actors.num_actors, 1), max_wait_s=0.002,
            frame_stack=getattr(cfg.agent, "frame_stack", 1), litert_threads=cfg.threads.litert,
            first_connection=self.loop.shard_seq << 8, seed=cfg.seed, token=new_token(),
            tls=server_tls(cfg))
        try:
            server.start()
        except OSError as e:   # e.g. inference_server.bind_host names no interface of this host
            from core.config import ConfigError
            raise ConfigError(f"{e}; valid: inference_server.bind_host = an address of this host, "
                              f"or null for the default") from None
        self.endpoint = server.endpoint(plan.dial_address(server.port))
        return server

    def _serve(self) -> Dict[str, Any]:
        evaluator = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="central-eval")
        start = time.time()
        actors = self._start_actors()
        try:
            return self._loop(start, evaluator)
        finally:
            self.server.request_stop()
            for fut in actors:
                try:
                    fut.result(timeout=10)
                except Exception:  # an actor lost with its worker does not fail the finished run
                    pass
                if not fut.done():  # never leave an actor behind to retry a server that is going away
                    fut.cancel()
            self.server.stop()
            evaluator.shutdown(wait=True)

    def _loop(self, start: float, evaluator) -> Dict[str, Any]:
        cfg = self.cfg
        pending: List[Any] = []
        pending_rows = 0
        committed = 0
        evals: List[Any] = []
        recent_returns: deque = deque(maxlen=20)
        next_eval = (self.loop.env_steps // cfg.eval.every_env_steps + 1) * cfg.eval.every_env_steps
        last_ckpt_step = last_broadcast_step = self.learner.steps
        slack = cfg.env.num_envs * cfg.actors.steps_per_task * cfg.actors.num_actors
        # Actors may run this far ahead of learner_steps / replay_ratio. Committed rows trail the
        # allowed env steps by at most one unfinished unroll per actor (slack) plus one unflushed
        # shard, so allowing min_size on top of both means the learner always gets its next rows.
        head = slack + self._flush_rows() + cfg.replay.min_size
        stop = False
        bar = self._progress_bar()
        t_log = time.time()
        while True:
            busy = False
            # 1. unrolls assembled by the server.
            for batch in self.server.drain():
                pending.append(batch)
                pending_rows += batch.size
                self.loop.env_steps += batch.size
                if bar is not None:
                    bar.update(batch.size)
            for ret, _ in self.server.pop_episodes():
                recent_returns.append(ret)
                self.loop.episodes += 1
            ending = stop or self.loop.env_steps >= cfg.total_env_steps
            # 2. shard + commit (the commit log makes them visible to the learner).
            if pending and (pending_rows >= self._flush_rows() or ending):
                shard_id = stages.shard_id_for(self.loop.shard_seq)
                self.loop.shard_seq += 1
                info = stages.write_shard_stage(self.store_url, shard_id, [_Result(b) for b in pending],
                                                cfg.replay.writer_options())
                version = stages.commit_stage(self.store, [shard_id], meta={"policy_version": self.loop.policy_version})
                self.cache.refresh()
                committed += info["rows"]
                self.log.write("commit", step=self.loop.env_steps, log_version=version, shards=1,
                               rows=info["rows"], bytes=info["nbytes"])
                pending, pending_rows, busy = [], 0, True
            # 3. learn while behind the replay ratio; throttle actors that run ahead.
            if self.cache.size >= cfg.replay.min_size:
                budget = int(cfg.learner.replay_ratio * committed) - self.learner.steps
                if budget > 0:
                    n = min(budget, cfg.learner.steps_per_call)
                    m = stages.learn_stage(self.learner, self.sampler, n, cfg.agent.batch_size, self.rng)
                    busy = True
                    if self.learner.steps % 100 < n:
                        self.log.write("learner", step=self.learner.steps, loss=m["loss"], q_mean=m["q_mean"])
            # Always bounded, also before the first learner step: a slow first step (R2D2 traces a
            # 40-step unroll for seconds) must not let actors run through the whole budget meanwhile.
            self.server.set_step_budget(int(self.learner.steps / cfg.learner.replay_ratio) + head)
            # 4. policy versions go to the server, not to actors; so do exploration parameters.
            self.server.explore = self._exploration()
            self._poll_async_version()
            if self.learner.steps - last_broadcast_step >= cfg.actors.broadcast_period:
                last_broadcast_step = self.learner.steps
                self._new_version(blocking=False)
            # 5. evaluation in a background thread (actor tasks occupy the workers).
            if self.loop.env_steps >= next_eval and self.learner.steps > 0:
                next_eval = (self.loop.env_steps // cfg.eval.every_env_steps + 1) * cfg.eval.every_env_steps
                self.n_evals += 1
                evals.append(evaluator.submit(
                    run_evaluation_task, self.payload, cfg.env.id, cfg.eval.episodes,
                    cfg.seed + 100_000 + 1_000 * self.n_evals, cfg.env.max_episode_steps,
                    self.builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes,
                    frame_stack=getattr(cfg.agent, "frame_stack", 1)))
            for fut in [f for f in evals if f.done()]:
                evals.remove(fut)
                stop |= self._on_evaluation(fut.result(), start)
            # 6. checkpoints and progress.
            if self.learner.steps - last_ckpt_step >= cfg.checkpoint.every_steps:
                last_ckpt_step = self.learner.steps
                self._checkpoint()
            if bar is not None and time.time() - t_log > 0.5:
                t_log = time.time()
                s = self.server.stats()
                bar.set_postfix({"learn": self.learner.steps, "v": self.loop.policy_version,
                                 "ret": f"{np.mean(recent_returns):.0f}" if recent_returns else "-",
                                 "fill": f"{s['mean_fill']:.2f}", "p50ms": f"{s['latency_ms_p50']:.2f}"},
                                refresh=False)
            if ending and not pending:
                self.server.request_stop()
                for fut in evals:
                    self._on_evaluation(fut.result(), start)
                break
            if not busy:
                time.sleep(0.002)
        if bar is not None:
            bar.close()
        self.log.write("inference", step=self.loop.env_steps, **self.server.stats())
        self._checkpoint()
        self.ckpt.wait()
        summary = self._finish(start, [])     # evaluations stack frames themselves (core.evaluation)
        summary["inference"] = self.server.stats()
        self._shutdown()
        return summary


class _Result:
    """Adapts a TrajectoryBatch to the rollout-result shape ``write_shard_stage`` takes."""

    def __init__(self, batch):
        self.batch = batch


def train_central(cfg, run_dir: str, progress: bool = True, resume: bool = False) -> Dict[str, Any]:
    """Run one central-inference training job (local or Dask executor); returns the summary."""
    from core.config import ConfigError
    from pipelines.executors import run_with_executor
    if cfg.executor not in ("local", "dask"):
        raise ConfigError(f"inference 'central' runs on executor local or dask, not {cfg.executor!r} "
                          f"(a Beam round has no long-lived learner to host the inference server)")
    return run_with_executor(CentralTrainer, cfg, run_dir, progress, resume)
