"""Partially observable variants of classic-control envs: ``pomdp:<gymnasium id>``.

A POMDP here is the gymnasium env with some observation components removed,
so a feed-forward policy cannot recover the Markov state from one
observation and a recurrent one (R2D2's LSTM) must integrate over time:

* ``pomdp:CartPole-v1``: CartPole with the velocities hidden. The full state
  is ``[x, x_dot, theta, theta_dot]``; the observation is ``[x, theta]``
  (float32, ``Box`` bounds of those two components). Dynamics, reward (+1 per
  step), termination and the 500-step time limit are CartPole-v1's.

Example::

    env = make_env("pomdp:CartPole-v1")
    obs, _ = env.reset(seed=0)        # shape (2,): [x, theta]
"""
from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

import numpy as np

from core.envs import EnvError

#: pomdp id -> (gymnasium id, indices of the state components that stay observed)
VARIANTS: Dict[str, Tuple[str, Tuple[int, ...]]] = {
    "CartPole-v1": ("CartPole-v1", (0, 2)),
}


def _name(env_id: str) -> str:
    return env_id.split(":", 1)[1]


def check_env_id(env_id: str) -> None:
    """Raise EnvError (naming the valid ids) unless ``env_id`` is a known POMDP variant."""
    if _name(env_id) not in VARIANTS:
        valid = ", ".join(f"pomdp:{k}" for k in VARIANTS)
        raise EnvError(f"unknown POMDP env id {env_id!r}; valid: {valid}")


def _observe(obs, keep: np.ndarray) -> np.ndarray:
    """The kept components of a full observation, float32."""
    return np.asarray(obs, np.float32)[keep]


def make_env(env_id: str, max_episode_steps: Optional[int] = None):
    """The gymnasium env of ``env_id`` wrapped to observe only the kept components."""
    import gymnasium
    from gymnasium import spaces
    check_env_id(env_id)
    base_id, keep = VARIANTS[_name(env_id)]
    kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    env = gymnasium.make(base_id, **kwargs)
    idx = np.asarray(keep)
    box = env.observation_space
    space = spaces.Box(box.low[idx].astype(np.float32), box.high[idx].astype(np.float32), dtype=np.float32)
    # A partial of a module function, not a lambda: the env pickles (an actor's state travels between
    # Beam stages as a snapshot) and core.actor_state skips it as code.
    return gymnasium.wrappers.TransformObservation(env, functools.partial(_observe, keep=idx), space)
