"""Atari adapter: exact resize weights, preprocessing contract, frames stored once, Pong smoke run."""
import os

import numpy as np
import pytest

pytest.importorskip("ale_py")


def test_area_resize_weights_exact():
    from core.envs.atari import area_resize_matrix
    np.testing.assert_allclose(area_resize_matrix(4, 2), [[.5, .5, 0, 0], [0, 0, .5, .5]])
    # 5 -> 2: each output covers 2.5 source pixels
    np.testing.assert_allclose(area_resize_matrix(5, 2), [[.4, .4, .2, 0, 0], [0, 0, .2, .4, .4]], rtol=1e-6)


def test_sparse_area_resize_equals_the_dense_matrices():
    from core.envs.atari import AreaResize, area_resize_matrix
    x = np.random.default_rng(0).integers(0, 256, (210, 160)).astype(np.uint8)
    dense = area_resize_matrix(210, 84) @ x.astype(np.float32) @ area_resize_matrix(160, 84).T
    out = AreaResize(210, 160, 84)(x)
    assert out.shape == (84, 84) and out.dtype == np.uint8
    assert np.abs(out.astype(np.int32) - np.rint(dense)).max() <= 1


def test_pong_preprocessing_contract():
    from core.envs import env_spec, make_env
    spec = env_spec("atari:Pong")
    assert spec.obs_shape == (84, 84) and spec.obs_dtype == "uint8" and spec.num_actions == 6
    env = make_env("atari:Pong")
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84) and obs.dtype == np.uint8
    rewards, raw = [], []
    for _ in range(400):
        obs, r, term, trunc, info = env.step(env.action_space.sample())
        rewards.append(r)
        raw.append(info["raw_reward"])
        if term or trunc:
            break
    assert set(rewards) <= {-1.0, 0.0, 1.0} and -1.0 in rewards           # Pong's opponent scores early
    assert info["raw_return"] == pytest.approx(sum(raw))
    env.close()


@pytest.mark.parametrize("bad, msg", [("atari:Pongg", "did you mean Pong"), ("atari:Pong-foo", "optional suffixes")])
def test_bad_atari_ids_are_one_line_errors(bad, msg):
    from core.envs import EnvError, check_env_id
    with pytest.raises(EnvError, match=msg):
        check_env_id(bad)


def test_frames_are_stored_once_and_restacked_like_the_server_stacks_them():
    from core.agents.vtrace.learning import stack_frames
    from core.inference.frames import FrameStacker
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (7, 2, 3, 3)).astype(np.uint8)     # [T, E, H, W] single frames
    stacker = FrameStacker(4)
    served = [stacker(frames[t], np.array([t == 0] * 2)) for t in range(7)]   # [E, H, W, 4] per step
    seq = np.swapaxes(frames, 0, 1)[None]                                    # [K=1, B=E, L=7, H, W]
    learner = stack_frames(seq, 4, (3, 3))                                   # [1, E, 4, 36]
    for j in range(4):            # learner step j == server step j + 3 (3 rows of history)
        np.testing.assert_array_equal(learner[0, :, j], served[j + 3].reshape(2, -1).astype(np.float32))
    # A new episode fills the stack with its first frame.
    first = served[0]
    assert all((first[..., c] == frames[0]).all() for c in range(4))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_vtrace_pong_smoke_central(tmp_path):
    """Smoke: Nature-CNN V-trace on Pong in SEED mode runs end to end (shards, learner steps, int8 policy)."""
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "pong-vtrace.yaml"),
                      ["total_env_steps=2400", "env.num_envs=4", "replay.min_size=600", "agent.batch_size=4",
                       "learner.replay_ratio=0.01", "eval.every_env_steps=1000000", "eval.episodes=1",
                       "env.max_episode_steps=200", "checkpoint.every_steps=1000000"])
    summary = train(cfg, str(tmp_path / "pong"), progress=False)
    assert summary["env_steps"] >= 2400 and summary["learner_steps"] > 0
    assert summary["inference"]["rejected"] == 0 and summary["inference"]["batches"] > 0
