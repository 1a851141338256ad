"""Atari adapter (``atari:<Game>[-sticky][-raw]``): ALE via ale-py with the standard preprocessing.

``atari:Pong`` is ``ALE/Pong-v5`` (ROMs ship in the ale-py wheel) with:

* frame skip 4, the last two frames max-pooled (flicker);
* ALE's grayscale screen resized to 84x84 by area averaging (no OpenCV needed);
* 84x84 grayscale ``uint8`` observations of shape ``(84, 84)``: a *single*
  frame. Frame stacking is done once, never stored: the central inference
  server stacks the last k frames for the network and the learner restacks
  stored single frames at sampling time (``agent.frame_stack``);
* up to 30 no-op actions at reset;
* sticky actions (repeat probability 0.25, Machado et al. 2018) only with
  ``-sticky``; by default they are off;
* rewards clipped to ``sign(r)`` for training; the unclipped reward is
  ``info["raw_reward"]`` and the unclipped episode return
  ``info["raw_return"]`` (evaluation); ``-raw`` steps unclipped rewards;
* episodes capped at 27,000 agent steps (108k frames), the usual limit.

Example::

    env = make_env("atari:Pong")
    obs, info = env.reset(seed=0)        # obs.shape == (84, 84), uint8
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from core.envs import EnvError

MAX_AGENT_STEPS = 27_000
_OPTIONS = ("sticky", "raw")


def _parse(env_id: str):
    name = env_id.split(":", 1)[1]
    parts = name.split("-")
    game, opts = parts[0], set(parts[1:])
    bad = opts - set(_OPTIONS)
    if not game or bad:
        raise EnvError(f"atari env id {env_id!r} is not valid; use atari:<Game> with optional suffixes "
                       f"{', '.join('-' + o for o in _OPTIONS)} (e.g. atari:Pong, atari:Breakout-sticky)")
    return game, opts


def _ale():
    try:
        import ale_py
        import gymnasium
        gymnasium.register_envs(ale_py)
        return gymnasium
    except ImportError:
        raise EnvError("atari envs need ale-py: pip install 'databloom[atari]'") from None


def check_env_id(env_id: str) -> None:
    game, _ = _parse(env_id)
    gym = _ale()
    if f"ALE/{game}-v5" not in gym.envs.registry:
        import difflib
        games = sorted(k[4:-3] for k in gym.envs.registry if k.startswith("ALE/") and k.endswith("-v5"))
        close = difflib.get_close_matches(game, games, n=3)
        raise EnvError(f"unknown Atari game {game!r} in {env_id!r}"
                       + (f"; did you mean {', '.join(close)}?" if close else f"; e.g. {', '.join(games[:5])}"))


def make_env(env_id: str, max_episode_steps: Optional[int] = None):
    """One preprocessed ALE env (see module docstring)."""
    game, opts = _parse(env_id)
    gym = _ale()
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.25 if "sticky" in opts else 0.0,
                   full_action_space=False, obs_type="grayscale",
                   max_num_frames_per_episode=4 * (max_episode_steps or MAX_AGENT_STEPS))
    return _preprocessed(env, clip="raw" not in opts)


def area_resize_matrix(src: int, dst: int) -> np.ndarray:
    """``[dst, src]`` weights of area (box-filter) resampling: row i averages source pixels it covers.

    ``M_h @ frame @ M_w.T`` resizes a frame like ``cv2.INTER_AREA`` does (no
    OpenCV dependency). Each output pixel covers at most ``ceil(src/dst) + 1``
    source pixels per axis, so :class:`AreaResize` applies the matrix as a few
    weighted gathers instead of a BLAS matmul (10x faster for 210x160 frames).
    """
    m = np.zeros((dst, src), np.float32)
    scale = src / dst
    for i in range(dst):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(np.floor(lo)), int(np.ceil(hi))):
            m[i, j] = min(hi, j + 1) - max(lo, j)
    return m / m.sum(axis=1, keepdims=True)


class AreaResize:
    """Resize ``[H, W]`` frames to ``[size, size]`` with :func:`area_resize_matrix` weights, sparsely."""

    def __init__(self, h: int, w: int, size: int):
        self.rows = self._taps(area_resize_matrix(h, size))
        self.cols = self._taps(area_resize_matrix(w, size))

    @staticmethod
    def _taps(m: np.ndarray):
        k = int((m > 0).sum(axis=1).max())
        idx = np.argsort(~(m > 0), axis=1, kind="stable")[:, :k]
        return idx, np.take_along_axis(m, idx, axis=1).astype(np.float32)

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        (ri, rw), (ci, cw) = self.rows, self.cols
        x = frame.astype(np.float32)
        y = sum(rw[:, j, None] * x[ri[:, j]] for j in range(ri.shape[1]))            # [size, W]
        z = sum(cw[None, :, j] * y[:, ci[:, j]] for j in range(ci.shape[1]))          # [size, size]
        return np.clip(np.rint(z), 0, 255).astype(np.uint8)


def _preprocessed(env, clip: bool = True, frame_skip: int = 4, noop_max: int = 30, size: int = 84):
    """Frame skip + max-pool, area resize to ``size x size``, no-op starts, reward clipping."""
    import gymnasium
    from gymnasium import spaces

    class AtariPreprocessing(gymnasium.Wrapper):
        def __init__(self, inner):
            super().__init__(inner)
            h, w = inner.observation_space.shape[:2]
            self.resize = AreaResize(h, w, size)
            self.observation_space = spaces.Box(0, 255, (size, size), np.uint8)
            self.raw_return = 0.0
            self._buf = np.zeros((2, h, w), np.uint8)

        def _frame(self, screen: np.ndarray) -> np.ndarray:
            return self.resize(screen)

        def reset(self, **kwargs):
            obs, info = self.env.reset(**kwargs)
            self.raw_return = 0.0
            noops = int(self.env.unwrapped.np_random.integers(1, noop_max + 1)) if noop_max else 0
            for _ in range(noops):
                obs, _, terminated, truncated, info = self.env.step(0)
                if terminated or truncated:
                    obs, info = self.env.reset()
            return self._frame(obs), info

        def step(self, action):
            total, terminated, truncated, info = 0.0, False, False, {}
            for i in range(frame_skip):
                obs, reward, terminated, truncated, info = self.env.step(action)
                total += float(reward)
                if i >= frame_skip - 2:
                    self._buf[i - (frame_skip - 2)] = obs
                if terminated or truncated:
                    self._buf[:] = obs      # no pair to pool with: use the final frame
                    break
            self.raw_return += total
            info = dict(info, raw_reward=total, raw_return=self.raw_return)
            frame = self._frame(np.maximum(self._buf[0], self._buf[1]))
            return frame, (float(np.sign(total)) if clip else total), terminated, truncated, info

    return AtariPreprocessing(env)
