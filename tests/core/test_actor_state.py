"""An actor's env state as stored data (core/actor_state.py): exact round trips, refusals of bad documents."""
import threading

import numpy as np
import pytest

from core.actor_state import (ActorStateError, ActorStateUnsupported, capture, dumps, loads, restore,
                              try_capture)
from core.actor import ActorSpec, ActorState
from core.rollout import rollout


def _payload(inputs, outputs):
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("fp32").quantize(mlp(inputs, [16], outputs, name="q", seed=0), version=2)


def _batch_arrays(result):
    b = result.batch
    out = {k: getattr(b, k) for k in ("observation", "action", "reward", "discount", "terminated", "truncated",
                                      "episode_id", "step", "policy_version")}
    out.update({f"extras/{k}": v for k, v in b.extras.items()})
    return out


def _assert_same(a, b):
    xa, xb = _batch_arrays(a), _batch_arrays(b)
    assert xa.keys() == xb.keys()
    for k in xa:
        assert xa[k].dtype == xb[k].dtype and np.array_equal(xa[k], xb[k]), k
    assert a.stats.episode_returns == b.stats.episode_returns
    assert a.stats.episode_lengths == b.stats.episode_lengths


CASES = [  # env id, selector, explore, policy inputs, outputs, frame stack
    ("CartPole-v1", "epsilon_greedy", {"epsilon": 0.3}, 4, 2, 1),
    ("Acrobot-v1", "epsilon_greedy", {"epsilon": 0.5}, 6, 3, 1),
    ("Pendulum-v1", "gaussian", {"sigma": 0.3}, 3, 1, 1),
    ("pomdp:CartPole-v1", "epsilon_greedy", {"epsilon": 0.3}, 2, 2, 1),
    ("CartPole-v1", "epsilon_greedy", {"epsilon": 0.3}, 8, 2, 2),      # frame stacker state
    ("pixels:Catch", "epsilon_greedy", {"epsilon": 0.3}, 84 * 84 * 2, 3, 2),   # uint8 frames, stacked
]


@pytest.mark.parametrize("env_id, selector, explore, inputs, outputs, stack", CASES,
                         ids=["cartpole", "acrobot", "pendulum", "pomdp", "cartpole-stack2", "catch-pixels-stack2"])
def test_a_restored_actor_steps_bit_identically(env_id, selector, explore, inputs, outputs, stack):
    payload = _payload(inputs, outputs)
    spec = ActorSpec("as-test", env_id, num_envs=3, seed=5, actor_id=1, selector=selector, frame_stack=stack,
                     max_episode_steps=40)
    live = ActorState(spec, 0)
    for k in range(3):                                     # episodes end and restart inside these tasks
        rollout(live, payload, k, 30, explore)
        live.next_task = k + 1
    doc = loads(dumps(capture(live)))                      # through its stored JSON text
    assert doc["task"] == 3 and doc["actor"] == 1 and doc["env_id"] == env_id
    copy = restore(spec, doc)
    assert copy.next_task == 3 and copy.envs is not live.envs
    for k in (3, 4):
        _assert_same(rollout(live, payload, k, 30, explore), rollout(copy, payload, k, 30, explore))
        live.next_task = copy.next_task = k + 1
    assert capture(copy) == capture(live)


def test_the_recurrent_carry_is_restored():
    from core.agents.r2d2.config import R2D2Config
    from core.agents.r2d2.learning import R2D2Learner
    from core.envs import env_spec
    from core.quantize import PolicyQuantizer
    cfg = R2D2Config(torso=[16], lstm_size=8, head=[16], sequence_length=8, burn_in=3, n_step=2, batch_size=4)
    learner = R2D2Learner(env_spec("pomdp:CartPole-v1"), cfg, seed=0)
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=1)
    spec = ActorSpec("as-r2d2", "pomdp:CartPole-v1", num_envs=2, seed=0, actor_id=0,
                     selector="recurrent_epsilon_greedy")
    live = ActorState(spec, 0)
    rollout(live, payload, 0, 25, {"epsilon": 0.2})
    live.next_task = 1
    assert np.abs(live.carry.h).max() > 1e-3               # a state that actually carries
    copy = restore(spec, loads(dumps(capture(live))))
    assert np.array_equal(copy.carry.h, live.carry.h) and copy.has_carry
    _assert_same(rollout(live, payload, 1, 25, {"epsilon": 0.2}), rollout(copy, payload, 1, 25, {"epsilon": 0.2}))


@pytest.fixture(scope="module")
def cartpole_doc():
    spec = ActorSpec("as-bad", "CartPole-v1", num_envs=2, seed=0, actor_id=0)
    return spec, capture(ActorState(spec, 4))


def _tamper(doc, path, value):
    import copy
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, message", [
    (("env_id",), "Pendulum-v1", r"^actor state env_id 'Pendulum-v1' does not match the run's 'CartPole-v1'$"),
    (("actor",), 3, r"^actor state actor 3 does not match the run's 0$"),
    (("format",), "pickle", r"^not an actor state document"),
    (("task",), -1, r"bad task -1"),
    (("state", "obs", "__nd__"), ["<f4", [2, 4], "AAAA"], r"^actor state obs: array of float32 \(2, 4\) does not "
                                                          r"match its 3 bytes$"),
    (("state", "obs", "__nd__"), ["|O", [1], ""], r"^actor state obs: array of object"),
    (("state", "carry"), {"__obj__": "os:system", "attrs": {}}, r"is not a known recurrent carry"),
    (("state", "envs", "attrs", "step"), 1, r"^actor state envs.step may not be restored$"),
    (("state", "rollout"), 1, r"^actor state field 'rollout' may not be restored$"),
])
def test_a_document_that_does_not_fit_is_refused_in_one_line(cartpole_doc, path, value, message):
    spec, doc = cartpole_doc
    with pytest.raises(ActorStateError, match=message):
        restore(spec, _tamper(doc, path, value))


def test_text_that_is_not_a_document_is_refused():
    with pytest.raises(ActorStateError, match=r"^actor state is not JSON"):
        loads("{not json")
    with pytest.raises(ActorStateError, match=r"^not an actor state document"):
        loads('{"format": "x"}')


def test_envs_holding_native_handles_are_unsupported_not_pickled():
    spec = ActorSpec("as-native", "CartPole-v1", num_envs=1, seed=0, actor_id=0)
    state = ActorState(spec, 0)
    state.envs.envs[0].unwrapped.emulator = threading.Lock()   # stands in for an ALE / MuJoCo handle
    with pytest.raises(ActorStateUnsupported, match=r"^envs.envs\[0\].env.env.env.emulator: _thread:lock is not data$"):
        capture(state)
    assert try_capture(state) is None


def test_dm_control_physics_is_unsupported():
    pytest.importorskip("dm_control")
    state = ActorState(ActorSpec("as-dmc", "dmc:cartpole-balance", num_envs=1, seed=0, actor_id=0), 0)
    with pytest.raises(ActorStateUnsupported, match=r"^envs.envs\[0\]._env: dm_control.rl.control:Environment is "
                                                     r"not data$"):
        capture(state)


def test_two_actors_built_alike_give_the_same_document():
    """Documents are repeatable (a re-run writes the same bytes): no unseeded RNG (spaces) is captured."""
    spec = ActorSpec("as-same", "CartPole-v1", num_envs=4, seed=3, actor_id=2)
    assert dumps(capture(ActorState(spec, 7))) == dumps(capture(ActorState(spec, 7)))
