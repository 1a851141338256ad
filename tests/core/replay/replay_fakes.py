"""Shared fakes for replay tests: tiny trajectory batches with known values."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from core.trajectory import TrajectoryBatch, make_episode_id


def episode_rows(episode: int, steps: Sequence[int], rewards: Sequence[float], end: str = "") -> dict:
    """Rows of one env for one episode segment; ``end`` in {"", "terminated", "truncated"}.

    observation = [100 * episode + step, episode], so tests can identify rows.
    """
    n = len(steps)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    if end == "terminated":
        term[-1] = True
    elif end == "truncated":
        trunc[-1] = True
    steps = np.asarray(steps, np.int32)
    return dict(
        observation=np.stack([100.0 * episode + steps, np.full(n, float(episode))], 1).astype(np.float32),
        action=(steps % 2).astype(np.int64), reward=np.asarray(rewards, np.float32),
        discount=(~term).astype(np.float32), terminated=term, truncated=trunc,
        episode_id=np.full(n, episode, np.int64), step=steps,
        policy_version=np.full(n, 7, np.int64))


def batch_from_rows(*segments: dict, env_id: str = "CartPole-v1", task_id: str = "t") -> TrajectoryBatch:
    """One-env batch (E=1) whose rows are the concatenated segments, in order."""
    rows = {k: np.concatenate([s[k] for s in segments]) for k in segments[0]}
    return TrajectoryBatch(**{k: v[:, None] for k, v in rows.items()},
                           extras={"logits": np.stack([rows["reward"], -rows["reward"]], 1)[:, None]},
                           env_id=env_id, task_id=task_id)


def random_batch(seed: int, T: int = 64, E: int = 4, obs_shape=(4,), dtype=np.float32,
                 env_id: str = "CartPole-v1") -> TrajectoryBatch:
    """A CartPole-like rollout: episodes end (terminated/truncated) at random steps."""
    rng = np.random.default_rng(seed)
    ends = rng.random((T, E))
    term, trunc = ends < 0.04, (ends >= 0.04) & (ends < 0.06)
    step = np.zeros((T, E), np.int32)
    counter = np.zeros((T, E), np.int64)
    for t in range(1, T):
        done = term[t - 1] | trunc[t - 1]
        step[t] = np.where(done, 0, step[t - 1] + 1)
        counter[t] = counter[t - 1] + done
    stream = seed * E + np.arange(E)[None, :]
    if np.issubdtype(dtype, np.integer):
        obs = rng.integers(0, 255, (T, E, *obs_shape), dtype=dtype)
    else:
        obs = rng.standard_normal((T, E, *obs_shape)).astype(dtype)
    return TrajectoryBatch(
        observation=obs, action=rng.integers(0, 2, (T, E)).astype(np.int64),
        reward=rng.random((T, E)).astype(np.float32), discount=(~term).astype(np.float32),
        terminated=term, truncated=trunc, episode_id=make_episode_id(stream, counter), step=step,
        policy_version=np.full((T, E), seed, np.int64),
        extras={"logits": rng.standard_normal((T, E, 2)).astype(np.float32)},
        env_id=env_id, actor_id=seed, task_id=f"task{seed}", seed=seed)
