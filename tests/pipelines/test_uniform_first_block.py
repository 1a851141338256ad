"""Block 0 before the learner (pipelines/run/policy_versions.py): a uniform stand-in acts exactly as version 1."""
import numpy as np
import pytest

from core.actor import ActorSpec
from core.networks import mlp
from core.quantize import PolicyPayload, PolicyQuantizer
from core.rollout import release_actors, run_rollout_task
from pipelines.run.policy_versions import acts_uniformly


@pytest.mark.parametrize("selector, explore, uniform", [
    ("epsilon_greedy", {"epsilon": 1.0}, True),
    ("epsilon_greedy", {"epsilon": 1.5}, True),
    ("epsilon_greedy", {"epsilon": 0.999}, False),
    ("epsilon_greedy", {}, False),                           # greedy
    ("recurrent_epsilon_greedy", {"epsilon": 1.0}, False),   # its carry reads the network
    ("categorical", {}, False),
    ("tanh_gaussian", {"sigma": 1.0}, False),
])
def test_only_epsilon_greedy_at_epsilon_one_ignores_the_policy(selector, explore, uniform):
    assert acts_uniformly(selector, explore) is uniform


def _batch_arrays(result):
    b = result.batch
    return [b.observation, b.action, b.reward, b.discount, b.terminated, b.truncated, b.episode_id, b.step,
            b.policy_version]


def test_an_actor_that_starts_with_the_stand_in_acts_exactly_as_with_version_1():
    """Task 0 at epsilon 1 with the stand-in, then task 1 greedy with the real version 1: every stored
    array equals an actor that had version 1 from its start (and version 1 is used once it comes)."""
    real = PolicyQuantizer("int8-dynamic").quantize(mlp(4, (64, 64), 2, name="q", seed=5), version=1)
    stand_in = PolicyPayload.uniform(1, 4, 2)
    runs = {}
    for name, first in (("stand-in", stand_in), ("real", real)):
        spec = ActorSpec(run_id=f"uniform-{name}", env_id="CartPole-v1", num_envs=4, seed=5, actor_id=0)
        try:
            t0 = run_rollout_task(spec, first, 0, 40, {"epsilon": 1.0})
            t1 = run_rollout_task(spec, real, 1, 40, {"epsilon": 0.0}, after=t0)
        finally:
            release_actors(spec.run_id)
        runs[name] = _batch_arrays(t0) + _batch_arrays(t1)
    for a, b in zip(runs["stand-in"], runs["real"]):
        np.testing.assert_array_equal(a, b)
    assert set(np.unique(runs["stand-in"][8])) == {1}        # policy_version column: version 1 throughout
    assert runs["real"][10].any()     # greedy version 1 picks action 1 (the stand-in's zeros would pick 0)
