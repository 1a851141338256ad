"""R2D2's and BC's optimizer state restores whatever Keras named the optimizer in the saving process.

Keras numbers optimizers per process (``adam`` in a fresh one, ``adam_3`` after three others); the
checkpoint keys must not carry that name (``core.agents.variables``), checkpoints written with it
still load, and a key that does not match is an error, never a silent skip.
"""
import keras
import numpy as np
import pytest

from core.agents import variables
from core.envs import env_spec


def _r2d2(seed):
    from core.agents.r2d2.config import R2D2Config
    from core.agents.r2d2.learning import R2D2Learner
    cfg = R2D2Config(torso=[16], lstm_size=8, head=[16], sequence_length=8, burn_in=3, n_step=2, batch_size=4)
    return R2D2Learner(env_spec("pomdp:CartPole-v1"), cfg, seed=seed)


def _r2d2_batch(rng):
    b, t = 4, 8
    return {"observation": rng.standard_normal((b, t, 2)).astype(np.float32),
            "action": rng.integers(0, 2, (b, t)), "reward": rng.standard_normal((b, t)).astype(np.float32),
            "discount": np.ones((b, t), np.float32), "terminated": np.zeros((b, t), bool),
            "truncated": np.zeros((b, t), bool), "extras/lstm_h": np.zeros((b, t, 8), np.float32),
            "extras/lstm_c": np.zeros((b, t, 8), np.float32), "mask": np.ones((b, t), bool),
            "weight": np.ones(b, np.float32)}


def _bc(seed):
    from core.agents.bc.config import BCConfig
    from core.agents.bc.learning import BCLearner
    return BCLearner(env_spec("CartPole-v1"), BCConfig(hidden=[16]), seed=seed)


def _bc_batch(rng):
    return {"observation": rng.standard_normal((3, 32, 4)).astype(np.float32), "action": rng.integers(0, 2, (3, 32))}


AGENTS = {"r2d2": (_r2d2, _r2d2_batch, 1), "bc": (_bc, _bc_batch, 3)}


def _trained(agent):
    build, batch, iterations = AGENTS[agent]
    for _ in range(3):                                  # optimizers built before: this one is adam_<n>, n >= 3
        keras.optimizers.Adam()
    learner = build(0)
    learner.step(batch(np.random.default_rng(0)))
    assert learner.optimizer.name != "adam" and int(learner.optimizer.iterations.numpy()) == iterations
    return learner


def _opt(learner):
    return {v.path.split("/", 1)[1]: v.numpy() for v in learner.optimizer.variables}


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_adam_slots_and_iteration_restore_under_another_optimizer_name(agent):
    saved = _trained(agent)
    state = saved.state()
    assert sorted(state["optimizer"])[0] == "000_iteration"          # no optimizer name in any key
    fresh = AGENTS[agent][0](5)
    assert fresh.optimizer.name != saved.optimizer.name
    fresh.restore(state)
    want, got = _opt(saved), _opt(fresh)
    assert sorted(got) == sorted(want) and any(np.any(v != 0) for k, v in want.items() if k.endswith("_momentum"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert int(fresh.optimizer.iterations.numpy()) == AGENTS[agent][2]


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_a_checkpoint_written_with_the_optimizer_name_still_loads(agent):
    saved = _trained(agent)
    state = saved.state()
    old = {f"{i:03d}_{v.path.replace('/', '.')}": v.numpy() for i, v in enumerate(saved.optimizer.variables)}
    assert sorted(old)[0] == f"000_{saved.optimizer.name}.iteration"  # the old writer's key
    fresh = AGENTS[agent][0](5)
    fresh.restore({**state, "optimizer": old})
    for name, value in _opt(saved).items():
        np.testing.assert_array_equal(_opt(fresh)[name], value, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_a_missing_or_unexpected_optimizer_key_is_an_error(agent):
    learner = AGENTS[agent][0](0)
    state = learner.state()
    key = sorted(state["optimizer"])[-1]
    missing = {**state, "optimizer": {k: v for k, v in state["optimizer"].items() if k != key}}
    with pytest.raises(ValueError, match=rf"missing 1 \['{key}'\], unexpected 0"):
        learner.restore(missing)
    extra = {**state, "optimizer": {**state["optimizer"], "999_other_momentum": np.zeros(1)}}
    with pytest.raises(ValueError, match=r"missing 0 \[\], unexpected 1 \['999_other_momentum'\]"):
        learner.restore(extra)
    with pytest.raises(ValueError, match=r"missing \d+ \['000_iteration'"):
        learner.restore({k: v for k, v in state.items() if k != "optimizer"})


def test_optimizer_keys_are_index_and_variable_name_and_prefix_scopes_the_check():
    opt = keras.optimizers.Adam()
    opt.build([keras.Variable(np.zeros(2, np.float32), name="w")])
    state = variables.optimizer_state(opt, "policy")
    assert sorted(state) == ["policy_000_iteration", "policy_001_learning_rate", "policy_002_w_momentum",
                             "policy_003_w_velocity"]
    other = {"critic_000_iteration": np.zeros((), np.int64)}          # another optimizer's keys are not ours
    variables.restore_optimizer(opt, {**state, **other}, "policy", strict=True)
    with pytest.raises(ValueError, match=r"unexpected 1 \['policy_004_x'\]"):
        variables.restore_optimizer(opt, {**state, "policy_004_x": np.zeros(1)}, "policy", strict=True)
