"""pixels:Catch: bsuite's rules exactly, Atari-like frames, and it runs the R2D2 pixel config."""
import pickle

import numpy as np
import pytest

from core.envs import EnvError, check_env_id, env_spec, make_env
from core.envs.pixels import COLUMNS, ROWS, render


def _board(frame):
    """The 10x5 board a frame shows (one pixel per cell: its top-left)."""
    rows = [int(np.ceil(r * 84 / ROWS)) for r in range(ROWS)]
    cols = [int(np.ceil(c * 84 / COLUMNS)) for c in range(COLUMNS)]
    return frame[np.ix_(rows, cols)] // 255


def test_catch_frames_show_the_ball_and_the_paddle_and_nothing_else():
    frame = render(3, 1, 4)
    assert frame.shape == (84, 84) and frame.dtype == np.uint8 and set(np.unique(frame)) == {0, 255}
    want = np.zeros((ROWS, COLUMNS), np.uint8)
    want[3, 1] = want[ROWS - 1, 4] = 1
    np.testing.assert_array_equal(_board(frame), want)
    # each board cell covers 8-9 pixel rows x 16-17 pixel columns
    rows, cols = np.bincount(np.arange(84) * ROWS // 84), np.bincount(np.arange(84) * COLUMNS // 84)
    assert set(rows) == {8, 9} and set(cols) == {16, 17}
    assert (frame == 255).sum() == rows[3] * cols[1] + rows[ROWS - 1] * cols[4]


def test_catch_follows_bsuite_rules():
    env = make_env("pixels:Catch")
    spec = env_spec("pixels:Catch")
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == ((84, 84), "uint8", 3)
    obs, _ = env.reset(seed=3)
    ball_col = env.unwrapped.ball_col
    np.testing.assert_array_equal(obs, render(0, ball_col, COLUMNS // 2))
    # walk the paddle to the left wall and keep pushing: it stays at column 0
    for t in range(1, ROWS - 1):
        obs, r, term, trunc, _ = env.step(0)
        assert (r, term, trunc) == (0.0, t == ROWS - 1, False)
        np.testing.assert_array_equal(obs, render(t, ball_col, max(COLUMNS // 2 - t, 0)))
    obs, r, term, _, _ = env.step(1)
    assert term and r == (1.0 if ball_col == 0 else -1.0)


def test_catch_rewards_a_policy_that_follows_the_ball_and_random_play_mostly_misses():
    env = make_env("pixels:Catch")
    rng = np.random.default_rng(0)
    follow, random = [], []
    for ep in range(200):
        for policy, out in (("follow", follow), ("random", random)):
            env.reset(seed=ep)
            done, ret = False, 0.0
            while not done:
                u = env.unwrapped
                a = 1 + int(np.sign(u.ball_col - u.paddle_col)) if policy == "follow" else int(rng.integers(3))
                _, r, term, trunc, _ = env.step(a)
                ret, done = ret + r, term or trunc
            out.append(ret)
    assert set(follow) == {1.0}
    assert -0.8 < np.mean(random) < -0.4          # ~1 catch in 5


def test_catch_pickles_and_bad_ids_are_one_line_errors():
    env = make_env("pixels:Catch")
    env.reset(seed=0)
    env.step(2)
    clone = pickle.loads(pickle.dumps(env))
    assert (clone.unwrapped.ball_row, clone.unwrapped.paddle_col) == (1, COLUMNS // 2 + 1)
    with pytest.raises(EnvError, match="valid: pixels:Catch"):
        check_env_id("pixels:Pong")


def test_the_catch_config_is_the_pong_network_on_catch():
    from core.config import load_config
    catch, pong = load_config("configs/catch-r2d2.yaml"), load_config("configs/pong-r2d2.yaml")
    assert catch.env.id == "pixels:Catch"
    for field in ("algo", "torso", "frame_stack", "lstm_size", "head", "dueling", "gamma", "n_step",
                  "learning_rate", "batch_size"):
        assert getattr(catch.agent, field) == getattr(pong.agent, field), field
