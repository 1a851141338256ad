"""R2D2 on pixels: Nature-CNN torso -> LSTM -> dueling head, frame stacking on both inference paths,
restacking in the learner, LiteRT fp32/int8 step models, and Pong smoke runs (local and central)."""
import os

import numpy as np
import pytest


def _net(frame=(36, 36), k=2, lstm=8, head=(8,), actions=3, dueling=True, seed=1):
    """A small pixel step model (36x36 is the smallest input the Nature CNN takes: 8 -> 3 -> 1)."""
    from core.agents.r2d2.networks import recurrent_q_network
    d = frame[0] * frame[1] * k
    return recurrent_q_network(d, actions, "nature_cnn", lstm, list(head), seed=seed, dueling=dueling,
                               frame_shape=frame, frame_stack=k), d


# -- config ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("override, message", [
    ("agent.torso=resnet", "config key 'agent.torso' must be list of int or one of nature_cnn, got 'resnet'"),
    ("agent.torso=[0]", "config key 'agent.torso' = [0] is out of range; valid: 'nature_cnn' or a list of widths"),
    ("agent.frame_stack=0", "config key 'agent.frame_stack' = 0 is out of range; valid: 1..16"),
])
def test_bad_torso_and_frame_stack_are_one_line_config_errors(override, message):
    from core.config import ConfigError, load_config
    with pytest.raises(ConfigError) as e:
        load_config(os.path.join("configs", "pong-r2d2.yaml"), [override])
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("override", ["agent.torso=nature_cnn", "agent.frame_stack=4"])
def test_pixel_settings_on_vector_observations_are_config_errors(override):
    from core.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=r"needs image observations \[H, W\] or \[H, W, C\]; pomdp:CartPole-v1 "
                                          r"has shape \[2\]"):
        load_config(os.path.join("configs", "pomdp-cartpole-r2d2.yaml"), [override])


def test_pong_config_loads_with_the_cnn_torso_and_both_inference_modes():
    from core.config import load_config
    for mode in ("local", "central"):
        cfg = load_config(os.path.join("configs", "pong-r2d2.yaml"), [f"inference={mode}"])
        a = cfg.agent
        assert (a.algo, a.torso, a.frame_stack, a.lstm_size, a.dueling) == ("r2d2", "nature_cnn", 4, 512, True)
        assert cfg.inference == mode


# -- network --------------------------------------------------------------------------------------------

def test_cnn_step_model_layout_and_shared_nature_torso():
    net, d = _net()
    assert net.input_shape == (None, d + 16) and net.output_shape == (None, 3 + 16)
    convs = [lyr for lyr in net.layers if type(lyr).__name__ == "Conv2D"]
    assert [(c.filters, c.kernel_size, c.strides) for c in convs] == [(32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)),
                                                                       (64, (3, 3), (1, 1))]
    assert net.get_layer("torso_6").units == 512 and net.get_layer("lstm_gates").units == 32
    # Online and target share checkpoint keys: every layer that holds weights has an explicit name.
    other, _ = _net(seed=7)
    assert [w.path for w in net.weights] == [w.path for w in other.weights]


def test_dueling_q_averages_to_the_value_stream():
    """Q = V + A - mean_a A, so mean_a Q equals the value stream's output exactly (up to float rounding)."""
    import keras
    net, d = _net(actions=4)
    x = np.random.default_rng(0).uniform(0, 255, (5, d + 16)).astype(np.float32)
    x[:, d:] = np.random.default_rng(1).standard_normal((5, 16))
    q = net(x).numpy()[:, :4]
    h_new = net(x).numpy()[:, 4:12]
    value = keras.Sequential([net.get_layer("value_head_0"), net.get_layer("value")])
    np.testing.assert_allclose(q.mean(axis=1), value(h_new).numpy()[:, 0], rtol=1e-5, atol=1e-5)
    assert np.ptp(q, axis=1).min() > 0          # the advantages still separate the actions


def test_unroll_equals_stepping_and_burn_in_rows_get_no_gradient():
    import tensorflow as tf
    from core.agents.r2d2.networks import step, unroll
    net, d = _net()
    rng = np.random.default_rng(0)
    obs = tf.Variable(rng.uniform(0, 255, (3, 6, d)).astype(np.float32))
    h0 = tf.Variable(rng.standard_normal((3, 8)).astype(np.float32))
    c0 = tf.Variable(rng.standard_normal((3, 8)).astype(np.float32))
    with tf.GradientTape() as tape:
        q = unroll(net, obs, h0, c0, 3, burn_in=2)
        loss = tf.reduce_sum(tf.square(q))
    h, c = h0, c0
    for t in range(6):
        q_t, h, c = step(net, obs[:, t], h, c, 3)
        np.testing.assert_allclose(q[:, t].numpy(), q_t.numpy(), rtol=1e-4, atol=1e-5)
    g_obs, g_h = tape.gradient(loss, [obs, h0])
    g = np.abs(g_obs.numpy()).sum(axis=(0, 2))
    assert np.all(g[:2] == 0.0) and np.all(g[2:] > 0.0), g
    assert g_h is None or not np.any(g_h.numpy())


# -- LiteRT step model ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("int8-dynamic", 0.05)])
def test_cnn_step_model_runs_in_litert_and_sizes_the_carry(precision, tol):
    from core.agents.r2d2.actor import LSTMCarry
    from core.policy import LiteRTPolicy
    from core.quantize import PolicyQuantizer
    net, d = _net(frame=(84, 84), k=4, lstm=16, head=(32,), actions=6)
    payload = PolicyQuantizer(precision, patch=True).quantize(net, version=3)   # conv: converted, not patched
    assert payload.method == "convert" and (payload.input_dim, payload.output_dim) == (d + 32, 6 + 32)
    carry = LSTMCarry.for_payload(payload, 4, d)          # obs_dim = stacked frames, as actors and the server pass
    assert (carry.num_actions, carry.lstm_size) == (6, 16)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (4, d)).astype(np.uint8)
    policy = LiteRTPolicy(payload, batch_size=4)
    q, extras = carry(policy, frames.astype(np.float32), np.array([True, False, True, False]))
    ref = net(np.concatenate([frames.astype(np.float32), np.zeros((4, 32), np.float32)], axis=1)).numpy()
    scale = np.abs(ref).max()
    assert np.abs(q - ref[:, :6]).max() <= tol * scale
    assert np.abs(carry.h - ref[:, 6:22]).max() <= tol * max(np.abs(ref[:, 6:22]).max(), 1e-6)
    assert extras["lstm_h"].shape == (4, 16) and not extras["lstm_h"].any()       # state the step started from


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "int8-dynamic"])
def test_dueling_mlp_policy_patches_exactly_like_a_fresh_conversion(precision):
    """The dueling head's two streams can convert in another order than model.layers: ops are matched by content."""
    from core.agents.r2d2.networks import recurrent_q_network
    from core.policy import LiteRTPolicy
    from core.quantize import PolicyQuantizer
    net = recurrent_q_network(2, 3, [64], 64, [64, 64], seed=1, dueling=True)
    patcher = PolicyQuantizer(precision, patch=True)
    patcher.quantize(net, 1)
    rng = np.random.default_rng(0)
    net.set_weights([w + 0.1 * rng.standard_normal(w.shape).astype(np.float32) for w in net.get_weights()])
    patched, converted = patcher.quantize(net, 2), PolicyQuantizer(precision).quantize(net, 2)
    assert (patched.method, converted.method) == ("patch", "convert")
    x = rng.standard_normal((5, 130)).astype(np.float32)
    np.testing.assert_array_equal(LiteRTPolicy(patched, batch_size=5)(x), LiteRTPolicy(converted, batch_size=5)(x))


# -- frames: stored once, stacked by actors, restacked by the learner -------------------------------------

def _pixel_cfg(**kw):
    from core.agents.r2d2.config import R2D2Config
    base = dict(torso="nature_cnn", frame_stack=4, lstm_size=16, head=[32], dueling=True, sequence_length=8,
                burn_in=2, n_step=2, batch_size=3)
    base.update(kw)
    return R2D2Config(**base)


@pytest.mark.slow
def test_learner_restacks_stored_frames_and_starts_from_the_first_stacked_rows_state():
    from core.agents.r2d2.learning import R2D2Learner
    from core.envs import env_spec
    learner = R2D2Learner(env_spec("atari:Pong"), _pixel_cfg(), seed=0)
    rng = np.random.default_rng(0)
    b, rows = 3, 8 + 3                                      # sequence_length + frame_stack - 1 history rows
    batch = {"observation": rng.integers(0, 256, (b, rows, 84, 84)).astype(np.uint8),
             "action": np.tile(np.arange(rows) % 6, (b, 1)), "reward": np.zeros((b, rows), np.float32),
             "discount": np.ones((b, rows), np.float32), "terminated": np.zeros((b, rows), bool),
             "truncated": np.zeros((b, rows), bool), "mask": np.ones((b, rows), bool),
             "extras/lstm_h": rng.standard_normal((b, rows, 16)).astype(np.float32),
             "extras/lstm_c": rng.standard_normal((b, rows, 16)).astype(np.float32),
             "weight": np.ones(b, np.float32)}
    x = learner.prepare(batch)
    assert x["obs"].shape == (3, 8, 84 * 84 * 4) and x["obs"].dtype == np.float32
    for j in (0, 5):     # learner row j = stored rows j..j+3 on the channel axis, oldest first
        want = np.stack([batch["observation"][:, j + i] for i in range(4)], axis=-1).reshape(3, -1)
        np.testing.assert_array_equal(x["obs"][:, j], want.astype(np.float32))
    np.testing.assert_array_equal(x["h0"], batch["extras/lstm_h"][:, 3])
    np.testing.assert_array_equal(x["c0"], batch["extras/lstm_c"][:, 3])
    np.testing.assert_array_equal(x["action"][0], np.arange(3, 11) % 6)
    np.testing.assert_array_equal(x["valid"][0], [0, 0, 1, 1, 1, 1, 1, 0])   # burn-in 2, last row bootstraps
    m = learner.step(batch)
    assert np.isfinite(m["loss"]) and m["td_abs"].shape == (3,)


def test_sampler_reads_frame_history_rows_as_extra_burn_in():
    from core.agents.r2d2.builder import R2D2Builder
    from core.agents.r2d2.sampler import PrioritizedSequenceSampler
    built = R2D2Builder().make_sampler(_FakeCache(), _pixel_cfg())
    assert isinstance(built, PrioritizedSequenceSampler) and (built.length, built.burn_in) == (8 + 3, 2 + 3)


class _FakeCache:
    """The sampler constructor only stores its cache."""


@pytest.mark.slow
def test_local_actor_stacks_frames_and_stores_single_uint8_frames_with_their_state():
    """Actor (LiteRT fp32 on stacked frames) -> replay rows: stepping from a row's stored state reproduces the next."""
    import tensorflow as tf
    from core.agents.r2d2.learning import R2D2Learner
    from core.agents.r2d2.networks import step
    from core.envs import env_spec
    from core.quantize import PolicyQuantizer
    from core.actor import ActorSpec
    from core.rollout import run_rollout_task
    learner = R2D2Learner(env_spec("atari:Pong"), _pixel_cfg(), seed=0)
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=1)
    spec = ActorSpec("r2d2-px", "atari:Pong", 2, 0, 0, max_episode_steps=12, selector="recurrent_epsilon_greedy",
                     frame_stack=4)
    batch = run_rollout_task(spec, payload, 0, 30, {"epsilon": 0.5}).batch
    assert batch.observation.shape == (30, 2, 84, 84) and batch.observation.dtype == np.uint8
    h, c = batch.extras["lstm_h"], batch.extras["lstm_c"]
    assert h.shape == (30, 2, 16) and h.dtype == np.float32
    first = batch.step == 0
    assert first[1:].any() and not h[first].any()            # episodes restart (12 steps); state zeroed there
    # Row t's input: frames of rows t-3..t, oldest first, clipped to the episode's first row (FrameStacker's rule).
    stacked = np.empty((30, 2, 84, 84, 4), np.float32)
    for t in range(30):
        for e in range(2):
            start = t - batch.step[t, e]
            stacked[t, e] = np.stack([batch.observation[max(t - 3 + i, start), e] for i in range(4)], axis=-1)
    _, h1, c1 = step(learner.q, tf.constant(stacked[:-1].reshape(-1, 84 * 84 * 4)),
                     tf.constant(h[:-1].reshape(-1, 16)), tf.constant(c[:-1].reshape(-1, 16)), 6)
    cont = ~first[1:].reshape(-1)
    np.testing.assert_allclose(h1.numpy()[cont], h[1:].reshape(-1, 16)[cont], atol=1e-4)
    np.testing.assert_allclose(c1.numpy()[cont], c[1:].reshape(-1, 16)[cont], atol=1e-4)
    assert np.abs(h[~first]).max() > 1e-3


# -- Pong smoke runs ---------------------------------------------------------------------------------------

_SMOKE = ["total_env_steps=1200", "env.num_envs=4", "replay.min_size=400", "agent.batch_size=4",
          "agent.sequence_length=12", "agent.burn_in=4", "agent.lstm_size=32", "agent.head=[32]",
          "learner.replay_ratio=0.02", "actors.steps_per_task=20", "eval.every_env_steps=1000000",
          "eval.episodes=1", "env.max_episode_steps=200", "checkpoint.every_steps=1000000"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("inference", ["local", "central"])
def test_r2d2_pong_smoke(tmp_path, inference):
    """Pong R2D2 end to end: stacked frames -> int8 CNN step model -> uint8 shards with lstm extras -> learner."""
    from core.agents.r2d2.learning import R2D2Learner
    from core.agents.registry import get_builder
    from core.checkpoint import Checkpointer
    from core.config import load_config
    from core.envs import env_spec
    from core.replay import ReplayCache, ReplayStore
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "pong-r2d2.yaml"), _SMOKE + [f"inference={inference}"])
    run = str(tmp_path / "pong")
    summary = train(cfg, run, progress=False)
    assert summary["env_steps"] >= 1200 and summary["learner_steps"] >= 3
    assert set(summary["final_eval"]) == {"fp32", "int8-dynamic"}          # greedy evaluations with stacked frames
    assert all(np.isfinite(v["mean"]) and -21 <= v["mean"] <= 21 for v in summary["final_eval"].values())
    if inference == "central":
        assert summary["inference"]["rejected"] == 0 and summary["inference"]["batches"] > 0
    # Committed shards: single uint8 frames and the recurrent state each step started from.
    cache = ReplayCache(ReplayStore.open(os.path.join(run, "replay")))
    cache.refresh()
    assert cache.size >= 1200
    assert cache.data["observation"].dtype == np.uint8 and cache.data["observation"].shape[1:] == (84, 84)
    for name in ("extras/lstm_h", "extras/lstm_c"):
        assert cache.data[name].dtype == np.float32 and cache.data[name].shape[1:] == (32,)
    alive = cache.alive
    assert np.abs(cache.data["extras/lstm_h"][alive]).max() > 1e-3     # a state that actually carries
    # The checkpoint restores and trains on sequences sampled from those shards (3 history rows each).
    state, _ = Checkpointer(os.path.join(run, "checkpoints")).restore()
    learner = R2D2Learner(env_spec("atari:Pong"), cfg.agent, seed=1)
    learner.restore(state["learner"])
    assert learner.steps == summary["learner_steps"]
    batch = get_builder("r2d2").make_sampler(cache, cfg.agent).sample(4, np.random.default_rng(0))
    assert batch["observation"].shape == (4, 12 + 3, 84, 84) and batch["extras/lstm_h"].shape == (4, 15, 32)
    m = learner.step(batch)
    assert np.isfinite(m["loss"]) and m["td_abs"].shape == (4,) and np.all(m["td_abs"] >= 0)
