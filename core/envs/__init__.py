"""Environment adapters and vectorized stepping.

Every environment DataBloom trains on is reached through an env id string:

* ``CartPole-v1``, ``Pendulum-v1``, ... : any registered gymnasium id;
* ``<prefix>:<name>`` ids are dispatched to an adapter module registered in
  :data:`ADAPTERS` (``dmc:walker-stand`` -> ``core.envs.dmc``). An adapter
  module provides ``check_env_id(env_id)`` (raise :class:`EnvError`) and
  ``make_env(env_id, max_episode_steps=None)`` returning a gymnasium.Env;
  it registers nothing at import and is imported only when its prefix is
  used, so optional dependencies stay optional.

Actors step ``num_envs`` copies with gymnasium's ``SyncVectorEnv`` (for cheap
envs, process-based vectorization costs more than it saves: see
PLATFORM_FACTS) in ``NEXT_STEP`` autoreset mode, which yields exactly the
RLDS rows of :mod:`core.trajectory`: the step that ends an episode returns the
final observation, and the following step resets (its action is ignored).

Example::

    spec = env_spec("CartPole-v1")          # EnvSpec(obs_shape=(4,), num_actions=2, ...)
    envs = make_vector_env("CartPole-v1", num_envs=8, seed=0)
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Optional, Tuple

import numpy as np


class EnvError(ValueError):
    """Unknown or unusable environment id (one-line message)."""


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What networks and replay need to know about an environment."""
    env_id: str
    obs_shape: Tuple[int, ...]
    obs_dtype: str
    num_actions: Optional[int]          # discrete action count, else None
    action_shape: Tuple[int, ...]       # () for discrete
    action_dtype: str
    action_low: Optional[Tuple[float, ...]] = None
    action_high: Optional[Tuple[float, ...]] = None

    @property
    def discrete(self) -> bool:
        return self.num_actions is not None

    @property
    def obs_dim(self) -> int:
        return int(np.prod(self.obs_shape))


def _gym():
    import gymnasium
    return gymnasium


#: env-id prefix -> adapter module (see module docstring)
ADAPTERS = {
    "dmc": "core.envs.dmc",
    "atari": "core.envs.atari",
    "pomdp": "core.envs.pomdp",
    "pixels": "core.envs.pixels",
    "waiting": "core.envs.waiting",
}


def _adapter(env_id: str):
    """The adapter module for a ``prefix:name`` id, or None for gymnasium ids."""
    import importlib
    if ":" not in env_id:
        return None
    prefix = env_id.split(":", 1)[0]
    if prefix not in ADAPTERS:
        return None  # gymnasium ids like "module:Env-v0" stay with gymnasium
    try:
        return importlib.import_module(ADAPTERS[prefix])
    except ModuleNotFoundError as e:
        raise EnvError(f"env id {env_id!r} needs the '{prefix}' adapter, which is not available: {e}") from None


def check_env_id(env_id: str) -> None:
    """Raise EnvError naming close matches if ``env_id`` is not registered."""
    adapter = _adapter(env_id)
    if adapter is not None:
        adapter.check_env_id(env_id)
        return
    gym = _gym()
    if env_id in gym.envs.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.envs.registry.keys()), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; use a registered gymnasium id such as CartPole-v1"
    raise EnvError(f"unknown env id {env_id!r}{hint}")


def make_env(env_id: str, max_episode_steps: Optional[int] = None):
    """One gymnasium env (through its adapter for ``prefix:name`` ids)."""
    check_env_id(env_id)
    adapter = _adapter(env_id)
    if adapter is not None:
        return adapter.make_env(env_id, max_episode_steps=max_episode_steps)
    kwargs = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
    return _gym().make(env_id, **kwargs)


def make_vector_env(env_id: str, num_envs: int, seed: int, max_episode_steps: Optional[int] = None):
    """``num_envs`` synchronous copies in NEXT_STEP autoreset mode, reset with ``seed``.

    Returns ``(envs, first_obs)``. Env ``i`` is seeded ``seed + i``.
    """
    from gymnasium.vector import AutoresetMode, SyncVectorEnv
    envs = SyncVectorEnv([lambda: make_env(env_id, max_episode_steps) for _ in range(num_envs)],
                         autoreset_mode=AutoresetMode.NEXT_STEP)
    obs, _ = envs.reset(seed=[seed + i for i in range(num_envs)])
    envs.action_space.seed(seed)
    return envs, obs


def env_spec(env_id: str) -> EnvSpec:
    """Observation and action spec of ``env_id``."""
    from gymnasium import spaces
    env = make_env(env_id)
    try:
        obs, act = env.observation_space, env.action_space
        if isinstance(act, spaces.Discrete):
            return EnvSpec(env_id, tuple(obs.shape), str(obs.dtype), int(act.n), (), "int64")
        if isinstance(act, spaces.Box):
            return EnvSpec(env_id, tuple(obs.shape), str(obs.dtype), None, tuple(act.shape), "float32",
                           tuple(map(float, act.low.ravel())), tuple(map(float, act.high.ravel())))
        raise EnvError(f"env {env_id!r} has action space {act}; supported: Discrete, Box")
    finally:
        env.close()
