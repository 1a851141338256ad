"""Block 0 before the learner (pipelines/run/policy_versions.py): a uniform stand-in acts exactly as version 1."""
import numpy as np
import pytest

from core.actor import ActorSpec
from core.networks import mlp
from core.quantize import PolicyPayload, PolicyQuantizer
from core.rollout import release_actors, run_rollout_task
from pipelines.run.flight import Flight
from pipelines.run.policy_versions import PolicyVersions, acts_uniformly


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


class _Driver(PolicyVersions):
    """The driver's state that _submit_uniform_first_block reads; _submit_blocks records the flight."""

    def __init__(self, overrides, resume=False):
        from core.agents.registry import get_builder
        from core.config import load_config
        from core.envs import env_spec
        from pipelines.executors.local import LocalExecutor
        from pipelines.run.flight import LoopState
        from pipelines.run.plan import TrainingPlan
        self.cfg = load_config(overrides=list(overrides))
        self.resume, self.spec, self.builder = resume, env_spec(self.cfg.env.id), get_builder(self.cfg.agent.algo)
        self.plan, self.executor = TrainingPlan.from_config(self.cfg), LocalExecutor()
        self.loop, self.asked_version, self.run_id = LoopState(next_task=[0] * 4), 0, "r"
        self.submitted = []

    def _submit_blocks(self, f):
        self.submitted.append(f.version_for(0))
        f.rollouts[0], f.next_submit = ["rollout futures"], 1
        return True


def test_the_default_run_submits_block_0_with_the_stand_in_for_version_1():
    driver = _Driver([])
    early = driver._submit_uniform_first_block()
    (payload, version), = driver.submitted
    assert (version, payload.version, payload.has_network, payload.output_dim) == (1, 1, False, 2)
    assert early.plan.num_blocks == 1 and len(driver.actor_specs) == 4
    later = Flight(**{**early.__dict__, "rollouts": {}, "next_submit": 0})    # the driver's own flight
    driver._adopt_first_block(later, early)
    assert later.rollouts == {0: ["rollout futures"]} and later.next_submit == 1
    driver._adopt_first_block(later, None)                   # nothing early: nothing changes
    assert later.next_submit == 1


@pytest.mark.parametrize("overrides, resume", [
    (["agent.epsilon.start=0.9"], False),       # block 0 reads the Q-values
    (["learner.resources={GPU: 1}", "executor=dask"], False),   # the learner is placed first
    (["inference=central"], False),             # SEED mode: actors stream to the server
    ([], True),                                 # a resumed run continues its checkpoint's versions
])
def test_no_stand_in_when_block_0_reads_the_policy_or_the_run_is_placed_or_resumed(overrides, resume):
    driver = _Driver(overrides, resume)
    assert driver._submit_uniform_first_block() is None and driver.submitted == []
