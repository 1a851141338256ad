"""Action selectors run by actors on top of the policy network's output.

Each selector maps the LiteRT policy output for E envs to actions, given
per-task parameters from the agent builder, and may return extras that are
stored in replay (e.g. behaviour log-probs for V-trace)::

    actions, extras = SELECTORS["epsilon_greedy"](q_values, {"epsilon": 0.1}, rng, spec)

* ``epsilon_greedy``: argmax of Q, replaced by a uniform action w.p. epsilon.
* ``gaussian``: deterministic action + N(0, sigma^2) noise, clipped to the
  action bounds (D4PG / DDPG exploration).
* ``categorical``: sample from softmax(logits); extras hold the behaviour
  policy's ``logits`` (so off-policy corrections use the policy that really
  acted, quantized or not).
"""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import numpy as np

Selector = Callable[[np.ndarray, Dict[str, float], np.random.Generator, object],
                    Tuple[np.ndarray, Dict[str, np.ndarray]]]


def epsilon_greedy(q_values: np.ndarray, params: Dict[str, float], rng: np.random.Generator,
                   spec=None) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """Greedy actions, each replaced by a uniform one with probability ``epsilon``."""
    epsilon = float(params.get("epsilon", 0.0))
    greedy = np.argmax(q_values, axis=-1)
    if epsilon <= 0.0:
        return greedy.astype(np.int64), {}
    explore = rng.random(greedy.shape[0]) < epsilon
    random = rng.integers(q_values.shape[-1], size=greedy.shape[0])
    return np.where(explore, random, greedy).astype(np.int64), {}


def gaussian(actions: np.ndarray, params: Dict[str, float], rng: np.random.Generator,
             spec=None) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """``clip(a + sigma * N(0, 1), low, high)``; ``sigma = 0`` is the deterministic policy."""
    sigma = float(params.get("sigma", 0.0))
    a = actions.astype(np.float32)
    if sigma > 0.0:
        a = a + sigma * rng.standard_normal(a.shape).astype(np.float32)
    if spec is not None and spec.action_low is not None:
        a = np.clip(a, np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32))
    return a.astype(np.float32), {}


def tanh_gaussian(actions: np.ndarray, params: Dict[str, float], rng: np.random.Generator,
                  spec=None) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """A tanh policy's ``x`` in [-1, 1] -> ``mid + half * clip(x + sigma * N(0, 1), -1, 1)``.

    ``mid = (high + low) / 2``, ``half = (high - low) / 2`` of the spec's bounds, so
    ``sigma`` is in units of the half action range (D4PG actors; learners map back).
    """
    x, _ = gaussian(actions, params, rng, None)
    x = np.clip(x, -1.0, 1.0)
    if spec is not None and spec.action_low is not None:
        low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
        x = (high + low) / 2 + (high - low) / 2 * x
    return x.astype(np.float32), {}


def categorical(logits: np.ndarray, params: Dict[str, float], rng: np.random.Generator,
                spec=None) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """Sample ``a ~ softmax(logits)`` (greedy if ``params["greedy"]``); extras: behaviour logits."""
    logits = logits.astype(np.float32)
    if params.get("greedy", 0.0):
        return np.argmax(logits, axis=-1).astype(np.int64), {"logits": logits}
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    u = rng.random((logits.shape[0], 1))
    actions = np.minimum((p.cumsum(axis=-1) < u).sum(axis=-1), logits.shape[-1] - 1)
    return actions.astype(np.int64), {"logits": logits}


SELECTORS: Dict[str, Selector] = {
    "epsilon_greedy": epsilon_greedy,
    "gaussian": gaussian,
    "tanh_gaussian": tanh_gaussian,
    "categorical": categorical,
    "recurrent_epsilon_greedy": epsilon_greedy,   # on the q part of a recurrent policy (see CARRIES)
}

#: Selectors whose policy is recurrent (payload ``[obs, h, c] -> [q, h', c']``): the actor keeps a
#: carry between steps, built by :func:`make_carry` ("module:Class" with ``for_payload``).
CARRIES: Dict[str, str] = {
    "recurrent_epsilon_greedy": "core.agents.r2d2.actor:LSTMCarry",
}


def make_carry(selector: str, payload, num_envs: int, obs_dim: int):
    """The recurrent state carried between steps for ``selector``'s policy, or None if feed-forward.

    A carry is called as ``out, extras = carry(policy, obs, reset)`` in place
    of ``policy(obs)``: it zeroes the state where ``reset`` (first row of an
    episode), runs the policy on ``[obs, state]`` and keeps the new state;
    ``extras`` (the state the step started from) go to replay.
    """
    if selector not in CARRIES:
        return None
    import importlib
    module, name = CARRIES[selector].split(":")
    return getattr(importlib.import_module(module), name).for_payload(payload, num_envs, obs_dim)


def greedy_params(selector: str) -> Dict[str, float]:
    """Selector parameters for greedy evaluation."""
    return {"epsilon_greedy": {"epsilon": 0.0}, "gaussian": {"sigma": 0.0}, "tanh_gaussian": {"sigma": 0.0},
            "categorical": {"greedy": 1.0}, "recurrent_epsilon_greedy": {"epsilon": 0.0}}[selector]
