"""R2D2: value rescaling, priorities, epsilon ladder, n-step double-Q targets, burn-in, state, learning.

Budgets (2-core CI machine): the unit tests take seconds; the learning
regression on pomdp:CartPole-v1 is bounded (see its docstring).
"""
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "replay"))

from core.agents.r2d2.actor import LSTMCarry, ladder_epsilon  # noqa: E402
from core.agents.r2d2.losses import (inverse_value_rescale, nstep_indices, sequence_priorities,  # noqa: E402
                                     value_rescale)


# -- value rescaling -----------------------------------------------------------------------------------

@pytest.mark.parametrize("x, hx", [
    (0.0, 0.0),
    (3.0, 1.003),          # sqrt(4) - 1 + 0.003
    (-8.0, -2.008),        # -(sqrt(9) - 1) - 0.008
    (99.0, 9.099),         # sqrt(100) - 1 + 0.099
    (4.0, math.sqrt(5) - 1 + 0.004),
])
def test_value_rescaling_exact_values(x, hx):
    assert value_rescale(x, 1e-3) == pytest.approx(hx, abs=1e-12)
    assert inverse_value_rescale(hx, 1e-3) == pytest.approx(x, abs=1e-9)


def test_inverse_value_rescaling_exact_values_and_round_trip():
    # h^-1(2): the x with sqrt(x+1) - 1 + 0.001 x = 2 (checked by substitution below).
    x = inverse_value_rescale(2.0, 1e-3)
    assert x == pytest.approx(7.952349144987128, abs=1e-12)
    assert math.sqrt(x + 1) - 1 + 1e-3 * x == pytest.approx(2.0, abs=1e-12)
    xs = np.concatenate([np.linspace(-1e4, 1e4, 2001), np.linspace(-3, 3, 601), [0.0, 1e6, -1e6]])
    for eps in (1e-3, 1e-2):
        np.testing.assert_allclose(inverse_value_rescale(value_rescale(xs, eps), eps), xs, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(value_rescale(inverse_value_rescale(xs, eps), eps), xs, rtol=1e-9, atol=1e-9)


def test_value_rescaling_tf_matches_numpy():
    import tensorflow as tf
    xs = np.linspace(-500, 500, 101)
    np.testing.assert_allclose(value_rescale(tf.constant(xs)).numpy(), value_rescale(xs), rtol=1e-12)
    np.testing.assert_allclose(inverse_value_rescale(tf.constant(xs)).numpy(), inverse_value_rescale(xs),
                               rtol=1e-12)


# -- priorities and exploration -------------------------------------------------------------------------

def test_sequence_priority_is_eta_max_plus_one_minus_eta_mean_over_valid_steps():
    td = np.array([[1.0, -2.0, 3.0, 100.0],     # last step invalid: ignored
                   [0.5, 0.5, 0.5, 0.5]])
    valid = np.array([[True, True, True, False], [True, True, True, True]])
    p = sequence_priorities(td, valid, eta=0.9)
    assert p[0] == pytest.approx(0.9 * 3.0 + 0.1 * 2.0)        # 2.9
    assert p[1] == pytest.approx(0.5)
    assert sequence_priorities(td, valid, eta=0.0)[0] == pytest.approx(2.0)   # mean only


def test_ape_x_epsilon_ladder_exact_values():
    eps = [ladder_epsilon(i, 4, 0.4, 7.0) for i in range(4)]
    np.testing.assert_allclose(eps, [0.4, 0.4 ** (10 / 3), 0.4 ** (17 / 3), 0.4 ** 8], rtol=1e-12)
    np.testing.assert_allclose(eps, [0.4, 0.0471556, 0.0055591, 0.00065536], rtol=1e-5)
    assert ladder_epsilon(0, 1) == 0.4                       # one actor: eps itself
    assert ladder_epsilon(5, 4) == ladder_epsilon(1, 4)     # ids beyond N wrap around
    from core.agents.r2d2.builder import R2D2Builder
    from core.agents.r2d2.config import R2D2Config
    assert R2D2Builder().exploration(R2D2Config(), 12345, 3) == {"epsilon": pytest.approx(0.4 ** 8)}


# -- n-step double-Q targets ----------------------------------------------------------------------------

def _hand_batch():
    """Three sequences of L = 6 rows, burn-in 1, n = 3, gamma = 0.5.

    seq 0: rows 0-3 are one episode, row 3 *terminated* (last), rows 4-5 padding (mask False).
    seq 1: six rows inside one episode, reward 1 each (window end limits n).
    seq 2: like seq 0 but row 3 is *truncated*: bootstraps from its final observation.
    """
    reward = np.array([[1, 2, 4, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 2, 4, 0, 0, 0]], np.float32)
    last = np.zeros((3, 6), bool)
    last[0, 3:] = last[2, 3:] = True
    discount = np.ones((3, 6), np.float32)
    discount[0, 3:] = 0.0
    mask = np.ones((3, 6), bool)
    mask[0, 4:] = mask[2, 4:] = False
    return reward, discount, last, mask


def test_nstep_indices_by_hand_with_a_terminal_inside():
    reward, discount, last, mask = _hand_batch()
    ret, boot, disc, valid = nstep_indices(reward, discount, last, mask, n=3, gamma=0.5, burn_in=1)
    np.testing.assert_array_equal(valid, [[0, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]])
    # seq 0: t=1: r1 + g r2 = 2 + 2 = 4, stops at the terminated row 3 (k=2): D = 0.25 * 0 = 0
    #        t=2: r2 = 4 (k=1), D = 0
    np.testing.assert_allclose(ret[0, 1:3], [4.0, 4.0])
    np.testing.assert_array_equal(boot[0, 1:3], [3, 3])
    np.testing.assert_allclose(disc[0, 1:3], [0.0, 0.0])
    # seq 1: t=1: 1 + .5 + .25 = 1.75 -> row 4, D = .125; t=2: 1.75 -> row 5, D = .125;
    #        t=3: window end after 2 steps: 1.5 -> row 5, D = .25; t=4: 1 -> row 5, D = .5
    np.testing.assert_allclose(ret[1, 1:5], [1.75, 1.75, 1.5, 1.0])
    np.testing.assert_array_equal(boot[1, 1:5], [4, 5, 5, 5])
    np.testing.assert_allclose(disc[1, 1:5], [0.125, 0.125, 0.25, 0.5])
    # seq 2: truncated, not terminated: same returns, D = g^k
    np.testing.assert_allclose(ret[2, 1:3], [4.0, 4.0])
    np.testing.assert_allclose(disc[2, 1:3], [0.25, 0.5])


def test_double_q_targets_on_rescaled_values_by_hand():
    import tensorflow as tf
    from core.agents.r2d2.losses import double_q_targets
    reward, discount, last, mask = _hand_batch()
    ret, boot, disc, valid = nstep_indices(reward, discount, last, mask, n=3, gamma=0.5, burn_in=1)
    q_online = np.zeros((3, 6, 2), np.float32)
    q_target = np.zeros((3, 6, 2), np.float32)
    q_online[1, 4], q_target[1, 4] = [0.0, 1.0], [5.0, 2.0]   # online picks a=1: bootstrap 2, not max 5
    q_online[1, 5], q_target[1, 5] = [3.0, 0.0], [1.0, 7.0]   # online picks a=0: bootstrap 1, not max 7
    q_online[2, 3], q_target[2, 3] = [0.0, 1.0], [9.0, 2.0]   # truncated row: bootstrap 2
    y = double_q_targets(tf.constant(q_online), tf.constant(q_target), ret, boot, disc, 1e-3).numpy()
    # h^-1(1) = 2.988056701675916, h^-1(2) = 7.952349144987128 (eps = 1e-3)
    expected = {
        (0, 1): math.sqrt(5) - 1 + 0.004,                       # h(4): terminated, no bootstrap
        (0, 2): math.sqrt(5) - 1 + 0.004,
        (1, 1): 0.9376971808336321,      # h(1.75 + 0.125 h^-1(2))
        (1, 2): 0.7694681502485983,      # h(1.75 + 0.125 h^-1(1))
        (1, 3): 0.8041943428781697,      # h(1.5 + 0.25 h^-1(1))
        (1, 4): 0.8717260500212239,      # h(1 + 0.5 h^-1(1))
        (2, 1): 1.6494871484260047,      # h(4 + 0.25 h^-1(2)): truncated row bootstraps
        (2, 2): 2.0040026384899208,      # h(4 + 0.5 h^-1(2))
    }
    for (b, t), v in expected.items():
        assert y[b, t] == pytest.approx(v, abs=1e-5), (b, t)


# -- burn-in and recurrent state -----------------------------------------------------------------------

def _spec():
    from core.envs import env_spec
    return env_spec("pomdp:CartPole-v1")


def _cfg(**kw):
    from core.agents.r2d2.config import R2D2Config
    base = dict(torso=[16], lstm_size=8, head=[16], sequence_length=8, burn_in=3, n_step=2, batch_size=4)
    base.update(kw)
    return R2D2Config(**base)


def test_burn_in_rows_receive_no_gradient_and_are_masked_out_of_the_loss():
    import tensorflow as tf
    from core.agents.r2d2.networks import recurrent_q_network, unroll
    net = recurrent_q_network(2, 2, [16], 8, [16], seed=1)
    rng = np.random.default_rng(0)
    obs = tf.Variable(rng.standard_normal((4, 8, 2)).astype(np.float32))
    h0 = tf.Variable(rng.standard_normal((4, 8)).astype(np.float32))
    c0 = tf.Variable(rng.standard_normal((4, 8)).astype(np.float32))
    with tf.GradientTape() as tape:
        q = unroll(net, obs, h0, c0, 2, burn_in=3)
        loss = tf.reduce_sum(tf.square(q))                # even a loss on every row
    g_obs, g_h, g_c = tape.gradient(loss, [obs, h0, c0])
    assert g_h is None or not np.any(g_h.numpy()) and not np.any(g_c.numpy())
    g = np.abs(g_obs.numpy()).sum(axis=(0, 2))
    assert np.all(g[:3] == 0.0) and np.all(g[3:] > 0.0), g
    # and the learning rows start after burn-in
    reward = np.ones((1, 8), np.float32)
    _, _, _, valid = nstep_indices(reward, np.ones((1, 8), np.float32), np.zeros((1, 8), bool),
                                   np.ones((1, 8), bool), n=2, gamma=0.9, burn_in=3)
    np.testing.assert_array_equal(valid[0], [0, 0, 0, 1, 1, 1, 1, 0])


@pytest.mark.parametrize("burn_in", [0, 3, 8])
def test_unroll_is_the_step_model_called_once_per_row_bit_for_bit_eager_and_traced(burn_in):
    """The learner's unroll (two graph loops, core.agents.r2d2.networks) computes exactly the Q-values of
    ``L`` calls of the step model the actors run, from the same stored state, eagerly and inside a graph."""
    import tensorflow as tf
    from core.agents.r2d2.networks import recurrent_q_network, step, unroll
    net = recurrent_q_network(2, 2, [16], 8, [16], seed=1)
    rng = np.random.default_rng(0)
    obs = tf.constant(rng.standard_normal((4, 8, 2)).astype(np.float32))
    h0, c0 = (tf.constant(rng.standard_normal((4, 8)).astype(np.float32)) for _ in range(2))
    h, c, calls = h0, c0, []
    for t in range(8):
        q, h, c = step(net, obs[:, t], h, c, 2)
        calls.append(q.numpy())
    expected = np.stack(calls, axis=1)
    traced = tf.function(lambda o, h, c: unroll(net, o, h, c, 2, burn_in=burn_in))
    assert np.array_equal(unroll(net, obs, h0, c0, 2, burn_in=burn_in).numpy(), expected)
    assert np.array_equal(traced(obs, h0, c0).numpy(), expected)


def _rollout(payload, steps=60, num_envs=3):
    from core.actor import ActorSpec
    from core.rollout import run_rollout_task
    spec = ActorSpec("r2d2-test", "pomdp:CartPole-v1", num_envs, 0, 0, selector="recurrent_epsilon_greedy")
    return run_rollout_task(spec, payload, 0, steps, {"epsilon": 0.5}).batch


def test_actor_carries_state_stores_it_and_learner_unroll_reproduces_it():
    """State round trip: actor (LiteRT, fp32) -> replay extras -> learner unroll from the stored state."""
    import tensorflow as tf
    from core.agents.r2d2.learning import R2D2Learner
    from core.agents.r2d2.networks import step
    from core.quantize import PolicyQuantizer
    learner = R2D2Learner(_spec(), _cfg(), seed=0)
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=1)
    batch = _rollout(payload)
    h, c = batch.extras["lstm_h"], batch.extras["lstm_c"]          # [T, E, H]
    assert h.shape == (60, 3, 8) and c.shape == (60, 3, 8)
    first = batch.step == 0
    assert first[1:].any()                                         # episodes restarted inside the rollout
    assert not np.any(h[first]) and not np.any(c[first])           # zeroed at every episode start
    # From each row's stored state, one learner step on its observation gives the next row's stored state.
    t_obs = tf.constant(batch.observation[:-1].reshape(-1, 2))
    _, h1, c1 = step(learner.q, t_obs, tf.constant(h[:-1].reshape(-1, 8)), tf.constant(c[:-1].reshape(-1, 8)), 2)
    cont = ~first[1:].reshape(-1)
    np.testing.assert_allclose(h1.numpy()[cont], h[1:].reshape(-1, 8)[cont], atol=1e-5)
    np.testing.assert_allclose(c1.numpy()[cont], c[1:].reshape(-1, 8)[cont], atol=1e-5)
    assert np.abs(h[~first]).max() > 1e-3                          # a state that actually carries


@pytest.mark.slow
def test_learner_step_priorities_and_checkpoint_round_trip():
    from core.agents.r2d2.learning import R2D2Learner
    from core.quantize import PolicyQuantizer
    cfg = _cfg()
    learner = R2D2Learner(_spec(), cfg, seed=0)
    batch = _rollout(PolicyQuantizer("fp32").quantize(learner.policy_model, version=1), steps=40, num_envs=4)
    seq = {k: np.swapaxes(v, 0, 1)[:, :8] for k, v in
           [("observation", batch.observation), ("action", batch.action), ("reward", batch.reward),
            ("discount", batch.discount), ("terminated", batch.terminated), ("truncated", batch.truncated),
            ("extras/lstm_h", batch.extras["lstm_h"]), ("extras/lstm_c", batch.extras["lstm_c"])]}
    seq["mask"] = np.ones((4, 8), bool)
    seq["weight"] = np.ones(4, np.float32)
    m = learner.step(seq)
    assert m["td_abs"].shape == (4,) and np.all(m["td_abs"] >= 0) and np.isfinite(m["loss"])
    other = R2D2Learner(_spec(), cfg, seed=5)
    other.restore(learner.state())
    x = np.random.default_rng(1).standard_normal((5, 2 + 16)).astype(np.float32)
    np.testing.assert_allclose(other.q(x).numpy(), learner.q(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(other.target(x).numpy(), learner.target(x).numpy(), rtol=1e-6)
    assert other.steps == learner.steps == 1


def test_carry_sizes_from_payload_and_rejects_feed_forward_payloads():
    from types import SimpleNamespace
    carry = LSTMCarry.for_payload(SimpleNamespace(input_dim=2 + 128, output_dim=2 + 128), 3, 2)
    assert (carry.num_actions, carry.lstm_size) == (2, 64)
    with pytest.raises(ValueError, match="not a recurrent"):
        LSTMCarry.for_payload(SimpleNamespace(input_dim=4, output_dim=2), 3, 4)


# -- prioritized sequence replay -------------------------------------------------------------------------

def test_prioritized_sequences_follow_priorities_with_importance_weights(tmp_path):
    from replay_fakes import batch_from_rows, episode_rows
    from core.agents.r2d2.sampler import PrioritizedSequenceSampler
    from core.replay import ReplayCache, ReplayStore
    store = ReplayStore.open_or_create(str(tmp_path / "r"))
    store.commit([store.write_shard("a0", [batch_from_rows(episode_rows(1, range(6), [1] * 6, "terminated"))]).id])
    cache = ReplayCache(store)
    cache.refresh()
    sampler = PrioritizedSequenceSampler(cache, length=3, burn_in=1, alpha=1.0, beta=1.0)
    rng = np.random.default_rng(0)
    batch = sampler.sample(400, rng)
    starts = batch["observation"][:, 0, 0].astype(int) % 100
    assert set(starts) == {0, 1, 2, 3}          # steps 4 (no learning row after burn-in) and 5 (last) never start
    # priorities 1, 1, 1, 5 for starts 0..3 -> P = 1/8, 1/8, 1/8, 5/8; w = (N P)^-1 / max = (0.5^-1, ..., 2.5^-1) / 2
    first = {int(s): int(i) for s, i in zip(starts, batch["index"][:, 0])}
    sampler.update_priorities(np.array([[first[3], -1, -1]]), np.array([5.0]))
    batch = sampler.sample(4000, rng)
    starts = batch["observation"][:, 0, 0].astype(int) % 100
    assert np.mean(starts == 3) == pytest.approx(5 / 8, abs=0.01)
    np.testing.assert_allclose(batch["weight"][starts == 3], 0.2, rtol=1e-5)
    np.testing.assert_allclose(batch["weight"][starts == 0], 1.0, rtol=1e-5)


# -- config, registry ------------------------------------------------------------------------------------

def test_config_loads_registered_and_rejects_bad_values():
    from core.config import ConfigError, load_config
    cfg = load_config(os.path.join("configs", "pomdp-cartpole-r2d2.yaml"))
    assert cfg.agent.algo == "r2d2" and cfg.agent.epsilon.num_actors == cfg.actors.num_actors
    with pytest.raises(ConfigError, match="config key 'agent.priority_eta' = 1.5 is out of range; valid: 0..1"):
        load_config(os.path.join("configs", "pomdp-cartpole-r2d2.yaml"), ["agent.priority_eta=1.5"])
    with pytest.raises(ConfigError, match="agent 'r2d2' needs a discrete action space"):
        load_config(os.path.join("configs", "pomdp-cartpole-r2d2.yaml"), ["env.id=Pendulum-v1"])


def test_pomdp_cartpole_hides_velocities():
    from core.envs import EnvError, check_env_id, make_env
    import gymnasium
    env, full = make_env("pomdp:CartPole-v1"), gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    state, _ = full.reset(seed=3)
    np.testing.assert_array_equal(obs, state[[0, 2]])
    for _ in range(5):
        obs, r, *_ = env.step(1)
        state, r_full, *_ = full.step(1)
        np.testing.assert_array_equal(obs, state[[0, 2]])
        assert r == r_full == 1.0
    assert env.observation_space.shape == (2,)
    # It pickles (an actor's state travels between Beam stages as a snapshot) and steps on identically.
    import pickle
    twin = pickle.loads(pickle.dumps(env))
    a, *_ = env.step(0)
    b, *_ = twin.step(0)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(EnvError, match="unknown POMDP env id 'pomdp:Acrobot-v1'; valid: pomdp:CartPole-v1"):
        check_env_id("pomdp:Acrobot-v1")


# -- learning regression ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_r2d2_learns_pomdp_cartpole_with_central_inference(tmp_path):
    """Learning regression (SEED mode): env-only actor processes, server-side LSTM state, int8 batched steps.

    The shipped config with ``inference=central`` reaches the config's bar within the config's own budget
    (250k env steps; the run stops at the target): the first evaluation whose mean reaches 400 is
    confirmed on 100 fresh episodes. The learning claim is the 5-seed sweep (benchmarks/RESULTS.md:
    5/5 reach 400 and end there, XLA learner step, 2026-12-07: 145k, 95k, 206k, 215k, 126k env steps
    for seeds 0-4). This test runs seed 1 (95k locally on an AVX-512 host, about a minute) rather than the
    config's seed 0 (145k), to keep CI short; any seed is the same regression guard, and a host whose
    kernels round differently follows its own trajectory, so the budget is the config's, not one host's
    stopping point. A feed-forward DQN peaks at 45 on these observations. It is R2D2's learning test
    for local inference too: a central run is the local run bit for bit
    (test_r2d2_central_run_is_the_local_run), so a separate local run to a lower bar repeats the same
    training for more CI minutes.
    """
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "pomdp-cartpole-r2d2.yaml"),
                      ["executor=local", "inference=central", "seed=1"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert cfg.eval.target_return == 400 and cfg.eval.confirm_episodes == 100 and cfg.eval.stop_at_target
    assert summary["best_eval_return"] >= 400 and summary["env_steps_to_target"] is not None, \
        {k: summary.get(k) for k in ("best_eval_return", "env_steps", "env_steps_to_target")}
    s = summary["inference"]
    assert s["batches"] > 0 and s["rejected"] == 0 and s["connections"] == cfg.actors.num_actors


@pytest.mark.parametrize("override, message", [
    ("actors.precision=int8-full", "agent 'r2d2' does not support actors.precision 'int8-full'"),
])
def test_unsupported_settings_are_config_errors(override, message):
    from core.config import CONFIG_DIR, ConfigError, load_config
    with pytest.raises(ConfigError, match=message):
        load_config(os.path.join(CONFIG_DIR, "pomdp-cartpole-r2d2.yaml"), [override])


# -- central inference (SEED): the server keeps the recurrent state ------------------------------------

def _central_server(payload, explore, **kw):
    from core.inference.endpoint import private_unix_socket
    from core.inference.server import InferenceServer
    plan = private_unix_socket()
    server = InferenceServer(plan.bind, payload, _spec(), unroll_length=16, selector="recurrent_epsilon_greedy",
                             explore=explore, **kw).start()
    return server, plan


def _central_actors(server, actor_ids, num_envs, steps):
    import threading
    from core.inference.client import run_env_actor_task
    from core.actor import ActorSpec
    out = {}
    threads = [threading.Thread(target=lambda a=a: out.update({a: run_env_actor_task(
        server.endpoint(), ActorSpec("c", "pomdp:CartPole-v1", num_envs, 0, a), max_env_steps=num_envs * steps)}))
        for a in actor_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_central_server_carries_state_per_env_batches_actors_and_explores_per_actor():
    """Server-side R2D2 step: (h, c) per env, zeroed at episode starts, stored as extras, batched across actors.

    Actor 0 acts greedily and actor 1 uniformly at random (per-actor parameters, as the ladder gives):
    actor 0's actions are exactly argmax Q of the learner's step from the stored state.
    """
    import tensorflow as tf
    from core.agents.r2d2.learning import R2D2Learner
    from core.agents.r2d2.networks import step
    from core.quantize import PolicyQuantizer
    learner = R2D2Learner(_spec(), _cfg(), seed=0)
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=1)
    server, plan = _central_server(payload, lambda a: {"epsilon": 0.0 if a == 0 else 1.0}, max_wait_s=0.2)
    try:
        out = _central_actors(server, [0, 1], num_envs=3, steps=100)
        batches, stats = server.drain(), server.stats()
    finally:
        server.stop()
        plan.cleanup()
    assert out[0]["env_steps"] == out[1]["env_steps"] == 300 and len(batches) == 2 * (99 // 16)
    assert stats["rows"] / stats["batches"] > 4.5            # most batches hold both actors' 3 envs
    agree = {}
    for b in batches:
        h, c = b.extras["lstm_h"], b.extras["lstm_c"]           # [T, E, H]
        assert h.shape == (16, 3, 8) and c.shape == (16, 3, 8)
        first = b.step == 0
        assert not np.any(h[first]) and not np.any(c[first])   # zeroed at every episode start
        q, h1, c1 = step(learner.q, tf.constant(b.observation.reshape(-1, 2)), tf.constant(h.reshape(-1, 8)),
                         tf.constant(c.reshape(-1, 8)), 2)
        cont = ~first[1:].reshape(-1)
        np.testing.assert_allclose(h1.numpy()[:-3][cont], h[1:].reshape(-1, 8)[cont], atol=1e-5)
        np.testing.assert_allclose(c1.numpy()[:-3][cont], c[1:].reshape(-1, 8)[cont], atol=1e-5)
        acting = ~(b.terminated | b.truncated).reshape(-1)      # last rows hold a padding action
        same = np.argmax(q.numpy(), axis=-1)[acting] == b.action.reshape(-1)[acting]
        agree.setdefault(b.actor_id, []).extend(same.tolist())
    assert np.all(agree[0])                                     # greedy on the stored state's Q
    assert 0.3 < np.mean(agree[1]) < 0.7                        # epsilon 1: uniform over 2 actions
    assert max(np.abs(b.extras["lstm_h"]).max() for b in batches) > 1e-3


def test_reconnect_drops_stale_recurrent_state_and_starts_fresh_episodes():
    import time
    import grpc
    from core.agents.r2d2.learning import R2D2Learner
    from core.inference.client import _Session
    from core.quantize import PolicyQuantizer
    from core.actor import ActorSpec
    learner = R2D2Learner(_spec(), _cfg(), seed=0)
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=1)
    server, plan = _central_server(payload, {"epsilon": 0.0})
    spec = ActorSpec("c", "pomdp:CartPole-v1", 2, 0, 7)
    rng = np.random.default_rng(0)

    def steps(session, n):
        for _ in range(n):
            session.send({"kind": "step"}, {"observation": rng.uniform(-0.1, 0.1, (2, 2)).astype(np.float32),
                                            "reward": np.ones(2, np.float32), "terminated": np.zeros(2, bool),
                                            "truncated": np.zeros(2, bool)})
            session.receive("actions")

    def wait_for(pred):
        deadline = time.time() + 10
        while not pred() and time.time() < deadline:
            time.sleep(0.01)
        return pred()

    try:
        with grpc.insecure_channel(server.address) as ch:
            first = _Session(ch, spec, (2,), "float32", server.endpoint().metadata)
            steps(first, 5)
            conn, h, c = server.recurrent_state(7)
            assert conn == first.connection and np.abs(h).max() > 1e-3 and np.abs(c).max() > 1e-3
            first.close()                                          # the stream breaks mid-episode
            assert wait_for(lambda: server.recurrent_state(7) is None)   # its state is dropped with it
            second = _Session(ch, spec, (2,), "float32", server.endpoint().metadata)
            conn, h, c = server.recurrent_state(7)
            assert conn == second.connection != first.connection and not h.any() and not c.any()
            steps(second, 17)
            third = _Session(ch, spec, (2,), "float32", server.endpoint().metadata)   # before the old one ends
            assert server.recurrent_state(7)[0] == third.connection
            second.close()
            time.sleep(0.2)
            assert server.recurrent_state(7)[0] == third.connection    # closing a stale stream keeps the new state
            third.close()
        (batch,) = server.drain()
    finally:
        server.stop()
        plan.cleanup()
    # The second connection played task 0 again from its start (the first one's 5 rows were dropped),
    # as incarnation 1: fresh episode ids (stream bits 21..), zeroed recurrent state.
    assert batch.task_id == "a0007-t0000000" and (first.incarnation, second.incarnation) == (0, 1)
    assert (batch.step[0] == 0).all() and not batch.extras["lstm_h"][0].any() and not batch.extras["lstm_c"][0].any()
    assert (((batch.episode_id >> 32) >> 21) == second.incarnation).all()           # fresh episode ids
    assert np.abs(batch.extras["lstm_h"][1:]).max() > 1e-3


@pytest.mark.slow
def test_local_and_central_unrolls_feed_one_sampler(tmp_path):
    """Same schema from both paths, so one PrioritizedSequenceSampler replays both (start state from extras)."""
    from core.agents.r2d2.learning import R2D2Learner
    from core.agents.r2d2.sampler import PrioritizedSequenceSampler
    from core.quantize import PolicyQuantizer
    from core.replay import ReplayCache, ReplayStore
    learner = R2D2Learner(_spec(), _cfg(), seed=0)
    payload = PolicyQuantizer("int8-dynamic").quantize(learner.policy_model, version=1)
    local = _rollout(payload, steps=48, num_envs=3)
    server, plan = _central_server(payload, {"epsilon": 0.5})
    try:
        _central_actors(server, [1], num_envs=3, steps=49)
        central = server.drain()
    finally:
        server.stop()
        plan.cleanup()
    assert len(central) == 3
    for name in ("observation", "action", "reward", "discount", "terminated", "truncated", "episode_id", "step",
                 "policy_version"):
        a, b = getattr(local, name), getattr(central[0], name)
        assert a.dtype == b.dtype and a.shape[1:] == b.shape[1:], name
    assert {k: (v.dtype, v.shape[1:]) for k, v in local.extras.items()} == \
        {k: (v.dtype, v.shape[1:]) for k, v in central[0].extras.items()}
    store = ReplayStore.open_or_create(str(tmp_path / "r"), env_id="pomdp:CartPole-v1")
    store.commit([store.write_shard("l0", [local]).id, store.write_shard("c0", central).id])
    cache = ReplayCache(store)
    cache.refresh()
    sampler = PrioritizedSequenceSampler(cache, length=8, burn_in=3)
    batch = sampler.sample(256, np.random.default_rng(0))
    actors = set(np.unique(batch["episode_id"][:, 0] >> 32) // 3)        # stream = actor * E + env
    assert actors == {0, 1}
    m = learner.step(batch)
    assert np.isfinite(m["loss"]) and m["td_abs"].shape == (256,)
    sampler.update_priorities(batch["index"], m["td_abs"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_r2d2_central_run_is_the_local_run(tmp_path):
    """SEED mode on the plan: the server's LSTM state, batching and sequences give the local actors' run.

    The server keeps (h, c) per env, zeroes it at episode starts and stores the state each step started
    from, as local actors do, and plays each planned task with its version, epsilon and RNG: parameters
    and replay (sequences with their stored state) are bit-identical. 2,048 env steps (about 30 s).
    """
    from core.config import load_config
    from pipelines.train import train
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "pipelines"))  # the run comparisons
    from test_determinism import _assert_same_run, _replay
    runs = []
    for inference in ("central", "local"):
        cfg = load_config(os.path.join("configs", "pomdp-cartpole-r2d2.yaml"),
                          ["executor=local", f"inference={inference}", "total_env_steps=2048", "replay.min_size=1024",
                           "eval.every_env_steps=1024", "eval.episodes=5", "eval.confirm_episodes=0"])
        run_dir = str(tmp_path / inference)
        runs.append((train(cfg, run_dir, progress=False), run_dir))
    assert runs[0][0]["learner_steps"] == 61 and runs[0][0]["inference"]["connections"] == 4
    (_, shard), *_ = _replay(runs[0][1])
    assert np.abs(shard["extras/lstm_h"]).max() > 1e-3                 # a state that actually carries
    _assert_same_run(runs[0], runs[1], "r2d2 central vs local")
