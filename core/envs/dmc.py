"""DeepMind Control Suite adapter: ``dmc:<domain>-<task>[?repeat=R]`` -> a gymnasium.Env.

Examples: ``dmc:cartpole-balance``, ``dmc:walker-stand``, ``dmc:reacher-hard``,
``dmc:finger-turn_hard?repeat=2``. The domain is everything before the first
``-`` (domains use ``_``, never ``-``).

What the adapter does (dm_env -> gymnasium):

* observations: the task's ``OrderedDict`` of arrays, each flattened and
  concatenated in the spec's order, as float32 (``Box(-inf, inf, (D,))``);
* actions: ``Box(minimum, maximum)`` of the task's ``BoundedArray`` spec,
  float32 (the suite's tasks use [-1, 1]);
* action repeat ``R`` (default 1): each gymnasium step applies the action
  for ``R`` control steps and returns the sum of their rewards, so episode
  returns stay comparable across ``R`` (cartpole-balance: at most 1000);
* episode ends: a dm_env ``LAST`` step with discount 0 is ``terminated``;
  with discount > 0 (the suite's time limit, 1000 control steps) it is
  ``truncated``, so learners bootstrap from it. ``max_episode_steps`` (agent
  steps) truncates earlier;
* seeding: ``reset(seed=s)`` rebuilds the task's ``RandomState(s)``, which
  draws the initial physics state.

Dependencies are checked once with one-line :class:`~core.envs.EnvError`\ s:
dm_control missing or too old, ``mujoco`` missing or outside
``>=3.17,<4`` (mujoco 4 breaks dm_control 1.0.x: ``'MjModel' object has no
attribute 'flex_vertedge'``), an unknown domain or task (with the valid
names).

Rendering is off: training reads states, not pixels, and EGL rendering and
TensorFlow do not share a process here (measured with TF 2.21, dm_control
1.0.50, mujoco 3.17: ``MUJOCO_GL=egl`` + ``import tensorflow`` segfaults or
corrupts the heap, in either import order). So dm_control is imported with
``MUJOCO_GL=disable`` whatever the environment says; to render (e.g. videos,
in a process without TensorFlow) set ``DATABLOOM_MUJOCO_GL=egl``.
"""
from __future__ import annotations

import difflib
import os
from typing import Dict, Optional, Tuple

import numpy as np

from core.envs import EnvError

MUJOCO_RANGE = ((3, 17), (4, 0))       # mujoco>=3.17,<4
DM_CONTROL_MIN = (1, 0, 50)
INSTALL_HINT = "pip install 'databloom[dmc]' (dm-control>=1.0.50, mujoco>=3.17,<4)"


def _version_tuple(text: str) -> Tuple[int, ...]:
    out = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def check_dependencies(versions: Optional[Dict[str, Optional[str]]] = None) -> None:
    """Raise EnvError (one line) unless dm_control and a compatible mujoco are installed.

    ``versions`` (tests) maps ``"dm-control"``/``"mujoco"`` to a version string or
    None (= not installed); by default the installed distributions are read.
    """
    if versions is None:
        from importlib import metadata
        versions = {}
        for dist in ("mujoco", "dm-control"):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = None
    mj, dmc = versions.get("mujoco"), versions.get("dm-control")
    if dmc is None:
        raise EnvError(f"dm_control is not installed, needed by dmc: env ids; {INSTALL_HINT}")
    if mj is None:
        raise EnvError(f"mujoco is not installed, needed by dm_control; {INSTALL_HINT}")
    lo, hi = MUJOCO_RANGE
    if not lo <= _version_tuple(mj)[:2] < hi:
        raise EnvError(f"mujoco {mj} is not supported by dm_control {dmc}; valid: mujoco>=3.17,<4 "
                       f"(mujoco 4 breaks dm_control); pip install 'mujoco>=3.17,<4'")
    if _version_tuple(dmc) < DM_CONTROL_MIN:
        raise EnvError(f"dm_control {dmc} is too old; valid: dm-control>=1.0.50; {INSTALL_HINT}")


_CHECKED = False


def _suite():
    global _CHECKED
    if not _CHECKED:
        check_dependencies()
        _CHECKED = True
    import sys
    if "dm_control._render" not in sys.modules:  # dm_control reads MUJOCO_GL once, at import
        os.environ["MUJOCO_GL"] = os.environ.get("DATABLOOM_MUJOCO_GL", "disable")
    from dm_control import suite
    return suite


def parse_env_id(env_id: str) -> Tuple[str, str, int]:
    """``"dmc:walker-stand?repeat=2"`` -> ``("walker", "stand", 2)``; EnvError if malformed."""
    body = env_id.split(":", 1)[1] if ":" in env_id else env_id
    name, _, query = body.partition("?")
    repeat = 1
    if query:
        key, _, value = query.partition("=")
        if key != "repeat" or not value.isdigit() or int(value) < 1:
            raise EnvError(f"env id {env_id!r}: bad option {query!r}; valid: ?repeat=R with an integer R >= 1")
        repeat = int(value)
    domain, sep, task = name.partition("-")
    if not sep or not domain or not task:
        raise EnvError(f"env id {env_id!r} must look like dmc:<domain>-<task>, e.g. dmc:cartpole-balance")
    return domain, task, repeat


def check_env_id(env_id: str) -> None:
    """Raise EnvError naming the valid domains/tasks if ``env_id`` is not a suite task."""
    domain, task, _ = parse_env_id(env_id)
    suite = _suite()
    tasks: Dict[str, list] = {}
    for d, t in suite.ALL_TASKS:
        tasks.setdefault(d, []).append(t)
    if domain not in tasks:
        close = difflib.get_close_matches(domain, list(tasks), n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise EnvError(f"unknown dm_control domain {domain!r} in {env_id!r}; {hint}valid: {', '.join(sorted(tasks))}")
    if task not in tasks[domain]:
        raise EnvError(f"unknown dm_control task {task!r} for domain {domain!r} in {env_id!r}; "
                       f"valid: {', '.join(f'{domain}-{t}' for t in tasks[domain])}")


def flatten_observation(obs: Dict[str, np.ndarray]) -> np.ndarray:
    """Concatenate the arrays of a dm_control observation dict, in order, as float32."""
    return np.concatenate([np.asarray(v, np.float32).reshape(-1) for v in obs.values()]).astype(np.float32)


def make_env(env_id: str, max_episode_steps: Optional[int] = None):
    """A gymnasium.Env over the suite task (see module docstring)."""
    check_env_id(env_id)
    domain, task, repeat = parse_env_id(env_id)
    return DMCEnv(domain, task, action_repeat=repeat, max_episode_steps=max_episode_steps)


def _gym_env_base():
    import gymnasium
    return gymnasium.Env


class DMCEnv(_gym_env_base()):
    """gymnasium view of one dm_control suite task (flat float32 observations, Box actions)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, domain: str, task: str, action_repeat: int = 1, max_episode_steps: Optional[int] = None,
                 seed: int = 0):
        from gymnasium import spaces
        suite = _suite()
        self._domain, self._task, self._repeat = domain, task, int(action_repeat)
        self._env = suite.load(domain, task, task_kwargs={"random": seed})
        aspec = self._env.action_spec()
        self.action_space = spaces.Box(np.asarray(aspec.minimum, np.float32).reshape(aspec.shape),
                                       np.asarray(aspec.maximum, np.float32).reshape(aspec.shape),
                                       dtype=np.float32)
        dim = sum(int(np.prod(s.shape)) for s in self._env.observation_spec().values())
        self.observation_space = spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        self._max_steps = max_episode_steps
        self._t = 0
        self.render_mode = "rgb_array"

    def reset(self, *, seed: Optional[int] = None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            # The task's RandomState draws the initial state: reseeding it makes resets reproducible.
            self._env.task._random = np.random.RandomState(seed)
        self._t = 0
        ts = self._env.reset()
        return flatten_observation(ts.observation), {}

    def step(self, action):
        action = np.clip(np.asarray(action, np.float64).reshape(self.action_space.shape),
                         self.action_space.low, self.action_space.high)
        reward, terminated, truncated = 0.0, False, False
        for _ in range(self._repeat):
            ts = self._env.step(action)
            reward += float(ts.reward or 0.0)
            if ts.last():
                terminated = ts.discount == 0.0
                truncated = not terminated
                break
        self._t += 1
        if self._max_steps is not None and self._t >= self._max_steps and not terminated:
            truncated = True
        return flatten_observation(ts.observation), reward, bool(terminated), bool(truncated), {}

    def render(self):
        return self._env.physics.render(height=240, width=320, camera_id=0)

    def close(self):
        self._env.close() if hasattr(self._env, "close") else None
