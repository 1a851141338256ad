"""FrameStacker: the network input of pixel envs, the last ``k`` frames stacked on the channel axis.

Replay stores single frames only; whoever feeds a network stacks them. The
central server (:mod:`core.inference.server`, per stream), local actors
(:mod:`core.rollout`) and evaluation (:mod:`core.policy_evaluation`) stack with this
one class, and the learner stacks sampled frames again in the same order
(:mod:`core.agents.vtrace.learning`), so every side sees the same input.
numpy only: importing it pulls in no gRPC.

Example::

    stack = FrameStacker(4)
    x = stack(obs, new_episode)     # obs [E, H, W] or [E, H, W, C] -> [E, H, W, 4*C], oldest frame first
"""
from __future__ import annotations

from typing import Optional

import numpy as np


class FrameStacker:
    """The last ``k`` frames of each env, oldest first, stacked on the channel axis.

    A new episode (``step == 0``) fills its env's stack with its first frame,
    so no frame of the previous episode leaks into the next one.

    Args:
      k: frames per network input; 1 passes observations through unchanged.
    """

    def __init__(self, k: int):
        self.k = int(k)
        self.frames: Optional[np.ndarray] = None

    def __call__(self, obs: np.ndarray, new_episode: np.ndarray) -> np.ndarray:
        """Adds this step's frames and returns the stacked input.

        Args:
          obs: ``[E, H, W]`` or ``[E, H, W, C]`` frames of this step.
          new_episode: ``[E]`` bool, True where this frame starts an episode.

        Returns:
          ``[E, H, W, k * C]``, the oldest frame's channels first (``obs`` itself when ``k == 1``).
        """
        if self.k == 1:
            return obs
        frame = obs if obs.ndim == 4 else obs[..., None]          # [E, H, W, C]
        if self.frames is None:
            self.frames = np.repeat(frame[:, None], self.k, axis=1)
        else:
            self.frames = np.concatenate([self.frames[:, 1:], frame[:, None]], axis=1)
            self.frames[new_episode] = frame[new_episode][:, None]
        return np.concatenate(list(np.moveaxis(self.frames, 1, 0)), axis=-1)
