"""D4PG networks: a deterministic tanh policy (what actors run) and a categorical critic.

* Policy ``pi: obs -> [-1, 1]^act_dim``, a plain ``keras.Sequential`` MLP with
  a tanh output (:func:`core.networks.mlp`), so the quantizer converts and
  patches it like DQN's Q-network. Actions are normalized: the actor-side
  selector maps ``[-1, 1]`` affinely onto the env's bounds, and the learner
  maps stored env actions back (:func:`normalize_actions`).
* Critic ``Z: (obs, a) -> logits [num_atoms]`` over the fixed support
  ``z_i = v_min + i * dz``, ``dz = (v_max - v_min) / (num_atoms - 1)``; the
  input is ``concat(obs, a)``. ``Q(s, a) = sum_i softmax(logits)_i z_i``.
  The critic stays on the learner, in fp32, and is never quantized.

Example::

    policy, critic = make_networks(obs_dim=3, act_dim=1, cfg=D4PGConfig(), seed=0)
    a = policy(obs)                                   # [B, 1] in [-1, 1]
    logits = critic(tf.concat([obs, a], -1))          # [B, 51]
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

from core.networks import mlp


def make_networks(obs_dim: int, act_dim: int, cfg, seed: int = 0, name: str = ""):
    """(policy, critic) Keras models for D4PG config ``cfg``."""
    policy = mlp(obs_dim, cfg.policy_hidden, act_dim, name=f"{name}policy", seed=seed,
                 output_activation="tanh")
    critic = mlp(obs_dim + act_dim, cfg.critic_hidden, cfg.num_atoms, name=f"{name}critic", seed=seed + 101)
    return policy, critic


def support(v_min: float, v_max: float, num_atoms: int) -> np.ndarray:
    """Atoms ``z_i = v_min + i (v_max - v_min) / (num_atoms - 1)``, float32."""
    return np.linspace(v_min, v_max, num_atoms, dtype=np.float32)


def action_scale(low: Sequence[float], high: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """(mid, half) so that ``a_env = mid + half * a_norm`` for ``a_norm`` in [-1, 1]."""
    low, high = np.asarray(low, np.float32), np.asarray(high, np.float32)
    return (high + low) / 2, (high - low) / 2


def normalize_actions(actions: np.ndarray, low, high) -> np.ndarray:
    """Env-unit actions -> ``[-1, 1]`` (the policy's output space)."""
    mid, half = action_scale(low, high)
    return np.clip((np.asarray(actions, np.float32) - mid) / np.where(half > 0, half, 1.0), -1.0, 1.0)
