"""The plan's blocks as tasks: rollouts, one shard write per block, commits in block order.

:class:`BlockTasks` is the part of :class:`pipelines.run.driver.Trainer` that
turns plan blocks into executor tasks and commits their shards (the driver's
steps 1 and 2)::

    block b's version published -> the block's (actor, task)s as one rollout task per group of
                                   actors pinned to one worker (on Dask one task per worker, running
                                   its actors on its threads; elsewhere one per actor), each after its
                                   actors' previous tasks, and one write task that takes their
                                   futures (trajectories go worker -> writer)
    write of block c done, learner block c-1 done, evaluations up to c - STOP_DELAY decided
                                -> commit shard s{c} (one log entry); account its rows and stats

An actor's last task of each block returns the actor's env state as a
document (``capture_state``), which the write stores in the block's shard:
``--resume`` continues the actors from the last committed block's
(:mod:`pipelines.run.resume`).

The scheduler's and the driver's costs are per Dask task, not per env step
(``benchmarks/studies/cluster_scale.py``): grouping makes them per worker.

A write whose inputs Dask lost with a killed worker (a cancelled future) is
submitted again with the same shard id, after its lost rollouts; retries
overwrite their own uncommitted output, so nothing is committed twice.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Dict, List, Tuple

from pipelines.executors.common import BatchCall, submit_batch
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
        """The block's rollouts: one task per group of actors that share a worker (``actor_groups``: on
        Dask one per worker, else one per actor), in one batch (``submit_batch``), each after its actors'
        previous tasks; ``f.rollout_tasks[block]`` names the plan tasks each one runs."""
        tasks = f.plan.tasks(block)
        actors = sorted({a for a, _ in tasks})
        grouping = getattr(self.executor, "actor_groups", None)
        groups = grouping(actors) if grouping else [([a], 1) for a in actors]
        group_of = {a: i for i, (members, _) in enumerate(groups) for a in members}
        units: List[List[Tuple[int, int]]] = [[] for _ in groups]
        for a, k in tasks:
            units[group_of[a]].append((a, k))
        f.rollout_tasks[block] = units
        calls = [self._group_call(f, block, unit, threads) for unit, (_, threads) in zip(units, groups)]
        futures = submit_batch(self.executor, stages.run_rollout_group, calls)
        for unit, fut in zip(units, futures):
            for a, k in unit:
                f.last_task[a] = fut
                self.loop.next_task[a] = k + 1
        return futures

    def _group_call(self, f: Flight, block: int, unit: List[Tuple[int, int]], threads: int,
                    retry: int = 0) -> BatchCall:
        """``run_rollout_group`` of ``unit``'s plan tasks, each actor after its previous task (a retry: after
        nothing, or the state a resume stored for that task)."""
        actors = list(dict.fromkeys(a for a, _ in unit))
        first = {a: min(k for b, k in unit if b == a) for a in actors}
        if retry:
            stored = getattr(self, "stored_states", {})
            after = {a: stored[a] for a in actors if a in stored and stored[a].task == first[a]}
        else:
            after = {a: f.last_task[a] for a in actors if f.last_task.get(a) is not None}
        specs = [(self.actor_specs[a], k, self.cfg.actors.steps_per_task, self._explore(f, a, block),
                  self._captures(f, k)) for a, k in unit]
        key = f"rollout-{self.run_id}-b{block}-a{actors[0]}" + (f"-r{retry}" if retry else "")
        return BatchCall(args=(f.block_ref[block][0], specs), kwargs={"after": after, "threads": threads},
                         key=key, actor=actors[0])

    def _explore(self, f: Flight, a: int, block: int) -> Dict[str, float]:
        # Exploration follows the plan's env steps (block start), not the steps that happen to be done.
        return self.builder.exploration(self.cfg.agent, block * f.plan.block_rows, a)

    @staticmethod
    def _captures(f: Flight, k: int) -> bool:
        """An actor's last task of the block returns its env state, stored in the block's shard (resume)."""
        return k % f.plan.tasks_per_block == f.plan.tasks_per_block - 1

    def _resubmit_unit(self, f: Flight, block: int, i: int, retry: int):
        """Rollout task ``i`` of the block again (its group: ``f.rollout_tasks[block][i]``)."""
        # its worker may be another now, of unknown threads: its actors run one after another
        call = self._group_call(f, block, f.rollout_tasks[block][i], 1, retry=retry)
        return self.executor.submit(stages.run_rollout_group, *call.args, key=call.key, actor=call.actor,
                                    **call.kwargs)

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
        for i, unit in enumerate(f.rollout_tasks[block]):
            if f.rollouts[block][i].cancelled():
                for a, k in unit:
                    self.log.write("task_lost", step=self.loop.env_steps, task=f"rollout actor {a} task {k}")
                f.rollouts[block][i] = self._resubmit_unit(f, block, i, retry=f.retries)
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
        f.rollout_tasks.pop(c, None)
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
