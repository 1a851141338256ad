"""The plan's blocks as tasks: rollouts, one shard write per block, commits in block order.

:class:`BlockTasks` is the part of :class:`pipelines.run.driver.Trainer` that
turns plan blocks into executor tasks and commits their shards (the driver's
steps 1 and 2)::

    block b's version published -> one rollout task per (actor, task) of the block, each after
                                   its actor's previous task, submitted as one batch (on Dask one
                                   scheduler message per worker), and one write task that takes
                                   their futures (trajectories go worker -> writer)
    write of block c done, learner block c-1 done, evaluations up to c - STOP_DELAY decided
                                -> commit shard s{c} (one log entry); account its rows and stats

An actor's last task of each block returns the actor's env state as a
document (``capture_state``), which the write stores in the block's shard:
``--resume`` continues the actors from the last committed block's
(:mod:`pipelines.run.resume`).

A write whose inputs Dask lost with a killed worker (a cancelled future) is
submitted again with the same shard id, after its lost rollouts; retries
overwrite their own uncommitted output, so nothing is committed twice.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Dict, List

from pipelines.executors.common import BatchCall, Earlier, submit_batch
from pipelines.run import stages
from pipelines.run.task_stats import tasks_of
from pipelines.run.flight import Flight

#: Resubmissions of one block's lost tasks before the run stops with a one-line error.
MAX_BLOCK_RETRIES = 10


class BlockTasks:
    """Rollout, write and commit steps of ``Trainer`` (a mixin: they share the run's state)."""

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
            f.rollouts[b] = self._submit_block_rollouts(f, b)
            f.writes[b] = self._submit_write(b, f.rollouts[b])
            f.next_submit += 1
            submitted = True
        return submitted

    def _submit_block_rollouts(self, f: Flight, block: int) -> List[Any]:
        """The block's rollout tasks in one batch (``submit_batch``: one scheduler message per worker on Dask),
        each after its actor's previous task; the same tasks, keys and arguments as ``_submit_rollout``."""
        calls: List[BatchCall] = []
        last: Dict[int, Any] = {}       # actor -> its previous task: a future, or Earlier(i) in this batch
        for a, k in f.plan.tasks(block):
            calls.append(BatchCall(args=self._rollout_args(f, a, k, block),
                                   kwargs={"after": last.get(a, f.last_task.get(a)),
                                           "capture_state": self._captures(f, k)},
                                   key=f"rollout-{self.run_id}-a{a}-t{k}", actor=a))
            last[a] = Earlier(len(calls) - 1)
            self.loop.next_task[a] = k + 1
        futures = submit_batch(self.executor, stages.run_rollout_task, calls)
        for a, ref in last.items():
            f.last_task[a] = futures[ref.index]
        return futures

    def _rollout_args(self, f: Flight, a: int, k: int, block: int) -> tuple:
        # Exploration follows the plan's env steps (block start), not the steps that happen to be done.
        explore = self.builder.exploration(self.cfg.agent, block * f.plan.block_rows, a)
        return (self.actor_specs[a], f.block_ref[block][0], k, self.cfg.actors.steps_per_task, explore)

    @staticmethod
    def _captures(f: Flight, k: int) -> bool:
        """An actor's last task of the block returns its env state, stored in the block's shard (resume)."""
        return k % f.plan.tasks_per_block == f.plan.tasks_per_block - 1

    def _submit_rollout(self, f: Flight, a: int, k: int, block: int, retry: int = 0):
        after = {} if retry else {"after": f.last_task.get(a)}   # an actor's tasks run in order
        stored = getattr(self, "stored_states", {}).get(a)
        if retry and stored is not None and stored.task == k:     # resume: the actor's first task again
            after = {"after": stored}
        fut = self.executor.submit(stages.run_rollout_task, *self._rollout_args(f, a, k, block), **after,
                                   capture_state=self._captures(f, k),
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
        from pipelines.run.flight import StallError
        f.retries += 1
        f.block_retries[block] = f.block_retries.get(block, 0) + 1
        if f.block_retries[block] > MAX_BLOCK_RETRIES:    # never spin: each retry was cancelled at once
            raise StallError(f"the tasks of block {block} were lost {MAX_BLOCK_RETRIES} times; valid: a "
                             f"cluster whose workers stay up")
        self._republish_if_lost(f, block)
        for i, (a, k) in enumerate(f.plan.tasks(block)):
            if f.rollouts[block][i].cancelled():
                self.log.write("task_lost", step=self.loop.env_steps, task=f"rollout actor {a} task {k}")
                f.rollouts[block][i] = self._submit_rollout(f, a, k, block, retry=f.retries)
        self.log.write("task_lost", step=self.loop.env_steps, task=f"write {stages.shard_id_for(block)}")
        f.writes[block] = self._submit_write(block, f.rollouts[block], retry=f.retries)

    def _republish_if_lost(self, f: Flight, block: int) -> None:
        """Scatter the block's policy payload again if Dask lost every replica of it with a worker.

        Tasks given a lost payload are cancelled at once, so resubmitting them with it would loop.
        """
        ref, version = f.block_ref[block]
        if getattr(ref, "cancelled", lambda: False)():
            self._republish(f, ref, version)

    def _republish(self, f: Flight, ref, version: int):
        """Publish ``version`` again in place of the lost ``ref``; every table that held ``ref`` gets the new one."""
        self.log.write("task_lost", step=self.loop.env_steps, task=f"payload of version {version}")
        new = self.stage.publish(version, key=f"payload-{self.run_id}-v{version}-r{f.retries}")
        for table in (f.block_ref, f.versions):
            for b, (r, v) in list(table.items()):
                if r is ref:
                    table[b] = (new, v)
        for fut, r in list(f.eval_ref.items()):
            if r is ref:
                f.eval_ref[fut] = new
        if f.initial[0] is ref:
            f.initial = (new, f.initial[1])
        if self.payload_ref is ref:
            self.payload_ref = new
        return new

    # -- 2. commits -------------------------------------------------------------------
    def _commit_next(self, f: Flight, bar) -> bool:
        """Commit block ``next_commit`` once the learner finished the block before and its stop is decided."""
        c = f.next_commit
        if c >= f.plan.num_blocks or self.loop.block < c or f.stop:
            return False
        if c in f.precommitted:                     # resume: committed before the restart
            if not self._stop_decided(f, c):        # its evaluations decide the best version, in order
                return False
            self._committed(f, c, f.precommitted.pop(c),
                            {"episodes": getattr(self, "precommitted_episodes", {}).get(c, 0)}, bar)
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
                              meta={"policy_version": f.block_ref[c][1], "block": c,
                                    "episodes": info.get("episodes", 0)},   # a resume's counters
                              retention_transitions=self.cfg.replay.retention_transitions)
        if log_version % 100 == 0:  # occasional GC keeps removed/abandoned shard data bounded
            self.log.write("gc", step=self.loop.env_steps,
                           **stages.gc_stage(self.store, self.cfg.replay.gc_grace_s))
        f.trajectory_bytes += info.get("raw_bytes", 0)
        self.log.write("commit", step=self.loop.env_steps + info["rows"], log_version=log_version, shards=1,
                       rows=info["rows"], bytes=info["nbytes"], block=c, write_s=info.get("write_s"),
                       episodes=info.get("episodes", 0), return_sum=info.get("return_sum", 0.0))
        self._committed(f, c, info["rows"], info, bar)
        f.writes.pop(c)
        f.rollouts.pop(c)
        f.block_ref.pop(c)
        return True

    def _committed(self, f: Flight, c: int, rows: int, info: Dict[str, Any], bar) -> None:
        """Account block ``c``'s rows and task stats (``write_shard_stage``'s metadata)."""
        import types
        self.loop.env_steps += rows
        self.loop.shard_seq = c + 1
        self.loop.episodes += info.get("episodes", 0)
        f.recent_returns.extend(info.get("returns_tail", []))
        tasks = tasks_of(info)
        for actor, task, worker, seconds, steps, version in tasks:
            f.slowest_task_s = max(f.slowest_task_s, seconds)
            self.worker_stats.add(types.SimpleNamespace(actor_id=actor, worker=worker, seconds=seconds,
                                                        env_steps=steps))
            f.lags.append((self.loop.policy_version - version,
                           time.time() - self.version_time.get(version, time.time())))
        if tasks:
            self.log.write("workers", step=self.loop.env_steps, workers=self.worker_stats.table())
        f.next_commit = c + 1
        if bar is not None:
            bar.update(rows)

    def _stop_decided(self, f: Flight, c: int) -> bool:
        """Handle, in order, the evaluations block ``c`` waits for; False while one is running."""
        while f.evals and f.evals[0][0] <= f.plan.decides_stop_before(c):
            _, fut, steps = f.evals[0]
            if not fut.done():
                return False
            try:
                result = self._materialize(f, fut)
            except concurrent.futures.CancelledError:
                self._resubmit_lost_evaluation(f)
                return False
            f.evals.popleft()
            f.eval_ref.pop(fut, None)
            f.slowest_task_s = max(f.slowest_task_s, time.time() - f.eval_submitted.pop(fut, time.time()))
            f.stop |= self._on_evaluation(result, f.start, env_steps=steps)
        return True
