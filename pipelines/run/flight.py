"""The state of one training run's loop: checkpointed counters and what is in flight.

:class:`LoopState` holds the driver's counters that are checkpointed with the
learner (env steps, versions, best evaluation, the next block), so
``--resume`` continues from them, together with what the blocks after the
checkpoint need to follow the plan exactly: the policy version each of them
acts with, the evaluations still undecided, the evaluation and broadcast
cadence.

:class:`Flight` is the driver's (:mod:`pipelines.run.driver`) bookkeeping of one
``Trainer.run`` that is not checkpointed: futures of the blocks in flight,
published versions still needed, pending evaluations, timings. It is rebuilt
on resume from the checkpointed ``LoopState`` and the commit log. It also
names what the next commit waits for, which the stall error reports::

    f = Flight.begin(trainer)
    f.version_for(block)      # (payload ref, version) the block acts with, or None while unpublished
    f.waiting_for()           # [("shard write s00000007 (rollouts a0001-t0000007)", future), ...]
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

import numpy as np

from core.config import ConfigError
from pipelines.run.plan import TrainingPlan
from pipelines.run.stages import shard_id_for
from pipelines.run.summary import WorkerStats

#: Least seconds without progress before a run is declared stalled (first tasks start workers).
STALL_MIN_S = 120.0


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
    block: int = 0          # learner blocks done: the next one to train (pipelines.run.plan)
    # What the blocks after a checkpoint need, so that --resume continues the plan exactly
    # (written by Trainer._checkpoint; None / empty in checkpoints from before they existed):
    versions: Dict[str, int] = dataclasses.field(default_factory=dict)   # learner block -> version in use
    pending_evals: List[List[int]] = dataclasses.field(default_factory=list)  # [block, version, env steps, n]
    n_evals: int = 0                       # evaluations submitted (their seeds follow it)
    next_eval: Optional[int] = None        # env steps of the next evaluation
    last_broadcast_step: Optional[int] = None   # learner steps when the newest version was made


class StallError(ConfigError):
    """Training cannot progress (one line naming what it waits for); exit 2 in the CLI."""



@dataclasses.dataclass
class Flight:
    """Bookkeeping of one ``Trainer.run`` that is not checkpointed (rebuilt on resume)."""
    start: float
    plan: TrainingPlan
    base_block: int                      # loop.block at the start of this run (resume point)
    initial: Tuple[Any, int]             # (payload ref, version) for blocks before base_block's versions
    next_submit: int                     # next block whose rollouts to submit
    next_commit: int                     # next block to commit
    precommitted: Dict[int, int]         # resume: block -> rows, committed before the restart
    next_eval: int
    last_ckpt_step: int
    last_broadcast_step: int
    versions: Dict[int, Tuple[Any, int]] = dataclasses.field(default_factory=dict)  # learner block -> ref, version
    block_retries: Dict[int, int] = dataclasses.field(default_factory=dict)   # block -> lost-task resubmissions
    rollouts: Dict[int, List[Any]] = dataclasses.field(default_factory=dict)        # block -> rollout futures
    rollout_tasks: Dict[int, List[List[Tuple[int, int]]]] = dataclasses.field(   # block -> each one's (a, k)s
        default_factory=dict)
    block_ref: Dict[int, Tuple[Any, int]] = dataclasses.field(default_factory=dict)  # block -> its version
    writes: Dict[int, Any] = dataclasses.field(default_factory=dict)                # block -> write future
    last_task: Dict[int, Any] = dataclasses.field(default_factory=dict)             # actor -> latest rollout
    learning: Any = None                 # the learner stage's call for block loop.block, while it runs
    learning_since: float = 0.0
    evals: Deque[Tuple[int, Any, int]] = dataclasses.field(default_factory=deque)    # (block, future, env steps)
    eval_submitted: Dict[Any, float] = dataclasses.field(default_factory=dict)       # future -> submit time
    eval_meta: Dict[Any, Tuple[int, int]] = dataclasses.field(default_factory=dict)  # future -> (version, n)
    eval_ref: Dict[Any, Any] = dataclasses.field(default_factory=dict)       # future -> the payload it evaluates
    eval_retries: Dict[int, int] = dataclasses.field(default_factory=dict)   # n -> lost-evaluation resubmissions
    recent_returns: deque = dataclasses.field(default_factory=lambda: deque(maxlen=20))
    lags: deque = dataclasses.field(default_factory=lambda: deque(maxlen=50))   # (versions, seconds)
    driver_bytes: int = 0                # pickled size of every result the driver materialized (stages' too)
    trajectory_bytes: int = 0            # in-memory size of the committed batches
    last_progress: float = 0.0
    lag_logged: float = 0.0              # when the last policy_lag record was written
    slowest_task_s: float = 0.0          # slowest rollout or evaluation so far (the stall bound is 10x)
    retries: int = 0
    stop: bool = False
    busy_s: Dict[str, float] = dataclasses.field(default_factory=dict)   # driver seconds per loop phase
    stage_s: Dict[str, float] = dataclasses.field(default_factory=dict)  # learner stage's own seconds, by part
    idle_s: Dict[str, float] = dataclasses.field(   # driver (learner) idle seconds, by what it waited for
        default_factory=lambda: {"shard": 0.0, "evaluation": 0.0, "learner": 0.0, "other": 0.0})

    @classmethod
    def begin(cls, trainer: "Trainer") -> "Flight":
        cfg, loop = trainer.cfg, trainer.loop
        trainer.worker_stats = WorkerStats()   # per-worker tasks / retries / env steps/s (progress + metrics)
        every = cfg.eval.every_env_steps
        pre = trainer.precommitted
        first_new = max([loop.block - 1, *pre]) + 1
        now = time.time()
        f = cls(start=now, plan=trainer.plan, base_block=loop.block,
                initial=(trainer.payload_ref, trainer.loop.policy_version), next_submit=first_new,
                next_commit=loop.block, precommitted=pre,
                next_eval=loop.next_eval if loop.next_eval is not None else (loop.env_steps // every + 1) * every,
                last_ckpt_step=trainer.learner_steps,
                last_broadcast_step=(loop.last_broadcast_step if loop.last_broadcast_step is not None
                                     else trainer.learner_steps), last_progress=now)
        f.versions.update(getattr(trainer, "restored_refs", {}))   # resume: the checkpoint's versions
        f.last_task.update(getattr(trainer, "stored_states", {}))  # resume: actors continue stored states
        return f

    def lag_due(self, every_s: float = 2.0) -> bool:
        """True every ``every_s`` seconds while there are policy-lag samples (the ``policy_lag`` record)."""
        if not self.lags or time.time() - self.lag_logged <= every_s:
            return False
        self.lag_logged = time.time()
        return True

    def lag_summary(self) -> Dict[str, float]:
        """Policy lag of the recent tasks, in versions and seconds (mean and max)."""
        versions, seconds = [l[0] for l in self.lags], [l[1] for l in self.lags]
        return {"versions_mean": float(np.mean(versions)), "versions_max": int(max(versions)),
                "seconds_mean": float(np.mean(seconds)), "seconds_max": float(max(seconds))}

    def timed(self, phase: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, its seconds added to ``busy_s[phase]`` (the ``schedule`` record)."""
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.busy_s[phase] = self.busy_s.get(phase, 0.0) + time.perf_counter() - t0

    def version_for(self, block: int) -> Optional[Tuple[Any, int]]:
        """The (ref, version) block ``block`` acts with, or None while its learner block is not done."""
        pb = self.plan.policy_block(block)
        if pb in self.versions:
            return self.versions[pb]
        return self.initial if pb < self.base_block else None

    def waiting_for(self) -> List[Tuple[str, Any]]:
        """What the next commit waits for, named: the learner block, the write (or its rollouts), an evaluation."""
        c = self.next_commit
        if self.learning is not None and not self.learning.done():
            return [(f"learner block {c - 1}", self.learning)]
        out = [(f"evaluation of block {b}", fut) for b, fut, _ in self.evals
               if b <= self.plan.decides_stop_before(c) and not fut.done()]
        fut = self.writes.get(c)
        if fut is not None and not fut.done():
            names = [f"a{a:04d}-t{k:07d}" for unit, r in zip(self.rollout_tasks[c], self.rollouts[c])
                     if not r.done() for a, k in unit]
            out.append((f"shard write {shard_id_for(c)}" + (f" (rollouts {' '.join(names)})" if names else ""),
                        fut))
        return out
