"""The training plan: what a run does, fixed by its config and seed, whatever the executor.

A run is a sequence of *blocks*. Block ``b`` is::

    rollouts  : every actor a runs tasks  k = b*G .. b*G+G-1       (G = tasks_per_block)
                with the policy version published after learner block  b - 1 - policy_lag
    write     : those tasks' batches -> shard  s{b:08d}              (actor-major order)
    commit    : shard b, one log entry, after learner block b-1 ends (the cache holds exactly
                the shards of blocks <= b while block b trains)
    learn     : learner steps up to  target(b) = floor(replay_ratio * rows(<= b))
                (0 while rows(<= b) < replay.min_size), in calls of steps_per_call,
                sampled with  rng(b) = default_rng([seed, 7, b])
    publish   : a new policy version if broadcast_period learner steps passed since the last
    evaluate  : when rows(<= b) crosses a multiple of eval.every_env_steps
    stop      : before committing block c, every evaluation of a block <= c - STOP_DELAY is
                awaited; a solved one ends the run there (blocks >= c are never committed)
    checkpoint: when checkpoint.every_steps learner steps passed since the last

Everything an executor could change by timing is fixed here: which version a
task uses (``policy_block``), which shards a learner block sees, how many
steps it takes and with which RNG, and where the run stops. Pipelining stays:
with ``policy_lag = L`` the actors of blocks ``b+1 .. b+L`` run while the
learner trains block ``b`` (L = 0 is strictly sequential).

Example::

    plan = TrainingPlan.from_config(cfg)
    plan.tasks(3)            # [(actor, task_index), ...] of block 3
    plan.policy_block(3)     # 1: block 3 acts with the version published after learner block 1
"""
from __future__ import annotations

import dataclasses
import math
from typing import List, Tuple

import numpy as np

#: Blocks between an evaluation and the commit that must wait for its result (see module docstring).
#: Evaluations run beside rollouts; 3 blocks (~3 s of the default run) hide their latency.
STOP_DELAY = 3


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """A run's deterministic schedule (see module docstring)."""
    seed: int
    num_actors: int
    tasks_per_block: int       # G: tasks per actor per block
    task_rows: int             # env steps of one task (num_envs x steps_per_task)
    num_blocks: int
    policy_lag: int
    replay_ratio: float
    min_size: int
    steps_per_call: int

    @classmethod
    def from_config(cls, cfg) -> "TrainingPlan":
        """Blocks of about the shard flush size (``replay.shard_max_rows``, default one round of tasks)."""
        task_rows = cfg.env.num_envs * cfg.actors.steps_per_task
        round_rows = task_rows * cfg.actors.num_actors
        flush = cfg.replay.shard_max_rows or max(round_rows, 512)
        g = max(1, math.ceil(flush / round_rows))
        return cls(seed=cfg.seed, num_actors=cfg.actors.num_actors, tasks_per_block=g, task_rows=task_rows,
                   num_blocks=max(1, math.ceil(cfg.total_env_steps / (round_rows * g))),
                   policy_lag=cfg.actors.policy_lag, replay_ratio=cfg.learner.replay_ratio,
                   min_size=cfg.replay.min_size, steps_per_call=cfg.learner.steps_per_call)

    @property
    def block_rows(self) -> int:
        return self.task_rows * self.num_actors * self.tasks_per_block

    def tasks(self, block: int) -> List[Tuple[int, int]]:
        """``(actor, task_index)`` of the block's tasks, in shard order (actor-major)."""
        g = self.tasks_per_block
        return [(a, block * g + i) for a in range(self.num_actors) for i in range(g)]

    def first_block_of_task(self, task_index: int) -> int:
        return task_index // self.tasks_per_block

    def policy_block(self, block: int) -> int:
        """The learner block after which the version block ``block`` acts with was published (-1: initial)."""
        return max(-1, block - 1 - self.policy_lag)

    def learner_target(self, rows_through_block: int) -> int:
        """Learner steps due once ``rows_through_block`` rows are committed."""
        if rows_through_block < self.min_size:
            return 0
        return int(self.replay_ratio * rows_through_block)

    def calls(self, steps_done: int, target: int) -> List[int]:
        """The learner calls of one block: ``steps_per_call`` each, the last one shorter."""
        n = max(0, target - steps_done)
        return [self.steps_per_call] * (n // self.steps_per_call) + ([n % self.steps_per_call]
                                                                     if n % self.steps_per_call else [])

    def sampler_rng(self, block: int) -> np.random.Generator:
        """The sampler's RNG of learner block ``block`` (a stream of its own: resume needs no RNG state)."""
        return np.random.default_rng([self.seed, 7, block])

    def calibration_rng(self, version: int) -> np.random.Generator:
        """RNG of the int8-full calibration sample of ``version`` (apart from the sampler's streams)."""
        return np.random.default_rng([self.seed, 8, version])

    def decides_stop_before(self, block: int) -> int:
        """Evaluations of blocks <= this one are awaited before block ``block`` commits."""
        return block - STOP_DELAY

    # -- the plan's row count per block; the per-block rules (version, checkpoint, evaluation decisions) that
    # the driver and Beam's round pipelines share are pipelines.run.block_rules, functions of this plan.
    def rows_through(self, block: int) -> int:
        """Rows committed once blocks ``0 .. block`` are (every block writes ``block_rows``)."""
        return (block + 1) * self.block_rows
