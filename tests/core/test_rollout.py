"""The actor loop writes RLDS rows exactly as core.trajectory documents them."""
import numpy as np
import pytest

from core.actor import ActorSpec
from core.exploration import epsilon_greedy
from core.rollout import release_actors, run_rollout_task


@pytest.fixture(scope="module")
def payload():
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("fp32").quantize(mlp(4, [16], 2, name="q", seed=0), version=3)


def _rows(batch):
    return batch.flat_rows()


def test_rollout_rows_follow_the_rlds_contract(payload):
    spec = ActorSpec("test-rlds", "CartPole-v1", num_envs=4, seed=0, actor_id=2)
    res = run_rollout_task(spec, payload, task_index=0, num_steps=200, explore={"epsilon": 1.0})
    b = res.batch
    assert b.reward.shape == (200, 4) and b.observation.shape == (200, 4, 4)
    assert (b.policy_version == 3).all()
    last = b.terminated | b.truncated
    # Last rows carry padding actions and zero reward; the next row starts step 0 of a new episode.
    assert (b.action[last] == 0).all() and (b.reward[last] == 0).all()
    t, e = np.nonzero(last[:-1])
    assert (b.step[t + 1, e] == 0).all()
    assert (b.episode_id[t + 1, e] != b.episode_id[t, e]).all()
    # Within an episode, steps count up by one; discount is 0 exactly on terminated rows.
    same = b.episode_id[1:] == b.episode_id[:-1]
    assert (b.step[1:][same] == b.step[:-1][same] + 1).all()
    np.testing.assert_array_equal(b.discount == 0.0, b.terminated)
    # CartPole gives +1 per transition: a completed episode's return equals its length.
    assert res.stats.episode_returns == [float(l) for l in res.stats.episode_lengths]
    # Episode ids are unique per stream: stream id (actor 2, 4 envs) in the high bits.
    assert set(np.unique(b.episode_id >> 32)) == {8, 9, 10, 11}
    release_actors("test-rlds")


def test_actor_state_continues_episodes_across_tasks(payload):
    spec = ActorSpec("test-cont", "CartPole-v1", num_envs=2, seed=1, actor_id=0)
    a = run_rollout_task(spec, payload, 0, 5, explore={"epsilon": 0.0}).batch
    b = run_rollout_task(spec, payload, 1, 5, explore={"epsilon": 0.0}).batch
    # The first row of task 1 continues the episode of task 0's last row (unless it ended there).
    cont = ~(a.terminated[-1] | a.truncated[-1])
    assert (b.episode_id[0][cont] == a.episode_id[-1][cont]).all()
    assert (b.step[0][cont] == a.step[-1][cont] + 1).all()
    release_actors("test-cont")


def test_rebuilt_actor_is_deterministic_and_uses_fresh_episode_ids(payload):
    spec = ActorSpec("test-det", "CartPole-v1", num_envs=3, seed=5, actor_id=1)
    first = run_rollout_task(spec, payload, 7, 20, explore={"epsilon": 0.5}).batch
    release_actors("test-det")       # the worker died: the retry rebuilds the actor
    retry = run_rollout_task(spec, payload, 7, 20, explore={"epsilon": 0.5}).batch
    for name, value in first.fields().items():
        np.testing.assert_array_equal(value, retry.fields()[name], err_msg=name)
    # Episodes begun in task 7 carry counter 7 << 10 in their low bits.
    assert ((first.episode_id[0] & 0xFFFFFFFF) >> 10 == 7).all()
    release_actors("test-det")


def test_epsilon_greedy():
    q = np.array([[0.0, 1.0], [2.0, 1.0], [0.0, 5.0]])
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(epsilon_greedy(q, {"epsilon": 0.0}, rng)[0], [1, 0, 1])
    acts, _ = epsilon_greedy(np.tile([[0.0, 1.0]], (10_000, 1)), {"epsilon": 0.5}, np.random.default_rng(1))
    assert abs((acts == 0).mean() - 0.25) < 0.02   # half explore, half of those pick action 0


def test_an_actor_moved_to_another_worker_continues_from_its_state_as_data(payload):
    """``after=`` (the previous result) carries the actor's state: a worker without it continues exactly."""
    import pickle
    spec = ActorSpec("test-move", "CartPole-v1", num_envs=3, seed=5, actor_id=1)
    first = run_rollout_task(spec, payload, 0, 40, explore={"epsilon": 0.5})
    sent = pickle.loads(pickle.dumps(first))     # the result as Dask sends it to another worker
    stayed = run_rollout_task(spec, payload, 1, 40, explore={"epsilon": 0.5}, after=first).batch
    release_actors("test-move")
    run_rollout_task(spec, payload, 0, 40, explore={"epsilon": 0.5})
    release_actors("test-move")      # the next task runs where the actor never was
    moved = run_rollout_task(spec, payload, 1, 40, explore={"epsilon": 0.5}, after=sent).batch
    for name, value in stayed.fields().items():
        np.testing.assert_array_equal(value, moved.fields()[name], err_msg=name)
    release_actors("test-move")
    late = pickle.loads(pickle.dumps(first))     # sent after the actor moved on: no state, so rebuilt
    rebuilt = run_rollout_task(spec, payload, 1, 40, explore={"epsilon": 0.5}, after=late).batch
    assert (rebuilt.episode_id[0] >> 53 == 1).all() and (stayed.episode_id >> 53 == 0).all()   # bit 21 of stream
    release_actors("test-move")


def test_a_group_of_actors_runs_exactly_their_tasks_one_by_one(payload):
    """run_rollout_group: several actors' tasks of a block as one task, on threads, continuing after a
    previous group's results; every result equals the same actor's tasks run alone, in tasks' order."""
    from core.rollout import run_rollout_group
    specs = [ActorSpec(f"group-{mode}", "CartPole-v1", num_envs=2, seed=5, actor_id=a)
             for mode in ("alone", "group") for a in range(3)]
    explore = {"epsilon": 0.3}
    alone = {}
    for spec in specs[:3]:
        for k in range(4):
            alone[spec.actor_id, k] = run_rollout_task(spec, payload, k, 9, explore, capture_state=k % 2 == 1)
    release_actors("group-alone")
    first = run_rollout_group(payload, [(s, k, 9, explore, k == 1) for s in specs[3:] for k in (0, 1)],
                              threads=3)
    release_actors("group-group")    # the next group continues from the results it is handed
    second = run_rollout_group(payload, [(s, k, 9, explore, k == 3) for s in specs[3:] for k in (2, 3)],
                               after={a: first for a in range(3)}, threads=2)
    for results, ks in ((first, (0, 1)), (second, (2, 3))):
        assert [(r.stats.actor_id, r.stats.task_index) for r in results] == [(a, k) for a in range(3) for k in ks]
        for r in results:
            want = alone[r.stats.actor_id, r.stats.task_index]
            np.testing.assert_array_equal(r.batch.observation, want.batch.observation)
            np.testing.assert_array_equal(r.batch.episode_id, want.batch.episode_id)
            assert (r.actor_state is None) == (want.actor_state is None)
    release_actors("group-group")
