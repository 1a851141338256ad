"""V-trace: exact targets worked out by hand, learner plumbing, and a learning-regression run."""
import math
import os

import numpy as np
import pytest


def _vtrace(**kw):
    from core.agents.vtrace.losses import vtrace_targets
    vs, adv = vtrace_targets(**kw)
    return vs.numpy(), adv.numpy()


def test_vtrace_by_hand_with_a_terminal_inside_the_unroll():
    # One unroll, T = 3, gamma = 0.9, rho_bar = c_bar = lambda = 1.
    #   t=0: x0 -> x1, r=1, ratio 0.5 -> rho=c=0.5
    #   t=1: x1 -> x2, r=1, ratio 2   -> rho=c=1 (truncated); x2 is TERMINAL: g_1 = 0
    #   t=2: x2 is the episode's last row: not a transition (valid = 0)
    # V = [1, 2, 3], V(next) = [2, 3, 3]
    #   delta_1 = 1 * (1 + 0 - 2) = -1            v_1 = 2 - 1 = 1
    #   delta_0 = 0.5 * (1 + 0.9*2 - 1) = 0.9     v_0 = 1 + 0.9 + 0.9*0.5*(-1) = 1.45
    #   A_0 = 0.5 * (1 + 0.9 * v_1 - 1) = 0.45    A_1 = 1 * (1 + 0 - 2) = -1   A_2 = 0
    # Column 2: same rewards, on-policy, no terminal (bootstraps at the unroll end):
    #   v_2 = 3 + (1 + 0.9*5 - 3) = 5.5 ; v_1 = 2 + (1 + 0.9*3 - 2) + 0.9*2.5 = 5.95 ;
    #   v_0 = 1 + (1 + 1.8 - 1) + 0.9 * 3.95 = 6.355   (= 1 + .9 + .81 + .729*5, the 3-step return)
    vs, adv = _vtrace(
        log_rhos=np.log([[0.5, 1.0], [2.0, 1.0], [1.0, 1.0]]),
        discounts=[[0.9, 0.9], [0.0, 0.9], [0.9, 0.9]],
        rewards=[[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]],
        values=[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]],
        next_values=[[2.0, 2.0], [3.0, 3.0], [3.0, 5.0]],
        valid=[[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    np.testing.assert_allclose(vs[:, 0], [1.45, 1.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(adv[:, 0], [0.45, -1.0, 0.0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(vs[:, 1], [6.355, 5.95, 5.5], rtol=1e-6)
    np.testing.assert_allclose(vs[0, 1], 1 + 0.9 + 0.81 + 0.729 * 5, rtol=1e-6)
    # A_t = r_t + g v_{t+1} - V(x_t) on-policy
    np.testing.assert_allclose(adv[:, 1], [1 + 0.9 * 5.95 - 1, 1 + 0.9 * 5.5 - 2, 1 + 0.9 * 5 - 3], rtol=1e-6)


def test_vtrace_truncated_final_row_bootstraps_and_lambda_cuts_traces():
    # x1 is a TRUNCATED last row: g_0 = gamma (bootstrap from V(x1) = 2), t=1 invalid.
    vs, adv = _vtrace(log_rhos=[[0.0], [0.0]], discounts=[[0.5], [0.5]], rewards=[[1.0], [7.0]],
                      values=[[1.0], [2.0]], next_values=[[2.0], [9.0]], valid=[[1.0], [0.0]])
    np.testing.assert_allclose(vs[:, 0], [1.0 + (1 + 0.5 * 2 - 1), 2.0])
    np.testing.assert_allclose(adv[:, 0], [1.0, 0.0])
    # lambda = 0: v_t = V(x_t) + delta_t (one-step TD targets)
    from core.agents.vtrace.losses import vtrace_targets
    vs, _ = vtrace_targets([[0.0], [0.0]], [[0.5], [0.5]], [[1.0], [1.0]], [[1.0], [2.0]], [[2.0], [4.0]],
                           [[1.0], [1.0]], lam=0.0)
    np.testing.assert_allclose(vs.numpy()[:, 0], [2.0, 3.0])


def _fake_sequences(b=8, l=6, seed=0):
    rng = np.random.default_rng(seed)
    term = np.zeros((b, l), bool)
    term[:, 3] = True
    mask = np.ones((b, l), bool)
    mask[:, 4:] = False
    return {"observation": rng.normal(size=(b, l, 4)).astype(np.float32), "action": rng.integers(0, 2, (b, l)),
            "reward": np.ones((b, l), np.float32), "discount": np.where(term, 0.0, 1.0).astype(np.float32),
            "terminated": term, "truncated": np.zeros((b, l), bool), "mask": mask,
            "extras/logits": np.zeros((b, l, 2), np.float32)}


def test_learner_fits_values_steps_k_at_once_and_round_trips_state():
    from core.agents.vtrace.config import VTraceConfig
    from core.agents.vtrace.learning import VTraceLearner
    from core.envs import env_spec
    cfg = VTraceConfig(hidden=[16], learning_rate=1e-2, entropy_cost=0.0)
    learner = VTraceLearner(env_spec("CartPole-v1"), cfg, seed=0)
    batch = _fake_sequences()
    first = learner.step(batch)
    for _ in range(100):
        m = learner.step(batch)
    assert math.isfinite(m["loss"]) and m["q_mean"] > first["q_mean"]
    k = {key: np.stack([v, v]) for key, v in batch.items()}
    learner.step(k)
    assert learner.steps == 103
    other = VTraceLearner(env_spec("CartPole-v1"), cfg, seed=1)
    other.restore(learner.state())
    assert other.steps == 103
    obs = batch["observation"][:, 0]
    np.testing.assert_allclose(other.policy(obs).numpy(), learner.policy(obs).numpy(), rtol=1e-6)



def test_learning_rate_decays_linearly_and_resumes_from_the_checkpointed_step():
    from core.agents.vtrace.config import VTraceConfig
    from core.agents.vtrace.learning import VTraceLearner
    from core.envs import env_spec
    cfg = VTraceConfig(hidden=[8], learning_rate=1e-3, learning_rate_decay_steps=10, learning_rate_end=1e-4)
    learner = VTraceLearner(env_spec("CartPole-v1"), cfg, seed=0)
    lr = lambda lrn: float(lrn.optimizer.learning_rate.numpy())  # noqa: E731  evaluated at the current step
    assert lr(learner) == pytest.approx(1e-3, rel=1e-6)
    batch = _fake_sequences()
    learner.step({key: np.stack([v] * 4) for key, v in batch.items()})
    assert lr(learner) == pytest.approx(1e-3 - 0.4 * 9e-4, rel=1e-6)          # 4 of 10 steps: 6.4e-4
    other = VTraceLearner(env_spec("CartPole-v1"), cfg, seed=1)
    other.restore(learner.state())
    assert lr(other) == pytest.approx(6.4e-4, rel=1e-6)
    other.step({key: np.stack([v] * 8) for key, v in batch.items()})
    assert lr(other) == pytest.approx(1e-4, rel=1e-6)                         # held at the end value
    constant = VTraceLearner(env_spec("CartPole-v1"), VTraceConfig(hidden=[8]), seed=0)
    assert float(constant.optimizer.learning_rate.numpy()) == pytest.approx(1e-3, rel=1e-6)

def test_unknown_agent_inference_combination_is_a_config_error():
    from core.config import ConfigError, load_config
    with pytest.raises(ConfigError, match="agent 'vtrace' needs a discrete action space"):
        load_config(os.path.join("configs", "cartpole-vtrace.yaml"), ["env.id=Pendulum-v1"])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_vtrace_learns_cartpole_local_inference(tmp_path):
    """Learning regression: V-trace with int8 actors reaches >= 200 on CartPole in a bounded budget."""
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=local", "total_env_steps=120000", "eval.target_return=200",
                       "eval.confirm_episodes=20"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["best_eval_return"] >= 200, summary
