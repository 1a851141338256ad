"""The DQN learner's code paths (core.agents.fused_adam, agent.jit_compile) against Keras's Adam."""
import dataclasses

import numpy as np
import pytest


def _batches(k=4, b=32, count=3):
    rng = np.random.default_rng(3)
    return [{"observation": rng.normal(size=(k, b, 4)).astype(np.float32),
             "next_observation": rng.normal(size=(k, b, 4)).astype(np.float32),
             "action": rng.integers(0, 2, (k, b)), "reward": rng.random((k, b)).astype(np.float32),
             "discount": np.full((k, b), 0.97, np.float32)} for _ in range(count)]


def _learner(**path):
    from core.agents.dqn.config import DQNConfig
    from core.agents.dqn.learning import DQNLearner
    from core.envs import env_spec
    cfg = dataclasses.replace(DQNConfig(hidden=[16, 16], learning_rate=1e-2, target_update_period=5,
                                        max_grad_norm=0.5), **path)
    return DQNLearner(env_spec("CartPole-v1"), cfg, seed=0)


def _trained(**path):
    learner = _learner(**path)
    for batch in _batches():
        learner.step(batch)
    return learner.state()


def test_adam_update_matches_the_formula_exactly():
    """One fused step from zero moments: m = (1-b1) g, v = (1-b2) g^2, var -= lr sqrt(1-b2)/(1-b1) m/(sqrt v + eps)."""
    import keras
    import tensorflow as tf
    from core.agents.fused_adam import apply_adam
    var = keras.Variable(np.array([1.0, -2.0, 0.5], np.float32))
    opt = keras.optimizers.Adam(learning_rate=0.1)
    opt.build([var])
    g = np.array([0.5, -1.0, 0.0], np.float32)
    tf.function(lambda: apply_adam(opt, [tf.constant(g)], [var]))()
    one, b1, b2 = np.float32(1), np.float32(0.9), np.float32(0.999)     # the kernel's float32 arithmetic
    m, v = g * (one - b1), g * g * (one - b2)
    alpha = np.float32(0.1) * np.sqrt(one - b2) / (one - b1)
    expected = np.array([1.0, -2.0, 0.5], np.float32) - m * alpha / (np.sqrt(v) + np.float32(1e-7))
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(opt._momentums[0].numpy(), m, rtol=1e-7)
    np.testing.assert_allclose(opt._velocities[0].numpy(), v, rtol=1e-7)
    assert int(opt.iterations.numpy()) == 1


def test_clip_by_global_norm_scales_to_the_clip_and_leaves_small_gradients():
    import tensorflow as tf
    from core.agents.fused_adam import clip_by_global_norm
    big = clip_by_global_norm([tf.constant([3.0]), tf.constant([4.0])], 1.0)     # norm 5 -> 1
    np.testing.assert_allclose([t.numpy()[0] for t in big], [0.6, 0.8], rtol=1e-6)
    small = clip_by_global_norm([tf.constant([3.0]), tf.constant([4.0])], 10.0)
    np.testing.assert_allclose([t.numpy()[0] for t in small], [3.0, 4.0], rtol=1e-6)


def test_plain_adam_only():
    import keras
    from core.agents.fused_adam import apply_adam
    with pytest.raises(ValueError, match="amsgrad"):
        apply_adam(keras.optimizers.Adam(amsgrad=True), [], [])


@pytest.mark.parametrize("path", [{"fused_adam": True, "jit_compile": False},
                                  {"fused_adam": False, "jit_compile": True},
                                  {"fused_adam": True, "jit_compile": True}])
def test_every_path_trains_what_keras_adam_trains_and_keeps_the_checkpoint_keys(path):
    keras_state = _trained(fused_adam=False, jit_compile=False)
    state = _trained(**path)
    assert {k: sorted(v) for k, v in state.items()} == {k: sorted(v) for k, v in keras_state.items()}
    assert state["counters"]["learner_steps"] == 12
    for group in ("params", "target_params", "optimizer"):
        for key, value in keras_state[group].items():
            np.testing.assert_allclose(state[group][key], value, rtol=1e-4, atol=1e-6, err_msg=f"{group}/{key}")


@pytest.mark.parametrize("path", [{"fused_adam": True, "jit_compile": False}, {"fused_adam": True, "jit_compile": True}])
def test_a_path_is_deterministic_and_k_steps_equal_k_calls(path):
    first, second = _trained(**path), _trained(**path)
    for key, value in first["params"].items():
        np.testing.assert_array_equal(second["params"][key], value)
    one_by_one = _learner(**path)
    for batch in _batches():
        for i in range(4):
            one_by_one.step({k: v[i] for k, v in batch.items()})
    for key, value in first["params"].items():
        np.testing.assert_array_equal(one_by_one.state()["params"][key], value, err_msg=key)
