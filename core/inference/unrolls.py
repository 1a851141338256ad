"""UnrollAssembler: server-side RLDS rows for one actor's envs -> TrajectoryBatch unrolls.

The server sees, per step of an actor's ``E`` envs, ``(o_t, r_{t-1},
terminated_t, truncated_t)`` and decides ``a_t``. The row of step ``t`` is
complete only when ``r_t`` arrives with the next message, so one pending row
is held per actor::

    message t   : pending row (t-1) gets reward r_{t-1} -> appended to the unroll
                  new pending row t = (o_t, a_t, terminated_t, truncated_t, ...)
    every T rows: emit TrajectoryBatch [T, E]   (episodes continue in the next unroll)

Rows follow :mod:`core.trajectory` exactly as the local actor loop writes them:
a last row (terminated or truncated) holds the final observation, a padding
action 0 and reward 0; the next row starts ``step == 0`` of a new episode.

Episode ids are ``make_episode_id(actor_id * E + i, (connection << 20) | n)``:
a reconnecting actor gets a new ``connection`` number, so its fresh episodes
never collide with the ones of its previous connection (SEED's run_id). Rows
held for an unfinished unroll of a dropped connection are discarded; earlier
unrolls of that episode stay in replay without a last row, and samplers never
start a sequence that needs the missing successors.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from core.trajectory import TrajectoryBatch, make_episode_id


class UnrollAssembler:
    """Assembles ``[T, E]`` TrajectoryBatches for one actor connection."""

    def __init__(self, actor_id: int, num_envs: int, unroll_length: int, connection: int,
                 env_id: str = "", seed: int = 0):
        self.actor_id, self.num_envs, self.length = int(actor_id), int(num_envs), int(unroll_length)
        self.connection, self.env_id, self.seed = int(connection), env_id, int(seed)
        e = self.num_envs
        self.streams = self.actor_id * e + np.arange(e, dtype=np.int64)
        self.episodes_started = np.zeros(e, np.int64)
        self.episode_id = np.zeros(e, np.int64)
        self.step = np.zeros(e, np.int32)
        self.episode_return = np.zeros(e, np.float64)
        self.pending: Optional[Dict[str, np.ndarray]] = None
        self.rows: List[Dict[str, np.ndarray]] = []
        self.unrolls = 0
        self.finished_returns: List[float] = []
        self.finished_lengths: List[int] = []

    def _new_episodes(self, which: np.ndarray) -> None:
        counter = (np.int64(self.connection) << 20) | self.episodes_started
        self.episode_id = np.where(which, make_episode_id(self.streams, counter), self.episode_id)
        self.episodes_started += which
        self.step = np.where(which, 0, self.step).astype(np.int32)
        self.episode_return[which] = 0.0

    def add(self, obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
            action: np.ndarray, extras: Dict[str, np.ndarray], policy_version: int) -> Optional[TrajectoryBatch]:
        """Record one step of all envs; returns a TrajectoryBatch every ``unroll_length`` rows."""
        last = terminated | truncated
        if self.pending is None:
            self._new_episodes(np.ones(self.num_envs, bool))
        else:
            prev_last = self.pending["terminated"] | self.pending["truncated"]
            r = np.where(prev_last, 0.0, reward).astype(np.float32)
            self.pending["reward"] = r
            self.rows.append(self.pending)
            self.episode_return += r
            self.step = (self.step + 1).astype(np.int32)
            self._new_episodes(prev_last)
        for j in np.flatnonzero(last):
            self.finished_returns.append(float(self.episode_return[j]))
            self.finished_lengths.append(int(self.step[j]))
        pad = last.reshape((-1,) + (1,) * (np.ndim(action) - 1))
        self.pending = {"observation": np.array(obs), "action": np.where(pad, 0, action),
                        "discount": np.where(terminated, 0.0, 1.0).astype(np.float32),
                        "terminated": np.array(terminated, bool), "truncated": np.array(truncated, bool),
                        "episode_id": self.episode_id.copy(), "step": self.step.copy(),
                        "policy_version": np.full(self.num_envs, policy_version, np.int64),
                        **{f"extras/{k}": np.array(v) for k, v in extras.items()}}
        if len(self.rows) < self.length:
            return None
        return self._emit()

    def _emit(self) -> TrajectoryBatch:
        rows, self.rows = self.rows[:self.length], self.rows[self.length:]
        # [T, E] views of env-major storage, the order shards store rows in (trajectory.step_buffer).
        col = {k: np.stack([r[k] for r in rows], axis=1).swapaxes(0, 1) for k in rows[0]}
        extras = {k.split("/", 1)[1]: v for k, v in col.items() if k.startswith("extras/")}
        batch = TrajectoryBatch(
            observation=col["observation"], action=col["action"], reward=col["reward"], discount=col["discount"],
            terminated=col["terminated"], truncated=col["truncated"], episode_id=col["episode_id"],
            step=col["step"], policy_version=col["policy_version"], extras=extras, env_id=self.env_id,
            actor_id=self.actor_id, task_id=f"c{self.connection:06d}-a{self.actor_id:04d}-u{self.unrolls:07d}",
            seed=self.seed)
        self.unrolls += 1
        return batch

    def pop_episodes(self):
        """Returns and clears ``(returns, lengths)`` of episodes finished since the last call."""
        out = (self.finished_returns, self.finished_lengths)
        self.finished_returns, self.finished_lengths = [], []
        return out
