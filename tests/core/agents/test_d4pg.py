"""D4PG: exact categorical projection, noise ladder, selector scaling, learner, learning regression."""
import numpy as np
import pytest

from core.agents.d4pg.actor import noise_sigma

# Support z = [-1, 0, 1] (dz = 1). Each case: (R, D, p over atoms) -> projected m, worked by hand.
PROJECTION_CASES = [
    # Tz = [0, 0.5, 1]: 0.2 -> z=0; 0.3 split 0.15/0.15 between z=0 and z=1; 0.5 -> z=1.
    ("interior", 0.5, 0.5, [0.2, 0.3, 0.5], [0.0, 0.35, 0.65]),
    # terminal D = 0: every atom lands on R = 0.25 -> 0.75 on z=0, 0.25 on z=1.
    ("terminal", 0.25, 0.0, [0.2, 0.3, 0.5], [0.0, 0.75, 0.25]),
    # Tz = [1, 2, 3] clipped to v_max = 1: all mass on z=1.
    ("clip v_max", 2.0, 1.0, [0.2, 0.3, 0.5], [0.0, 0.0, 1.0]),
    # Tz = [-3.5, -3, -2.5] clipped to v_min = -1: all mass on z=-1.
    ("clip v_min", -3.0, 0.5, [0.2, 0.3, 0.5], [1.0, 0.0, 0.0]),
    # Tz = [-1.5 -> -1, -0.25, 1.0]: 0.1 -> z=-1; 0.6 split 0.15/0.45 (z=-1/z=0); 0.3 -> z=1.
    ("mixed clip", -0.25, 1.25, [0.1, 0.6, 0.3], [0.25, 0.45, 0.3]),
    # identity: R = 0, D = 1 maps every atom onto itself.
    ("identity", 0.0, 1.0, [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),
]


@pytest.mark.parametrize("name, r, d, p, expected", PROJECTION_CASES, ids=[c[0] for c in PROJECTION_CASES])
def test_categorical_projection_exact(name, r, d, p, expected):
    import tensorflow as tf
    from core.agents.d4pg.losses import categorical_projection, categorical_projection_np
    atoms = np.array([-1.0, 0.0, 1.0], np.float32)
    got = categorical_projection(tf.constant([r], tf.float32), tf.constant([d], tf.float32),
                                 tf.constant([p], tf.float32), tf.constant(atoms)).numpy()[0]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(categorical_projection_np([r], [d], [p], atoms)[0], expected, atol=1e-12)


def test_projection_batched_matches_reference_and_keeps_mass():
    import tensorflow as tf
    from core.agents.d4pg.losses import categorical_projection, categorical_projection_np
    rng = np.random.default_rng(0)
    atoms = np.linspace(-10, 10, 51).astype(np.float32)
    p = rng.dirichlet(np.ones(51), size=64).astype(np.float32)
    r = rng.normal(0, 5, 64).astype(np.float32)
    d = np.where(rng.random(64) < 0.2, 0.0, 0.99 ** 3).astype(np.float32)
    got = categorical_projection(tf.constant(r), tf.constant(d), tf.constant(p), tf.constant(atoms)).numpy()
    np.testing.assert_allclose(got, categorical_projection_np(r, d, p, atoms), atol=1e-4)  # float32 vs float64
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_expected_value_and_critic_loss_exact():
    import tensorflow as tf
    from core.agents.d4pg.losses import critic_loss, expected_value
    logits = tf.math.log(tf.constant([[0.2, 0.3, 0.5]]))
    atoms = tf.constant([-1.0, 0.0, 1.0])
    assert expected_value(logits, atoms).numpy()[0] == pytest.approx(0.3, abs=1e-6)
    m = tf.constant([[0.0, 0.35, 0.65]])
    assert critic_loss(logits, m).numpy()[0] == pytest.approx(-(0.35 * np.log(0.3) + 0.65 * np.log(0.5)), abs=1e-6)


@pytest.mark.parametrize("actor, ladder, expected", [
    (0, 0, 0.4), (3, 1, 0.4), (0, 3, 0.4), (1, 3, 0.2), (2, 3, 0.1), (5, 3, 0.1)])
def test_noise_ladder_exact(actor, ladder, expected):
    assert noise_sigma(0.4, 0.1, ladder, actor) == pytest.approx(expected)


def test_tanh_gaussian_selector_scales_to_bounds():
    from core.envs import EnvSpec
    from core.exploration import SELECTORS, greedy_params
    spec = EnvSpec("x", (3,), "float32", None, (2,), "float32", (-2.0, 0.0), (2.0, 1.0))
    x = np.array([[-1.0, -1.0], [0.0, 0.0], [0.5, 1.0], [3.0, -3.0]], np.float32)
    a, _ = SELECTORS["tanh_gaussian"](x, greedy_params("tanh_gaussian"), np.random.default_rng(0), spec)
    np.testing.assert_allclose(a, [[-2.0, 0.0], [0.0, 0.5], [1.0, 1.0], [2.0, 0.0]])
    noisy, _ = SELECTORS["tanh_gaussian"](np.zeros((1000, 2), np.float32), {"sigma": 5.0},
                                          np.random.default_rng(0), spec)
    assert noisy[:, 0].min() == -2.0 and noisy[:, 0].max() == 2.0 and noisy[:, 1].min() == 0.0


def test_config_validation_one_line_errors():
    from core.config import ConfigError, load_config
    cfg = load_config("configs/pendulum-d4pg.yaml", ["agent.num_atoms=21"])
    assert cfg.agent.num_atoms == 21 and cfg.agent.algo == "d4pg"
    with pytest.raises(ConfigError, match="v_min < v_max"):
        load_config("configs/pendulum-d4pg.yaml", ["agent.v_min=5", "agent.v_max=1"])
    with pytest.raises(ConfigError, match="agent.tau"):
        load_config("configs/pendulum-d4pg.yaml", ["agent.tau=0"])
    with pytest.raises(ConfigError, match="continuous"):
        load_config("configs/pendulum-d4pg.yaml", ["env.id=CartPole-v1"])
    with pytest.raises(ConfigError, match="actors.precision.*valid: fp32, fp16, int8-dynamic, int8-full"):
        load_config("configs/pendulum-d4pg.yaml", ["actors.precision=int4"])


def _fake_batch(rng, k=None, b=32):
    shape = (b,) if k is None else (k, b)
    return {"observation": rng.normal(size=shape + (3,)).astype(np.float32),
            "action": rng.uniform(-2, 2, size=shape + (1,)).astype(np.float32),
            "reward": np.full(shape, -1.0, np.float32), "discount": np.zeros(shape, np.float32),
            "next_observation": rng.normal(size=shape + (3,)).astype(np.float32)}


@pytest.mark.slow
def test_learner_fits_terminal_target_and_state_round_trips():
    from core.agents.d4pg.config import D4PGConfig
    from core.agents.d4pg.learning import D4PGLearner
    from core.envs import env_spec
    cfg = D4PGConfig(policy_hidden=[16], critic_hidden=[32], num_atoms=11, v_min=-5, v_max=5,
                     critic_learning_rate=1e-2, target_update="periodic", target_update_period=7)
    learner = D4PGLearner(env_spec("Pendulum-v1"), cfg, seed=0)
    rng = np.random.default_rng(0)
    first = learner.step(_fake_batch(rng))
    m = learner.step(_fake_batch(rng, k=40))       # [K, B] batches: 40 steps in one call
    for _ in range(4):
        m = learner.step(_fake_batch(rng, k=40))
    assert learner.steps == 201
    # Terminal targets put all mass on z = -1: the critic's mean converges there, loss -> 0.
    assert m["q_mean"] == pytest.approx(-1.0, abs=0.15) and m["loss"] < 0.2 * first["loss"]
    out = learner.policy_model(np.zeros((4, 3), np.float32)).numpy()
    assert out.shape == (4, 1) and np.all(np.abs(out) <= 1.0)
    state = learner.state()
    other = D4PGLearner(env_spec("Pendulum-v1"), cfg, seed=1)
    other.restore(state)
    assert other.steps == 201
    for group in ("params", "critic_params", "target_params", "target_critic_params", "optimizer"):
        for k, v in state[group].items():
            np.testing.assert_array_equal(other.state()[group][k], v)


def test_soft_target_update_exact():
    from core.agents.d4pg.config import D4PGConfig
    from core.agents.d4pg.learning import D4PGLearner
    from core.envs import env_spec
    learner = D4PGLearner(env_spec("Pendulum-v1"), D4PGConfig(policy_hidden=[4], critic_hidden=[4],
                                                              tau=0.25), seed=0)
    before_t = [w.copy() for w in learner.target_critic.get_weights()]
    learner.step(_fake_batch(np.random.default_rng(1), b=8))
    after = learner.critic.get_weights()
    for t0, s1, t1 in zip(before_t, after, learner.target_critic.get_weights()):
        np.testing.assert_allclose(t1, 0.25 * s1 + 0.75 * t0, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_policy_is_quantizable_mlp():
    from core.agents.d4pg.config import D4PGConfig
    from core.agents.d4pg.learning import D4PGLearner
    from core.envs import env_spec
    from core.policy import LiteRTPolicy
    from core.quantize import PolicyQuantizer, action_agreement
    learner = D4PGLearner(env_spec("Pendulum-v1"), D4PGConfig(policy_hidden=[64, 64]), seed=0)
    obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    ref = learner.policy_model(obs).numpy()
    for precision in ("fp32", "int8-dynamic"):
        payload = PolicyQuantizer(precision, patch=True).quantize(learner.policy_model, version=1)
        out = LiteRTPolicy(payload, batch_size=8)(obs)
        assert action_agreement(ref, out, discrete=False) < (1e-5 if precision == "fp32" else 0.05)


@pytest.mark.slow
def test_pendulum_learning_regression(tmp_path):
    """Budget: 6,000 env steps, local executor, int8-dynamic actors; ~30-40 s on 2 cores.

    Asserts eval return >= -400 (random: about -1200..-1500). Measured: the
    config solves -200 at 4,096 env steps (best eval about -145) in ~25 s.
    """
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config("configs/pendulum-d4pg.yaml",
                      ["executor=local", "total_env_steps=6000", "carbon.backend='off'", "eval.stop_at_target=true"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["best_eval_return"] >= -400, summary
    assert summary["final_eval"]["int8-dynamic"]["mean"] >= -400, summary
