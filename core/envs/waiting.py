"""An env whose step takes a fixed wall time and (almost) no CPU: ``waiting:<shape>-<dtype>-<micros>us``.

A stand-in for an environment that runs elsewhere (a simulator on its own
cores, a robot, a remote game server): each ``step`` sleeps ``micros``
microseconds, so an actor that steps it waits instead of computing. The
driver-capacity benchmark (``benchmarks/studies/cluster_scale.py``) runs 64
of them on two cores: the actors cost almost nothing, and what is left is
the orchestration's central cost. Everything else is a real gymnasium env:

* ids: ``waiting:4-float32-2000us`` (CartPole-sized rows: 4 float32 per
  observation) or ``waiting:84x84x4-uint8-2000us`` (Atari-sized stacked
  frames); shape is ``x``-separated positive ints, dtype ``float32`` or
  ``uint8``, the step time ``0 <= micros <= 10_000_000``;
* ``Discrete(2)`` actions (ignored), reward ``+1`` per step, episodes
  truncated after :data:`EPISODE_STEPS` steps (or ``max_episode_steps``);
* observations drawn from the env's own ``np_random`` (seeded by
  ``reset(seed=...)``): uniform ``[0, 1)`` for float32, ``0..255`` for
  uint8, so rows are real, deterministic for a seed, and cost what rows of
  that size cost to store (random bytes hardly compress: a worst case for
  the shard writer, not a flattering one). Its state is the step counter
  and the RNG, so an actor's state is captured and restored like
  CartPole's (``core.actor_state``).

Example::

    env = make_env("waiting:4-float32-2000us")
    obs, _ = env.reset(seed=0)              # shape (4,), float32
    obs, r, term, trunc, _ = env.step(0)    # after ~2 ms of sleep; r == 1.0
"""
from __future__ import annotations

import re
import time
from typing import Optional, Tuple

import gymnasium
import numpy as np
from gymnasium import spaces

from core.envs import EnvError

#: Steps per episode unless ``max_episode_steps`` says otherwise (CartPole-v0's limit).
EPISODE_STEPS = 200
#: The longest step an id may ask for (10 s): a typo such as an extra zero should not hang a run.
MAX_MICROS = 10_000_000
DTYPES = ("float32", "uint8")
_ID = re.compile(r"^waiting:(?P<shape>\d+(?:x\d+)*)-(?P<dtype>[a-z0-9]+)-(?P<micros>\d+)us$")
VALID = "waiting:<shape>-<dtype>-<micros>us, e.g. waiting:4-float32-2000us or waiting:84x84x4-uint8-2000us"


def parse_env_id(env_id: str) -> Tuple[Tuple[int, ...], str, int]:
    """``(obs shape, dtype, step microseconds)`` of a waiting env id; EnvError (one line) if malformed."""
    m = _ID.match(env_id)
    if m is None:
        raise EnvError(f"unknown waiting env id {env_id!r}; valid: {VALID}")
    shape = tuple(int(d) for d in m["shape"].split("x"))
    micros = int(m["micros"])
    if min(shape) < 1:
        raise EnvError(f"waiting env id {env_id!r}: every observation dimension must be >= 1; valid: {VALID}")
    if m["dtype"] not in DTYPES:
        raise EnvError(f"waiting env id {env_id!r}: dtype {m['dtype']!r}; valid: {', '.join(DTYPES)}")
    if micros > MAX_MICROS:
        raise EnvError(f"waiting env id {env_id!r}: a step of {micros} us; valid: 0..{MAX_MICROS} us")
    return shape, m["dtype"], micros


def check_env_id(env_id: str) -> None:
    """Raise EnvError (naming the valid form) unless ``env_id`` is a well-formed waiting env id."""
    parse_env_id(env_id)


class WaitingEnv(gymnasium.Env):
    """Sleeps ``step_s`` per step; random observations of ``shape``/``dtype``; reward 1 (module docstring).

    A module-level class, so the env pickles (an actor's state travels between Beam stages).
    """
    metadata = {"render_modes": []}
    action_space = spaces.Discrete(2)

    def __init__(self, shape: Tuple[int, ...], dtype: str, step_s: float):
        self.step_s = float(step_s)
        self.dtype = dtype
        self.observation_space = (spaces.Box(0.0, 1.0, shape, np.float32) if dtype == "float32"
                                  else spaces.Box(0, 255, shape, np.uint8))
        self.t = 0

    def _observe(self) -> np.ndarray:
        shape = self.observation_space.shape
        if self.dtype == "float32":
            return self.np_random.random(shape, dtype=np.float32)
        return self.np_random.integers(0, 256, shape, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        if self.step_s > 0:
            time.sleep(self.step_s)     # the env "runs elsewhere": wall time, no CPU
        self.t += 1
        return self._observe(), 1.0, False, False, {}


def make_env(env_id: str, max_episode_steps: Optional[int] = None):
    """One waiting env (see module docstring), truncated after ``max_episode_steps`` or EPISODE_STEPS."""
    shape, dtype, micros = parse_env_id(env_id)
    return gymnasium.wrappers.TimeLimit(WaitingEnv(shape, dtype, micros / 1e6),
                                        max_episode_steps or EPISODE_STEPS)
