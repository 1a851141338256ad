"""UnrollAssembler: server-side RLDS rows of one actor connection -> one TrajectoryBatch per task.

The server sees, per step of an actor's ``E`` envs, ``(o_t, r_{t-1},
terminated_t, truncated_t)`` and decides ``a_t``. The row of step ``t`` is
complete only when ``r_t`` arrives with the next message, so one pending row
is held per connection. A connection's steps are cut into the plan's rollout
tasks (:mod:`pipelines.run.plan`): task ``k`` is rows ``(k - k0) * T .. + T - 1``
of a connection that starts at task ``k0``::

    message t : observe() -> pending row t-1 gets reward r_{t-1}; when it is the last row of its task,
                             that task's TrajectoryBatch [T, E] is returned (before a_t is decided, so
                             the learner never waits for a step that waits for the learner)
                act()     -> new pending row t = (o_t, a_t, terminated_t, truncated_t, ...)

Rows, episode ids and task ids follow :mod:`core.rollout` (the local actor)
exactly, so the same envs, actions and policy versions give the same replay
whichever inference path ran the policy: a last row (terminated or
truncated) holds the final observation, a padding action 0 and reward 0; an
episode whose previous one ended on a row of task ``k`` gets the counter
``(k << 10) | n`` (its ``n``-th start in task ``k``); the first episodes of a
connection get ``k0 << 10``; stream ids are ``actor * E + i`` with the
connection's *incarnation* in bits 21.. (0 for an actor's first connection,
like a local actor built from seeds; a reconnect is a rebuild, so its fresh
episodes never reuse the ids of episodes already in replay). Rows of an
unfinished task of a dropped connection are discarded; the reconnecting
actor plays that task again.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from core.trajectory import TrajectoryBatch, make_episode_id

#: Episodes an env may start within one task before ids could collide (core.rollout's bound).
EPISODES_PER_TASK = 1 << 10
#: Incarnations distinguishable in a stream id (bits 21..30 of the stream; they wrap beyond).
INCARNATIONS = 1 << 10


class UnrollAssembler:
    """Assembles one ``[T, E]`` TrajectoryBatch per task for one actor connection (module docstring)."""

    def __init__(self, actor_id: int, num_envs: int, unroll_length: int, first_task: int = 0,
                 incarnation: int = 0, env_id: str = "", seed: int = 0):
        self.actor_id, self.num_envs, self.length = int(actor_id), int(num_envs), int(unroll_length)
        self.first_task, self.env_id, self.seed = int(first_task), env_id, int(seed)
        e = self.num_envs
        inc = np.int64(int(incarnation) % INCARNATIONS)
        self.streams = (self.actor_id * e + np.arange(e, dtype=np.int64)) | (inc << 21)
        self.episode_id = make_episode_id(self.streams, np.int64(self.first_task) << 10)
        self.started_in_task = np.ones(e, np.int64)      # episode starts counted in `counted_task`
        self.counted_task = self.first_task
        self.step = np.zeros(e, np.int32)
        self.episode_return = np.zeros(e, np.float64)
        self.pending: Optional[Dict[str, np.ndarray]] = None
        self.rows: List[Dict[str, np.ndarray]] = []
        self.messages = 0                                  # steps observed on this connection
        self.returns: List[float] = []                     # episodes that ended in the current task
        self.lengths: List[int] = []
        self._first_new = np.ones(e, bool)               # a fresh connection starts every episode

    def resume(self, bookkeeping: Dict[str, np.ndarray]) -> None:
        """Continue a stored actor's episodes (``core.inference.states.ResumePoint``) instead of new ones."""
        for name, value in bookkeeping.items():
            setattr(self, name, value)
        self._first_new = self.step == 0                 # as a local actor: a row of step 0 starts one

    @property
    def ends_task(self) -> bool:
        """Whether the pending row (recorded by :meth:`act`) is the last row of its task."""
        return self.messages > 0 and (self.messages - 1) % self.length == self.length - 1

    @property
    def task(self) -> int:
        """The task of the step last observed (the pending row's, once :meth:`act` recorded it)."""
        return self.first_task + (self.messages - 1) // self.length

    def new_episode(self) -> np.ndarray:
        """Which envs start an episode with the step last observed (all, on a connection's first step)."""
        return self._new

    def observe(self, reward: np.ndarray, terminated: np.ndarray,
                truncated: np.ndarray) -> Optional[Tuple[int, TrajectoryBatch, List[float], List[int]]]:
        """Step ``t`` arrived with ``r_{t-1}``: complete row ``t-1``; its task's batch if that row ends it.

        Returns ``(task, batch, episode returns, episode lengths)`` of the finished task, or None. An
        episode that ends with step ``t``'s observation counts in row ``t-1``'s task (as locally).
        """
        done = None
        self._new = self._first_new
        if self.pending is not None:
            prev_task = self.first_task + (self.messages - 1) // self.length
            prev_last = self._new = self.pending["terminated"] | self.pending["truncated"]
            r = np.where(prev_last, 0.0, reward).astype(np.float32)
            self.pending["reward"] = r
            self.rows.append(self.pending)
            self.pending = None
            self.episode_return += r
            self._start_episodes(prev_last, prev_task)
            for j in np.flatnonzero(terminated | truncated):
                self.returns.append(float(self.episode_return[j]))
                self.lengths.append(int(self.step[j]))
            if len(self.rows) == self.length:
                done = (prev_task, self._emit(prev_task), self.returns, self.lengths)
                self.returns, self.lengths = [], []
        self.messages += 1
        return done

    def _start_episodes(self, which: np.ndarray, task: int) -> None:
        """Envs whose row of ``task`` was last start a new episode (ids as core.rollout assigns them)."""
        self.step = np.where(which, 0, self.step + 1).astype(np.int32)
        if not which.any():
            return
        if self.counted_task != task:
            self.started_in_task[:] = 0
            self.counted_task = task
        if (self.started_in_task[which] >= EPISODES_PER_TASK).any():
            raise RuntimeError("more than 1024 episodes started in one task; lower steps_per_task")
        counter = (np.int64(task) << 10) | self.started_in_task
        self.episode_id = np.where(which, make_episode_id(self.streams, counter), self.episode_id)
        self.started_in_task += which
        self.episode_return[which] = 0.0

    def act(self, obs: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, action: np.ndarray,
            extras: Dict[str, np.ndarray], policy_version: int) -> None:
        """Record the pending row of the step just observed (its reward comes with the next message)."""
        last = terminated | truncated
        pad = last.reshape((-1,) + (1,) * (np.ndim(action) - 1))
        self.pending = {"observation": np.array(obs), "action": np.where(pad, 0, action),
                        "discount": np.where(terminated, 0.0, 1.0).astype(np.float32),
                        "terminated": np.array(terminated, bool), "truncated": np.array(truncated, bool),
                        "episode_id": self.episode_id.copy(), "step": self.step.copy(),
                        "policy_version": np.full(self.num_envs, policy_version, np.int64),
                        **{f"extras/{k}": np.array(v) for k, v in extras.items()}}

    def _emit(self, task: int) -> TrajectoryBatch:
        rows, self.rows = self.rows, []
        # [T, E] views of env-major storage, the order shards store rows in (trajectory.step_buffer).
        col = {k: np.stack([r[k] for r in rows], axis=1).swapaxes(0, 1) for k in rows[0]}
        extras = {k.split("/", 1)[1]: v for k, v in col.items() if k.startswith("extras/")}
        return TrajectoryBatch(
            observation=col["observation"], action=col["action"], reward=col["reward"], discount=col["discount"],
            terminated=col["terminated"], truncated=col["truncated"], episode_id=col["episode_id"],
            step=col["step"], policy_version=col["policy_version"], extras=extras, env_id=self.env_id,
            actor_id=self.actor_id, task_id=f"a{self.actor_id:04d}-t{task:07d}", seed=self.seed)
