"""The training driver: runs a :class:`~pipelines.run.plan.TrainingPlan` on any executor.

The plan fixes what happens (which tasks, policy versions, shards, learner
steps and RNG streams; see :mod:`pipelines.run.plan`); the executor only decides
where and when, the learner's place included. The loop::

    while learner blocks remain and no planned stop:
        blocks whose policy version exists -> rollout tasks (actor-chained) + one write task that
                                              takes their futures (data never visits the driver)
        next block's write done, learner done with the block before, its stop point decided
                                           -> commit shard s{block} (metadata only reaches the driver)
        learner block committed            -> stage.learn_block(block): the plan's learner calls
        learner block done                 -> maybe a new version, an evaluation, a checkpoint
        nothing progressed for the stall bound -> StallError naming what it waits for

The learner is a stage (:class:`~pipelines.run.learner_stage.LearnerStage`): in
this process by default, or with ``learner.resources`` a Dask actor on the
worker that advertises them (``DaskExecutor.place``); the driver sends it
block numbers and receives metrics and version metadata. With the local
executor every submit runs at once; with Dask actors step the next
``actors.policy_lag`` blocks while the learner trains. Either way the
learner's parameters and the committed replay are the same for a seed.

``--resume`` continues the plan where the last checkpoint left it, and ends
bit-identical to a run that never stopped (:mod:`pipelines.run.resume`): the
checkpoint carries the policy versions and evaluations the next blocks need,
each block's shard carries its actors' env states, and blocks committed
after the checkpoint are not run again. Envs whose state cannot be captured
(Atari, dm_control) make such a resume fault-tolerant but not bit-identical.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import pickle
import time
from typing import Any, Dict, List, Optional

import numpy as np

from core import config as config_lib
from core import urls
from core.metrics import MetricsLogger
from pipelines.run import block_rules
from pipelines.run import resume as resume_lib
from pipelines.run import setup as run_setup
from pipelines.run import stages
from pipelines.run.block_tasks import BlockTasks
from pipelines.run.evaluation_schedule import EvaluationSteps
from pipelines.run import summary as summary_lib
from pipelines.run.flight import STALL_MIN_S, Flight, LoopState, StallError
from pipelines.run.in_process_stage import InProcessParts, InProcessStage
from pipelines.run.learner_stage import LearnerStage
from pipelines.run.plan import TrainingPlan
from pipelines.run.policy_versions import PolicyVersions

#: Longest single wait of the main loop when nothing progressed. Every wait returns as soon as a future
#: it waits on completes, so this only bounds the time-based duties (progress bar, policy-lag records, a
#: SIGTERM stop, noticing a lost learner worker); each wake-up of a Dask wait is a round trip through the
#: client's event loop: at 0.25 s the idle loop cost a driver waiting on slow actors ~1.5 ms of CPU per
#: second in its main thread and more in the client's loop (cluster_scale, 10 ms env steps, N = 1).
WAIT_S = 1.0


class Trainer(BlockTasks, EvaluationSteps, PolicyVersions, InProcessParts):
    """One training run (see module docstring). ``run()`` returns the summary dict."""

    def __init__(self, cfg, run_dir: str, executor, progress: bool = True, resume: bool = False):
        self.cfg = cfg
        self.run_dir = urls.normalize(run_dir)
        self.executor = executor
        self.progress = progress
        self.resume = resume
        self.run_id = run_setup.run_id(cfg, self.run_dir)

    # -- setup ---------------------------------------------------------------
    def _setup(self) -> None:
        from core.agents.registry import get_builder
        from core.envs import env_spec
        from core.replay import ReplayStore

        cfg = self.cfg
        fs, path = urls.resolve(self.run_dir)
        # A second run would reuse committed shard ids and overwrite the config: refuse, touch nothing.
        run_setup.check_run_dir(self.run_dir, self.resume)
        if cfg.learner.resources:      # a cluster that cannot place the learner: refused before any write
            self.executor.check_resources(cfg.learner.resources)
        fs.makedirs(path, exist_ok=True)
        if not self.resume:
            run_setup.write_config(self.run_dir, cfg, resume=False)
        self.spec = env_spec(cfg.env.id)
        self.store_url = urls.join(self.run_dir, "replay")
        # The driver commits and reads; its write tasks open stores of their own, so this store's write
        # engine (tensorstore: ~1 s of imports) is never built before block 0 (ShardWriter.engine).
        if self.resume:   # a run's store exists from its first step: a lost one is an error, not a fresh start
            self.store = ReplayStore.open(self.store_url, **cfg.replay.writer_options())
        else:
            self.store = ReplayStore.open_or_create(self.store_url, env_id=cfg.env.id,
                                                    **cfg.replay.writer_options())
        self.builder = get_builder(cfg.agent.algo)
        self.plan = TrainingPlan.from_config(cfg)
        self.precommitted: Dict[int, int] = {}        # resume: blocks committed after the checkpoint
        self.version_time: Dict[int, float] = {}     # when each policy version was published
        self.eval_versions: set = set()              # versions being evaluated (their params are kept)
        self.asked_version = 0                       # newest version asked of the stage
        self.learner_steps = 0
        self.n_evals = 0
        self.loop = LoopState(next_task=[0] * cfg.actors.num_actors)
        from pipelines.run.energy import start_run_tracker   # ms: the backend's probe runs on a thread
        self.energy = start_run_tracker(cfg, self.run_dir, self.executor)   # whole run: setup .. final eval
        # Block 0 acts before the learner exists when no action of it reads the policy (policy_versions);
        # after the tracker, so its tasks record their stage CPU too.
        self.early = self._submit_uniform_first_block()
        self.stage = self._place_learner()
        self.restored_versions: List[Dict[str, Any]] = []   # resume: the versions the checkpoint carries
        self.restored_refs: Dict[int, Any] = {}             # resume: learner block -> (payload ref, version)
        self.restored_eval_refs: Dict[int, Any] = {}        # resume: version -> payload ref (evaluations)
        self.stored_states: Dict[int, Any] = {}             # resume: actor -> StoredState (core.rollout)
        if self.resume:
            self._restore()
        first_block = max([self.loop.block - 1, *self.precommitted]) + 1
        self.actor_specs = run_setup.actor_specs(cfg, self.run_id, self.builder.action_selector,
                                                 first_task=first_block * self.plan.tasks_per_block)
        resumed = resume_lib.load_actor_states(self.store, self.actor_specs, first_block) if self.resume else None
        if self.resume:
            self.stored_states = resumed.states
            run_setup.write_config(self.run_dir, cfg, resume=True)   # only once the run restored: a failing
                                                                     # resume writes nothing
        self.log = MetricsLogger(self.run_dir)
        self.log.write("config", step=0, config=config_lib.to_dict(cfg))
        if resumed is not None:
            self.log.write("resume", step=self.loop.env_steps, **resumed.record(self.loop, self.precommitted,
                                                                                self.restored_versions))
        self.log.write("placement", step=self.loop.env_steps, **self._placement())

    def _place_learner(self):
        """The learner stage: on a worker with ``learner.resources`` (Dask), else in this process."""
        cfg = self.cfg
        if cfg.learner.resources:     # validated: executor dask (core.config.check_learner_placement)
            return self.executor.place(LearnerStage, cfg, self.run_dir, resources=cfg.learner.resources,
                                       key=f"learner-{self.run_id}-{os.getpid()}-{int(time.time() * 1000)}")
        client = getattr(self.executor, "client", None)
        return InProcessStage(LearnerStage(cfg, self.run_dir, dask_client=client,
                                           async_versions=not getattr(self.executor, "deterministic", False)),
                              self.executor)

    def _placement(self) -> Dict[str, Any]:
        """Where the learner and each actor run (the ``placement`` record of metrics.jsonl)."""
        where = getattr(self.executor, "placement", None)
        actors = where(self.cfg.actors.num_actors) if where else {}
        return {"learner": self.stage.where(), "learner_address": self.stage.address,
                "learner_resources": dict(self.cfg.learner.resources),
                "actors": {str(a): w for a, w in actors.items()}, "executor": self.cfg.executor}

    def _restore(self) -> None:
        out = self.stage.run("restore")
        loop = json.loads(out["loop"])
        self.learner_steps = out["steps"]
        self.loop = LoopState(**loop)
        self.n_evals = self.loop.n_evals
        self.restored_versions = out.get("versions", [])
        if "block" not in loop:     # a checkpoint from before plans: one shard per round of tasks
            self.loop.block = self.loop.shard_seq
        # Blocks committed after the checkpoint (a kill -9 between commit and checkpoint) are never
        # run again: their shards are in the log, the learner trains on them, actors start after them.
        infos = self.store.state().infos          # every shard ever committed, removed ones too
        blocks = {int(sid[1:]): info.rows for sid, info in infos.items() if sid.startswith("s") and sid[1:].isdigit()}
        self.precommitted = {b: r for b, r in blocks.items() if b >= self.loop.block}
        self.precommitted_episodes = {b: resume_lib.committed_episodes(self.store, stages.shard_id_for(b))
                                      for b in self.precommitted}
        self.loop.shard_seq = max([self.loop.shard_seq, self.loop.block, *[b + 1 for b in blocks]])
        if len(self.loop.next_task) < self.cfg.actors.num_actors:
            self.loop.next_task += [0] * (self.cfg.actors.num_actors - len(self.loop.next_task))

    # -- main loop --------------------------------------------------------------
    def run(self) -> Dict[str, Any]:
        """Train through the plan's blocks (or to a planned stop); returns the summary dict."""
        from pipelines.run.stop_signal import stop_on_sigterm
        self._setup()
        try:
            self._first_versions()
            f = Flight.begin(self)
            self._adopt_first_block(f, self.early)
            self._resume_evaluations(f)
            bar = self._progress_bar()
            t_bar = time.time()
            with stop_on_sigterm() as stop_request:
                while not (f.stop or self.loop.block >= f.plan.num_blocks):
                    progressed = f.timed("submit", self._submit_blocks, f)        # 1. blocks whose version exists
                    progressed |= f.timed("commit", self._commit_next, f, bar)   # 2. next shard, in block order
                    progressed |= f.timed("learn", self._learn, f)               # 3. the block's learner stage call
                    if stop_request and f.learning is None:          # SIGTERM: at a learner block end
                        self._stop_on_signal(f, stop_request.signal_name, bar)
                    if f.lag_due():      # every 2 s: policy lag in versions and seconds
                        self.log.write("policy_lag", step=self.loop.env_steps,
                                       policy_version=self.loop.policy_version, **f.lag_summary())
                    if bar is not None and time.time() - t_bar > 0.5:
                        t_bar = time.time()
                        bar.set_postfix(self._postfix(f.start, f.recent_returns, f.lags), refresh=False)
                    self._watch(f, progressed)                       # 4. never wait forever
            if bar is not None:
                bar.close()
            return self._close(f)
        except Exception as e:
            self._abort(e)
            raise

    def _stop_on_signal(self, f: Flight, signal_name: str, bar) -> None:
        """A checkpoint at this learner block end, then stop (pipelines.run.stop_signal); raises KeyboardInterrupt,
        which the CLI turns into the one-line resume message."""
        if bar is not None:
            bar.close()
        self._checkpoint(f)
        self.log.write("stopped", step=self.loop.env_steps, signal=signal_name, learner_steps=self.learner_steps,
                       block=self.loop.block)
        self._cancel_uncommitted(f)    # a resume plans them again
        self._shutdown()
        raise KeyboardInterrupt(signal_name)

    @staticmethod
    def _cancel_uncommitted(f: Flight) -> None:
        """Cancel the rollouts and shard writes of every block not committed yet."""
        for fut in [*f.writes.values(), *(r for rs in f.rollouts.values() for r in rs)]:
            fut.cancel()

    def _abort(self, error: Exception) -> None:
        """A failed run: close the stage (its checkpoint writes finish); name --resume if the learner was lost."""
        from pipelines.executors.dask_stage import LearnerLostError
        if isinstance(error, LearnerLostError):
            error.args = (f"{error}; the run stops at learner block {self.loop.block}; valid: "
                          f"python -m pipelines.train --resume {self.run_dir} (from its last checkpoint)",)
        try:
            self.stage.close()
        except Exception:   # noqa: BLE001 - the stage's worker may be gone: the first error is the news
            pass
        self.log.close()

    def _close(self, f: Flight) -> Dict[str, Any]:
        while f.evals:    # the last evaluations still decide the best version, in order
            _, fut, steps = f.evals[0]
            try:
                result = self._materialize(f, fut)
            except concurrent.futures.CancelledError:   # lost with a worker: the same evaluation again
                try:
                    self._resubmit_lost_evaluation(f)     # takes it off the queue, puts the new one first
                except Exception:  # noqa: BLE001 - lost for good (the cluster is gone): not a failed run
                    pass
                continue
            except Exception:  # noqa: BLE001 - a final eval lost with the cluster does not fail the run
                f.evals.popleft()
                continue
            f.evals.popleft()
            self._on_evaluation(result, f.start, env_steps=steps)
        self._cancel_uncommitted(f)    # planned past a stop: never committed (gc removes what they wrote)
        self.task_bytes_in, self.trajectory_bytes = f.driver_bytes, f.trajectory_bytes
        f.stage_s = self.stage.run("stage_seconds")    # once per run: the stage's own split (wall_split)
        self.log.write("schedule", step=self.loop.env_steps, blocks=self.loop.block, wall_s=time.time() - f.start,
                       driver_bytes_in={"tasks": f.driver_bytes, "learner_stage": self.stage.bytes_in},
                       idle_s={k: round(v, 3) for k, v in f.idle_s.items()},
                       busy_s={k: round(v, 3) for k, v in f.busy_s.items()},
                       stage_s={k: round(v, 3) for k, v in f.stage_s.items()}, task_retries=f.retries)
        self._checkpoint(f)
        summary = self._finish(f.start, f.lags)
        self._shutdown()
        return summary

    def _shutdown(self) -> None:
        """Close the learner stage (its checkpoint writes finish) and the metrics log."""
        self.stage.close()
        self.log.close()

    def _materialize(self, f: Flight, fut) -> Any:
        """``fut.result()``, counting what the driver receives (``driver_bytes_in_per_env_step``)."""
        result = fut.result()
        f.driver_bytes += len(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        return result
    # -- 3. learner blocks --------------------------------------------------------------
    def _learn(self, f: Flight) -> bool:
        """Send the committed learner block to the stage; handle its end once the stage returns."""
        b = self.loop.block
        if f.learning is not None:
            if not f.learning.done():
                return False
            call, f.learning = f.learning, None
            f.slowest_task_s = max(f.slowest_task_s, time.time() - f.learning_since)
            f.timed("end_block", self._end_block, f, b, call.result())
            return True
        if f.next_commit <= b or f.stop:
            return False
        # The plan fixes the block's learner steps, so whether it ends with a new version is known now:
        # the stage quantizes it in the same call (one round trip per block when it is on a worker).
        target = f.plan.learner_target(self.loop.env_steps)
        due = block_rules.version_due(self.learner_steps, target, f.last_broadcast_step,
                                      self.cfg.actors.broadcast_period)
        publish = self._next_version() if due else None
        f.learning_since = time.time()
        f.learning = self.stage.call("learn_block", b, target, publish, self._keep_versions())
        return True

    def _end_block(self, f: Flight, b: int, out: Dict[str, Any]) -> None:
        """After learner block ``b``: the planned version, evaluation and checkpoint (:func:`block_rules.learn_end`)."""
        cfg = self.cfg
        self.learner_steps = out["steps"]
        if out["published"] is not None:
            f.last_broadcast_step = self.learner_steps
        f.timed("new_version", self._on_version, out)
        f.versions[b] = (self.payload_ref, self.loop.policy_version)
        for old in [v for v in f.versions if v < f.plan.policy_block(f.next_submit)]:
            del f.versions[old]      # no block left to submit acts with it
        end = block_rules.learn_end(self.loop.env_steps, self.learner_steps, f.next_eval, f.last_ckpt_step,
                                    cfg.eval.every_env_steps, cfg.checkpoint.every_steps)
        if end.evaluate:
            f.next_eval = end.next_eval
            self._evaluate(f, b, self.loop.env_steps)
        self.loop.block = b + 1
        if end.checkpoint:
            f.last_ckpt_step = self.learner_steps
            f.timed("checkpoint", self._checkpoint, f)

    # -- 4. stalls ---------------------------------------------------------------------
    def _watch(self, f: Flight, progressed: bool) -> None:
        """Wait for the next thing the plan needs; a StallError after the stall bound without progress."""
        now = time.time()
        if progressed:
            f.last_progress = now
            return
        waiting = f.waiting_for()
        pending = [fut for _, fut in waiting if fut is not None and not fut.done()]
        if f.learning is not None and f.learning in pending:
            f.learning.wait(WAIT_S)    # nothing else can progress before the learner block ends
        elif pending:
            self.executor.wait(pending, timeout=WAIT_S)
        else:
            time.sleep(0.002)
        f.idle_s[waiting[0][0].split(" ")[0] if waiting else "other"] += time.time() - now
        bound = self.cfg.actors.stall_timeout_s or max(STALL_MIN_S, 10 * f.slowest_task_s)
        if time.time() - f.last_progress > bound:
            what = ", ".join(name for name, _ in waiting) or "nothing (a bug)"
            raise StallError(f"training made no progress for {bound:.0f} s; waiting for {what} "
                             f"(learner block {self.loop.block}, committed blocks {f.next_commit}); "
                             f"valid: a cluster that runs these tasks, or a larger actors.stall_timeout_s")

    def _flush_rows(self) -> int:
        # Freshness bound, deterministic (row-based, not time-based) so that the
        # local executor stays reproducible: small envs give small shards early on.
        if self.cfg.replay.shard_max_rows:
            return self.cfg.replay.shard_max_rows
        per_task = self.cfg.env.num_envs * self.cfg.actors.steps_per_task
        return max(per_task * self.cfg.actors.num_actors, 512)

    def _checkpoint(self, f: Optional[Flight] = None) -> None:
        """Checkpoint the learner with the loop's counters and (given ``f``) what resume needs of the plan."""
        versions, params_of = (), ()
        if f is not None:
            versions, params_of = resume_lib.plan_state(self.loop, f, self.n_evals)
        self.stage.run("checkpoint", json.dumps(dataclasses.asdict(self.loop)), versions, params_of)

    # -- end of run -------------------------------------------------------------
    def _finish(self, start: float, lags) -> Dict[str, Any]:
        """Evaluate the best (or final) policy at fp32 and at the actors' precision (in the stage)."""
        wall = time.time() - start
        out = self.stage.run("finish", self.loop.best_version, self.loop.policy_version)
        self._write_records(out["records"])
        summary = summary_lib.build_summary(self.cfg, self.run_dir, self.loop, out["steps"], wall,
                                            self.payload.nbytes, lags, out["final"], self.store.latest_version(),
                                            self._driver_bytes_in(),
                                            getattr(self, "trajectory_bytes", None))
        from pipelines.run.energy import stop_run_tracker
        summary.update(stop_run_tracker(self.energy))
        summary_lib.write_summary(self.run_dir, self.log, summary)
        return summary

    def _driver_bytes_in(self) -> Optional[int]:
        """Task results plus learner stage results (metrics records, versions): all the driver received."""
        tasks = getattr(self, "task_bytes_in", None)
        return None if tasks is None else tasks + self.stage.bytes_in

    def _progress_bar(self):
        return run_setup.progress_bar(self.progress, self.cfg.total_env_steps, self.loop.env_steps, "step",
                                      f"{self.cfg.name}", mininterval=0.5)

    def _postfix(self, start: float, recent_returns, lags) -> Dict[str, Any]:
        return {**run_setup.progress_postfix(self.loop, self.learner_steps, start, recent_returns),
                "lag": f"{np.mean([l[0] for l in lags]):.1f}" if lags else "-",
                **({"w(tasks/retries)": self.worker_stats.postfix()} if len(self.worker_stats) > 1 else {})}


def default_run_dir(cfg) -> str:
    return os.path.join("runs", cfg.name)
