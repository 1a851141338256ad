"""Policy evaluation: N full episodes with a (quantized) policy, vectorized.

Each of ``episodes`` envs plays exactly one episode (greedy unless
``epsilon > 0``); envs that finish wait for the rest. Seeds are
``seed + i``, so evaluations are reproducible and independent of training
seeds when callers pass a distinct ``seed``.

Example::

    returns = evaluate_payload(payload, "CartPole-v1", episodes=20, seed=10_000)
    returns.mean()
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from core.envs import make_vector_env
from core.rollout import epsilon_greedy


def evaluate_payload(payload, env_id: str, episodes: int = 20, seed: int = 10_000,
                     epsilon: float = 0.0, max_episode_steps: Optional[int] = None,
                     num_threads: int = 1) -> np.ndarray:
    """Undiscounted returns of ``episodes`` episodes acted by ``payload``'s LiteRT policy."""
    from core.policy import LiteRTPolicy
    envs, obs = make_vector_env(env_id, episodes, seed, max_episode_steps)
    policy = LiteRTPolicy(payload, batch_size=episodes, num_threads=num_threads)
    rng = np.random.default_rng(seed)
    returns = np.zeros(episodes, np.float64)
    done = np.zeros(episodes, bool)
    try:
        while not done.all():
            q = policy(obs.reshape(episodes, -1).astype(np.float32, copy=False))
            obs, reward, terminated, truncated, _ = envs.step(epsilon_greedy(q, epsilon, rng))
            returns += np.where(done, 0.0, reward)
            done |= terminated | truncated
    finally:
        envs.close()
    return returns.astype(np.float32)


def run_evaluation_task(payload, env_id: str, episodes: int, seed: int,
                        max_episode_steps: Optional[int] = None) -> dict:
    """The evaluation stage as a schedulable task: returns a small JSON-able dict."""
    returns = evaluate_payload(payload, env_id, episodes, seed, 0.0, max_episode_steps)
    return {"version": int(payload.version), "precision": payload.precision,
            "mean": float(returns.mean()), "std": float(returns.std()),
            "min": float(returns.min()), "returns": returns.tolist()}
