"""Central (SEED) mode training, ``inference: central``: the driver's plan with a server doing the inference.

The run is the same :class:`~pipelines.run.plan.TrainingPlan` the driver
(:class:`pipelines.run.driver.Trainer`) runs: the same blocks, tasks, versions,
shards, commits, learner calls, evaluations, stop rule and checkpoints, by
the same code. Only *who runs a rollout task* differs. The learner process
hosts an :class:`core.inference.server.InferenceServer` (scheduled); env-only
actors (:func:`core.inference.client.run_env_actor_task`) run as long-lived
tasks (local: spawned processes; Dask: one task per actor, pinned to a
worker) and stream observations to it. A rollout task ``(actor a, task k)``
of block ``b`` is the ``T = actors.steps_per_task`` steps ``k*T ..`` of actor
``a``'s stream::

    driver: block b's version published -> server.grant(a, k, payload of policy_block(b),
                                                        builder.exploration(agent, b * block_rows, a))
    server: a step of task k waits for its grant; actions ~ default_rng([seed, a, k, 1]);
            the task's last row completes -> RolloutResult (rows and ids as a local actor's)
    driver: block b's last task done -> shard s{b} (actor-major), on a writer thread
            -> commit, learn, version, evaluation, stop rule, checkpoint: the driver's code, unchanged

So the versions, exploration and action RNG of every step are the plan's,
and the server's batching cannot change a row (LiteRT rows do not depend on
the batch they run in; ``tests/pipelines/test_central_plan.py`` checks it): a config and
seed give bit-identical parameters and replay, with the local or the Dask
executor. The grants replace the old step budget: actors run at most
``actors.policy_lag`` blocks ahead of the learner, as on Dask. Nothing is
broadcast to actors (:class:`_ServerStage`); evaluations run on a thread
beside the server (:class:`_BesideTheServer`), since actors hold the workers
(on Dask one task per worker runs that worker's actors in one event loop).
An actor lost mid-run is started again; it reconnects and plays its
unfinished task again from envs seeded for that task, with new episode ids
(complete and consistent, but not bit-identical to an undisturbed run).

``--resume`` is bit-identical, as for actor-side inference: every block's
last task ends with the actor's state, joined by the server from the
env-only actor's envs and its own episode bookkeeping, frame stack and
recurrent carry into the document a local actor stores
(:mod:`core.inference.states`), and the block's shard holds it. A resumed
run republishes the checkpoint's versions, starts the server with a
:class:`~core.inference.states.ResumePoint` per stored actor (the welcome
hands the actor its envs) and grants the plan's tasks from there. Actor
processes exit when their trainer is gone (a SIGKILL runs no cleanup).

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
import threading
from typing import Any, Dict, List, Optional

from pipelines.run import stages
from pipelines.run.driver import Trainer
from pipelines.run.in_process_stage import InProcessStage
from pipelines.run.learner_stage import LearnerStage


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


def _actor_process(endpoint, spec, parent: int) -> None:
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    from core.inference.client import run_env_actor_task
    run_env_actor_task(endpoint, spec)


def _exit_with_parent(parent: int) -> None:
    """End this actor once the trainer that spawned it is gone (a SIGKILL runs no cleanup): no orphan
    retries a dead server, or holds the killed run's output pipes open."""
    import os
    import time
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


class _PlannedFuture:
    """What the driver asks of a future besides ``done``/``result``: never cancelled (a lost actor
    is started again and replays its task, see ``CentralTrainer._watch``)."""

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> None:
        pass


class _TaskFuture(_PlannedFuture):
    """Rollout task ``(actor, task)`` played through the server: the driver's rollout future."""

    def __init__(self, server, actor: int, task: int):
        self.server, self.actor, self.task = server, actor, task
        self._result = None

    def done(self) -> bool:
        return self._result is not None or self.server.has_result(self.actor, self.task)

    def result(self):
        if self._result is None:
            self._result = self.server.result(self.actor, self.task)
        return self._result


class _ShardWrite(_PlannedFuture):
    """Block ``block``'s shard write, started on the writer thread once its last task is done.

    The server tells the trainer when a task finishes (``on_result``), so the
    shard is written while the driver trains the block before; the
    trajectories are in this process already (the server's).
    """

    def __init__(self, store_url: str, block: int, tasks: List[_TaskFuture], writer_options: Dict[str, Any],
                 writer: concurrent.futures.ThreadPoolExecutor):
        self.args = (store_url, stages.shard_id_for(block), tasks, writer_options)
        self.writer = writer
        self._future: Optional[concurrent.futures.Future] = None
        self._lock = threading.Lock()

    def start_if_ready(self) -> bool:
        """Submit the write once every task is done (any thread); True once submitted."""
        with self._lock:
            if self._future is None and all(t.done() for t in self.args[2]):
                store_url, shard_id, tasks, options = self.args
                self._future = self.writer.submit(stages.write_shard_stage, store_url, shard_id,
                                                  [t.result() for t in tasks], options)
            return self._future is not None

    def done(self) -> bool:
        return self.start_if_ready() and self._future.done()

    def result(self) -> Dict[str, Any]:
        self.start_if_ready()
        return self._future.result()


class _BesideTheServer:
    """The executor as the driver sees it in central mode: its tasks (evaluations) run on a thread here.

    Actor tasks hold the workers for the whole run, so an evaluation submitted
    to them would wait for the run's end; ``wait`` also wakes when the server
    finishes a task. Everything else goes to the cluster's executor.
    """

    def __init__(self, executor, server_of):
        self.cluster, self._server_of = executor, server_of
        self.threads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="central-eval")
        self.writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="central-write")

    def __getattr__(self, name: str):
        return getattr(self.cluster, name)

    def submit(self, fn, *args, key: Optional[str] = None, actor: Optional[int] = None, **kwargs):
        return self.threads.submit(fn, *args, **kwargs)

    def wait(self, futures, timeout: Optional[float] = None) -> List[Any]:
        server = self._server_of()
        writes = [f._future for f in futures if isinstance(f, _ShardWrite) and f._future is not None]
        if writes:
            concurrent.futures.wait(writes, timeout=timeout)
        elif server is not None and any(isinstance(f, _ShardWrite) for f in futures):
            server.wait_for_results(timeout or 0.0)
        else:
            concurrent.futures.wait([f for f in futures if isinstance(f, concurrent.futures.Future)],
                                    timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        return [f for f in futures if f.done()]


class _ServerStage(InProcessStage):
    """The in-process learner stage; a published version goes to the server's grants, not to actors."""

    def publish(self, version: int, key: Optional[str] = None) -> Any:
        return self.obj.payload(version)


#: Times an env actor (a group of them, on Dask) is started again after it ended before the run did.
MAX_ACTOR_RESTARTS = 3


class CentralTrainer(Trainer):
    """One SEED-mode training run on the driver's plan; ``run()`` returns the same summary as :class:`Trainer`."""

    server = None

    def __init__(self, cfg, run_dir: str, executor, progress: bool = True, resume: bool = False):
        super().__init__(cfg, run_dir, _BesideTheServer(executor, lambda: self.server), progress, resume)
        self.actors: List[Any] = []
        self.write_of: Dict[Any, _ShardWrite] = {}       # (actor, task) -> its block's write

    def _place_learner(self):
        """In this process, beside the server (``learner.resources`` is refused for central mode)."""
        return _ServerStage(LearnerStage(self.cfg, self.run_dir, dask_client=getattr(self.executor, "client", None)),
                            self.executor)

    def run(self) -> Dict[str, Any]:
        self.listen = server_listen_plan(self.cfg)
        try:
            return super().run()
        finally:
            self._stop_serving()
            self.listen.cleanup()          # the private socket directory goes with the run

    def _publish(self, payload) -> None:
        super()._publish(payload)
        self._serve(payload)

    def _first_versions(self) -> None:
        super()._first_versions()          # a resumed run republishes the checkpoint's versions, not _publish
        self._serve(self.payload)

    def _serve(self, payload) -> None:
        """The first version: serve it, then start the actors."""
        if self.server is None:
            self.server = self._start_server(payload)
            self.actors = self._start_actors()

    def _resume_points(self):
        """Actor -> ResumePoint of its stored state (``--resume``): the server continues it, not seeds."""
        from core.inference.states import ResumePoint
        return {a: ResumePoint.from_document(self.actor_specs[a], stored.doc)
                for a, stored in self.stored_states.items()}

    def _start_server(self, payload):
        """The inference server on the listen plan; actors get ``self.endpoint`` (address, token, TLS root)."""
        from core.config import ConfigError
        from core.inference.endpoint import new_token
        from core.inference.server import InferenceServer
        cfg = self.cfg
        server = InferenceServer(
            self.listen.bind, payload, self.spec, unroll_length=cfg.actors.steps_per_task,
            selector=self.builder.action_selector, max_batch_size=max(cfg.env.num_envs * cfg.actors.num_actors, 1),
            max_wait_s=0.002, frame_stack=getattr(cfg.agent, "frame_stack", 1), litert_threads=cfg.threads.litert,
            seed=cfg.seed, token=new_token(), tls=server_tls(cfg), scheduled=True,
            first_task=self.actor_specs[0].first_task, max_versions=cfg.actors.policy_lag + 2,
            capture_every=self.plan.tasks_per_block, resume_points=self._resume_points())
        try:
            server.start()
        except OSError as e:   # e.g. inference_server.bind_host names no interface of this host
            raise ConfigError(f"{e}; valid: inference_server.bind_host = an address of this host, "
                              f"or null for the default") from None
        self.endpoint = server.endpoint(self.listen.dial_address(server.port))
        server.on_result = self._task_done
        return server

    def _start_actors(self) -> List[Any]:
        """Local: a process per actor. Dask: one task per worker with its actors (actor ``a`` on worker ``a % W``)."""
        n = len(self.actor_specs) if self.cfg.executor == "local" else len(self.executor.cluster.workers())
        self.actor_groups = max(1, min(n, len(self.actor_specs)))
        self.restarts = [0] * self.actor_groups
        return [self._start_group(g) for g in range(self.actor_groups)]

    def _start_group(self, g: int):
        from core.inference.client import run_env_actors_task
        specs = self.actor_specs[g::self.actor_groups]
        if self.cfg.executor == "local":
            import os
            return _ProcessFuture(_actor_process, (self.endpoint, specs[0], os.getpid()))
        return self.executor.cluster.submit(run_env_actors_task, self.endpoint, specs, actor=g,
                                            key=f"env-actors-{self.run_id}-g{g}-r{self.restarts[g]}")

    def _watch(self, f, progressed: bool) -> None:
        """Start again an actor lost mid-run (it replays its unfinished task: core.inference.server)."""
        for g, fut in enumerate(self.actors):
            if fut.done():
                if self.restarts[g] >= MAX_ACTOR_RESTARTS:
                    fut.result()     # its error, if it raised one
                    raise RuntimeError(f"env actor group {g} ended {self.restarts[g] + 1} times before the run's "
                                       f"end (last exit: {fut.result()}); valid: actors that keep running")
                self.restarts[g] += 1
                ids = [spec.actor_id for spec in self.actor_specs[g::self.actor_groups]]
                self.log.write("task_lost", step=self.loop.env_steps, task=f"env actors {ids}")
                self.actors[g] = self._start_group(g)
        super()._watch(f, progressed)

    def _stop_serving(self) -> None:
        """Tell the actors the run is over, wait for them (never leave one retrying), stop the server."""
        if self.server is not None:
            self.server.request_stop()
        for fut in self.actors:
            try:
                fut.result(timeout=10)
            except Exception:  # an actor lost with its worker does not fail the finished run
                pass
            if not fut.done():
                fut.cancel()
        if self.server is not None:
            self.server.stop()
        self.executor.threads.shutdown(wait=True)
        self.executor.writer.shutdown(wait=True)

    # -- the plan's rollout tasks, played by the server -------------------------------------------
    def _submit_block_rollouts(self, f, block: int) -> List[Any]:
        f.rollout_tasks[block] = [[t] for t in f.plan.tasks(block)]
        return [self._submit_rollout(f, a, k, block) for a, k in f.plan.tasks(block)]   # grants, not tasks

    def _resubmit_unit(self, f, block: int, i: int, retry: int):
        (a, k), = f.rollout_tasks[block][i]
        return self._submit_rollout(f, a, k, block, retry=retry)

    def _submit_rollout(self, f, a: int, k: int, block: int, retry: int = 0):
        # Exploration follows the plan's env steps (block start), as for a local rollout task.
        explore = self.builder.exploration(self.cfg.agent, block * f.plan.block_rows, a)
        self.server.grant(a, k, f.block_ref[block][0], explore)
        self.loop.next_task[a] = k + 1
        return _TaskFuture(self.server, a, k)

    def _submit_write(self, block: int, rollouts: List[Any], retry: int = 0):
        write = _ShardWrite(self.store_url, block, rollouts, self.cfg.replay.writer_options(), self.executor.writer)
        self.write_of.update({(t.actor, t.task): write for t in rollouts})
        write.start_if_ready()
        return write

    def _task_done(self, actor: int, task: int) -> None:
        """The server finished a task (its stream thread): start its block's write if it was the last."""
        write = self.write_of.pop((actor, task), None)
        if write is not None:
            write.start_if_ready()

    # -- end of run -------------------------------------------------------------------------------
    def _close(self, f) -> Dict[str, Any]:
        self.server.request_stop()          # actors waiting for grants past a planned stop end now
        self.log.write("inference", step=self.loop.env_steps, **self.server.stats())
        return super()._close(f)

    def _finish(self, start: float, lags) -> Dict[str, Any]:
        summary = super()._finish(start, lags)
        summary["inference"] = self.server.stats()
        return summary


def train_central(cfg, run_dir: str, progress: bool = True, resume: bool = False) -> Dict[str, Any]:
    """Run one central-inference training job (local or Dask executor); returns the summary."""
    from core.config import ConfigError
    from pipelines.executors.factory import run_with_executor
    if cfg.executor not in ("local", "dask"):
        raise ConfigError(f"inference 'central' runs on executor local or dask, not {cfg.executor!r} "
                          f"(a Beam round has no long-lived learner to host the inference server)")
    return run_with_executor(CentralTrainer, cfg, run_dir, progress, resume)
