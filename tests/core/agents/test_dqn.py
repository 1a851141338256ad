"""DQN math with exact expected values: double-DQN targets, Huber, epsilon schedule."""
import numpy as np
import pytest

from core.agents.dqn.actor import LinearEpsilon


def test_double_q_targets_exact():
    import tensorflow as tf
    from core.agents.dqn.losses import q_learning_targets
    q_next_online = tf.constant([[1.0, 2.0], [3.0, 0.5], [0.0, 0.0]])
    q_next_target = tf.constant([[10.0, 20.0], [30.0, 40.0], [5.0, 6.0]])
    reward = tf.constant([1.0, 2.0, 3.0])
    discount = tf.constant([0.5, 0.25, 0.0])   # third: bootstrap row is terminal
    double = q_learning_targets(q_next_online, q_next_target, reward, discount, double_q=True).numpy()
    # online argmax: [1, 0, 0] -> target values [20, 30, 5]
    np.testing.assert_allclose(double, [1 + 0.5 * 20, 2 + 0.25 * 30, 3.0])
    classic = q_learning_targets(q_next_online, q_next_target, reward, discount, double_q=False).numpy()
    # target argmax: [1, 1, 1] -> [20, 40, 6]
    np.testing.assert_allclose(classic, [1 + 0.5 * 20, 2 + 0.25 * 40, 3.0])


def test_huber_exact():
    import tensorflow as tf
    from core.agents.dqn.losses import huber
    x = tf.constant([-3.0, -1.0, -0.5, 0.0, 0.5, 2.0])
    np.testing.assert_allclose(huber(x, 1.0).numpy(), [2.5, 0.5, 0.125, 0.0, 0.125, 1.5])


@pytest.mark.parametrize("t, expected", [(0, 1.0), (500, 0.52), (1000, 0.04), (5000, 0.04)])
def test_linear_epsilon_exact(t, expected):
    assert LinearEpsilon(1.0, 0.04, 1000)(t) == pytest.approx(expected)


def test_learner_step_reduces_td_error_and_state_round_trips():
    from core.agents.dqn.learning import DQNLearner
    from core.agents.dqn.config import DQNConfig as AgentConfig
    from core.envs import env_spec
    cfg = AgentConfig(hidden=[16], learning_rate=1e-2, target_update_period=1000)
    learner = DQNLearner(env_spec("CartPole-v1"), cfg, seed=0)
    rng = np.random.default_rng(0)
    batch = {"observation": rng.normal(size=(32, 4)).astype(np.float32),
             "action": rng.integers(0, 2, 32), "reward": np.ones(32, np.float32),
             "discount": np.zeros(32, np.float32),   # targets are exactly 1
             "next_observation": rng.normal(size=(32, 4)).astype(np.float32)}
    first = learner.step(batch)["loss"]
    for _ in range(200):
        last = learner.step(batch)["loss"]
    assert last < 0.1 * first
    state = learner.state()
    other = DQNLearner(env_spec("CartPole-v1"), cfg, seed=1)
    other.restore(state)
    assert other.steps == 201
    for k, v in state["params"].items():
        np.testing.assert_array_equal(other.state()["params"][k], v)
