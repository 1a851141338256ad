r"""R2D2 acting: the Ape-X epsilon ladder and the recurrent state an actor carries.

Imports numpy only: actors never import TensorFlow.

**Epsilon ladder** (Ape-X, Horgan et al. 2018; R2D2): actor ``i`` of ``N``
acts epsilon-greedily with a fixed ::

    eps_i = eps^(1 + alpha * i / (N - 1))      (eps = 0.4, alpha = 7; eps_0 = eps when N = 1)

so ``N = 4`` gives ``0.4, 0.4^(10/3) = 0.04716, 0.4^(17/3) = 0.00556, 0.4^8 = 0.00066``.

**Carried state.** The policy payload is the step model of
:mod:`core.agents.r2d2.networks` (``[obs, h, c] -> [q, h', c']``).
:class:`LSTMCarry` keeps ``(h, c)`` per env between steps (and between the
actor's rollout tasks), zeroes it at the first row of every episode, and
reports the state *each step started from* as the replay extras
``lstm_h``/``lstm_c``: the learner starts a sequence from the extras of its
first row, so it sees the state the actor had (stale by however many policy
versions the actor lagged; R2D2's burn-in repairs that).

The same carry serves both inference paths: a local actor calls it with its
own LiteRT policy; the central inference server keeps one per connected actor
and splits the call around its dynamic batcher (:meth:`LSTMCarry.inputs`, the
batched policy call across actors, :meth:`LSTMCarry.absorb`), so both paths
store the same extras for the same observations. With pixels the carry gets
the stacked frames (``obs_dim = k * H * W``): local actors
(:mod:`core.rollout`) and the server stack them with the same FrameStacker
before the carry, so ``obs`` here is always the step model's observation part.

Example::

    carry = LSTMCarry(num_envs=8, obs_dim=2, num_actions=2, lstm_size=64)
    q, extras = carry(policy, obs, reset=step_in_episode == 0)   # extras["lstm_h"]: [8, 64]

    x, extras = carry.inputs(obs, reset)          # server side: [obs, h, c] rows for the batcher
    q = carry.absorb(batcher.submit(x).result())  # keeps h', c'; returns q
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np


def ladder_epsilon(actor_id: int, num_actors: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """``base^(1 + alpha * i / (N - 1))`` for ``i = actor_id mod N`` (see module docstring)."""
    n = max(int(num_actors), 1)
    i = int(actor_id) % n
    frac = i / (n - 1) if n > 1 else 0.0
    return float(base ** (1.0 + alpha * frac))


class LSTMCarry:
    """Per-env recurrent state of a recurrent policy (see module docstring)."""

    def __init__(self, num_envs: int, obs_dim: int, num_actions: int, lstm_size: int):
        self.obs_dim, self.num_actions, self.lstm_size = int(obs_dim), int(num_actions), int(lstm_size)
        self.h = np.zeros((num_envs, self.lstm_size), np.float32)
        self.c = np.zeros((num_envs, self.lstm_size), np.float32)

    @classmethod
    def for_payload(cls, payload, num_envs: int, obs_dim: int) -> "LSTMCarry":
        """Sizes from a payload's dims: ``input = D + 2H``, ``output = A + 2H``."""
        two_h = payload.input_dim - obs_dim
        if two_h <= 0 or two_h % 2:
            raise ValueError(f"payload input {payload.input_dim} is not [obs {obs_dim}, h, c]: "
                             f"not a recurrent (r2d2) policy")
        return cls(num_envs, obs_dim, payload.output_dim - two_h, two_h // 2)

    def __call__(self, policy: Callable[[np.ndarray], np.ndarray], obs: np.ndarray,
                 reset: np.ndarray) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """One step: zero the state where ``reset``, run ``policy`` on ``[obs, h, c]``, keep ``h', c'``.

        Returns ``(q [E, A], {"lstm_h", "lstm_c"})`` with the state the step started from.
        """
        x, extras = self.inputs(obs, reset)
        return self.absorb(policy(x)), extras

    def inputs(self, obs: np.ndarray, reset: np.ndarray) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
        """Zero the state where ``reset``; returns the policy input ``[obs, h, c]`` and the stored extras."""
        reset = np.asarray(reset, bool)
        self.h[reset] = 0.0
        self.c[reset] = 0.0
        extras = {"lstm_h": self.h.copy(), "lstm_c": self.c.copy()}
        x = np.concatenate([obs.reshape(len(obs), -1).astype(np.float32, copy=False), self.h, self.c], axis=1)
        return x, extras

    def absorb(self, out: np.ndarray) -> np.ndarray:
        """Keep ``h', c'`` from the policy output ``[q, h', c']``; returns ``q [E, A]``."""
        a, hs = self.num_actions, self.lstm_size
        self.h = np.ascontiguousarray(out[:, a:a + hs], np.float32)
        self.c = np.ascontiguousarray(out[:, a + hs:a + 2 * hs], np.float32)
        return out[:, :a]
