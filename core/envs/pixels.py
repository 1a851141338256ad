"""Small pixel envs that learn in minutes: ``pixels:Catch``.

A check that a pixel agent learns at all, before spending hours on Atari:
Pong leaves -21 only after ~10^5 gradient updates, so a flat Pong curve alone
cannot tell a compute budget from a broken pixel path. Catch can.

* ``pixels:Catch``: bsuite's Catch (Osband et al. 2020, "Behaviour Suite for
  Reinforcement Learning") drawn as an Atari-like frame. A 10-row x 5-column
  board; the ball starts in the top row at a random column and falls one row
  per step; the paddle starts in the bottom row's middle column and moves
  left / stays / right (actions 0 / 1 / 2, clipped at the walls). When the
  ball reaches the bottom row the episode terminates with reward +1 if the
  paddle is under it, else -1: 9 steps per episode, every other reward 0.
  A uniformly random policy catches ~1 ball in 5 (mean return ~ -0.6); the
  optimum is +1.
* Observations are single ``(84, 84)`` ``uint8`` frames like ``atari:*``'s
  (ball and paddle 255 on 0; each board cell covers 8-9 x 16-17 pixels), so
  ``agent.torso: nature_cnn`` with ``agent.frame_stack`` runs exactly the
  Atari path: frames stored once, stacked by actors or the inference server,
  restacked by the learner.

Example::

    env = make_env("pixels:Catch")
    obs, info = env.reset(seed=0)        # obs.shape == (84, 84), uint8
"""
from __future__ import annotations

from typing import Optional

import gymnasium
import numpy as np
from gymnasium import spaces

from core.envs import EnvError

ROWS, COLUMNS, SIZE = 10, 5, 84
GAMES = ("Catch",)

# Board cell of every pixel row / column (row i of the frame shows board row _CELL_ROW[i]).
_CELL_ROW = np.arange(SIZE) * ROWS // SIZE
_CELL_COL = np.arange(SIZE) * COLUMNS // SIZE


def check_env_id(env_id: str) -> None:
    """Raise EnvError (naming the valid ids) unless ``env_id`` is a known pixel env."""
    if env_id.split(":", 1)[1] not in GAMES:
        raise EnvError(f"unknown pixel env id {env_id!r}; valid: {', '.join('pixels:' + g for g in GAMES)}")


def render(ball_row: int, ball_col: int, paddle_col: int) -> np.ndarray:
    """The ``(84, 84)`` uint8 frame of a board state."""
    board = np.zeros((ROWS, COLUMNS), np.uint8)
    board[ball_row, ball_col] = 255
    board[ROWS - 1, paddle_col] = 255
    return board[_CELL_ROW][:, _CELL_COL]


class Catch(gymnasium.Env):
    """bsuite's Catch on an 84x84 frame (module docstring); a module-level class, so the env pickles (an
    actor's state travels between Beam stages as a snapshot)."""
    metadata = {"render_modes": []}
    observation_space = spaces.Box(0, 255, (SIZE, SIZE), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.ball_row, self.ball_col = 0, int(self.np_random.integers(COLUMNS))
        self.paddle_col = COLUMNS // 2
        return render(self.ball_row, self.ball_col, self.paddle_col), {}

    def step(self, action):
        self.paddle_col = int(np.clip(self.paddle_col + int(action) - 1, 0, COLUMNS - 1))
        self.ball_row += 1
        terminated = self.ball_row == ROWS - 1
        reward = (1.0 if self.ball_col == self.paddle_col else -1.0) if terminated else 0.0
        return render(self.ball_row, self.ball_col, self.paddle_col), reward, terminated, False, {}


def make_env(env_id: str, max_episode_steps: Optional[int] = None):
    """One Catch env (see module docstring); episodes are 9 steps, so ``max_episode_steps`` rarely binds."""
    check_env_id(env_id)
    env = Catch()
    return gymnasium.wrappers.TimeLimit(env, max_episode_steps) if max_episode_steps else env
