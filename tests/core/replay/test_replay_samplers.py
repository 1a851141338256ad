"""Samplers on hand-built episodes with exact expected values."""
import numpy as np
import pytest

from replay_fakes import batch_from_rows, episode_rows
from core.replay import (NStepSampler, PrioritizedNStepSampler, ReplayCache, ReplayError, ReplayStore,
                         SequenceSampler, SumTree)

GAMMA = 0.5


def _shards():
    """Shard A: ep1 (terminated at step 3), ep2 steps 0-1. Shard B: ep2 steps 2-3 (truncated), ep3 steps 0-2."""
    a = batch_from_rows(episode_rows(1, [0, 1, 2, 3], [1, 2, 3, 0], "terminated"),
                        episode_rows(2, [0, 1], [10, 20]))
    b = batch_from_rows(episode_rows(2, [2, 3], [30, 0], "truncated"),
                        episode_rows(3, [0, 1, 2], [100, 200, 300]))
    return a, b


# (episode, step) -> (reward, discount, next_obs_step): n=3, gamma=0.5
EXPECTED = {
    (1, 0): (1 + 0.5 * 2 + 0.25 * 3, 0.0, 3),   # k=3, bootstraps at the terminated row -> 0
    (1, 1): (2 + 0.5 * 3, 0.0, 3),              # k=2
    (1, 2): (3.0, 0.0, 3),                      # k=1
    (2, 0): (10 + 0.5 * 20 + 0.25 * 30, 0.125, 3),  # spans shards; truncated -> bootstrap g^3
    (2, 1): (20 + 0.5 * 30, 0.25, 3),
    (2, 2): (30.0, 0.5, 3),
}


def _sampled_rows(sampler, draws=3000):
    batch = sampler.sample(draws, np.random.default_rng(0))
    out = {}
    for i in range(draws):
        ep, step = int(batch["observation"][i, 1]), int(batch["observation"][i, 0]) % 100
        nxt = int(batch["next_observation"][i, 0]) % 100
        out[(ep, step)] = (float(batch["reward"][i]), float(batch["discount"][i]), nxt)
    return out, batch


@pytest.mark.parametrize("order", ["ab", "ba"])
def test_nstep_values_with_termination_truncation_and_two_shards(tmp_path, order):
    store = ReplayStore.open_or_create(str(tmp_path / "r"), env_id="CartPole-v1")
    a, b = _shards()
    store.write_shard("a0", [a]), store.write_shard("b0", [b])
    cache = ReplayCache(store, max_transitions=100)
    sampler = NStepSampler(cache, n=3, gamma=GAMMA)
    store.commit([order[0] + "0"])
    cache.refresh()
    alone = {"a0": {(1, 0), (1, 1), (1, 2)}, "b0": {(2, 2)}}[order[0] + "0"]  # ep2 waits for its other half
    assert set(_sampled_rows(sampler)[0]) == alone
    store.commit([order[1] + "0"])
    assert cache.refresh() == 11 - len(_shards()[0 if order[0] == "a" else 1].reward)
    rows, batch = _sampled_rows(sampler)
    assert rows == EXPECTED  # ep3 (no successor of step 2 yet) and last rows are never sampled
    assert batch["reward"].dtype == np.float32 and batch["discount"].dtype == np.float32
    assert np.all(batch["weight"] == 1) and np.all(batch["policy_version"] == 7)
    assert batch["extras/logits"].shape == (3000, 2)
    assert sampler.num_sampleable == 6


def test_nstep_one_step_and_bootstrap_observation(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "r"))
    a, b = _shards()
    store.commit([store.write_shard("a0", [a]).id, store.write_shard("b0", [b]).id])
    cache = ReplayCache(store)
    cache.refresh()
    rows, _ = _sampled_rows(NStepSampler(cache, n=1, gamma=GAMMA))
    assert rows[(1, 2)] == (3.0, 0.0, 3) and rows[(2, 2)] == (30.0, 0.5, 3)
    assert rows[(3, 0)] == (100.0, 0.5, 1) and rows[(3, 1)] == (200.0, 0.5, 2)
    assert (3, 2) not in rows and len(rows) == 8


def test_sumtree_find_and_update():
    tree = SumTree(5)
    tree.rebuild(np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    assert tree.total == 10.0
    np.testing.assert_array_equal(tree.find(np.array([0.0, 0.99, 1.0, 2.99, 3.0, 6.0, 9.99])), [0, 0, 1, 1, 2, 3, 3])
    tree.update(np.array([0, 4]), np.array([0.0, 5.0]))
    assert tree.total == 14.0
    np.testing.assert_array_equal(tree.find(np.array([0.0, 8.9, 9.0, 13.9])), [1, 3, 4, 4])


def _single_episode_store(tmp_path, n_rows=5, end="truncated"):
    store = ReplayStore.open_or_create(str(tmp_path / "r"))
    store.commit([store.write_shard("s0", [batch_from_rows(
        episode_rows(1, list(range(n_rows)), list(range(1, n_rows + 1)), end))]).id])
    cache = ReplayCache(store)
    cache.refresh()
    return store, cache


def test_prioritized_proportions_weights_and_updates(tmp_path):
    store, cache = _single_episode_store(tmp_path)
    sampler = PrioritizedNStepSampler(cache, n=1, gamma=GAMMA, alpha=1.0, beta=1.0, eps=0.0)
    first = sampler.sample(4, np.random.default_rng(0))
    assert np.all(first["weight"] == 1.0)  # all new rows share the max priority
    index = np.sort(np.unique(sampler.sample(400, np.random.default_rng(1))["index"]))
    assert len(index) == 4  # the 4 non-last rows
    sampler.update_priorities(index, np.array([1.0, 2.0, 3.0, 4.0]))
    batch = sampler.sample(40_000, np.random.default_rng(2))
    freq = np.bincount(np.searchsorted(index, batch["index"]), minlength=4) / 40_000
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4], atol=0.002)  # stratified: tight
    np.testing.assert_allclose(batch["probability"], (np.searchsorted(index, batch["index"]) + 1) / 10)
    # w = (N P)^-beta / max w; the max is at P = 0.1, so w = 0.1 / P.
    np.testing.assert_allclose(batch["weight"], 0.1 / batch["probability"], rtol=1e-6)
    sampler.update_priorities(index[:1], np.array([0.0]))
    assert 0 not in np.searchsorted(index, sampler.sample(1000, np.random.default_rng(3))["index"])
    sampler.update_priorities(np.array([10_000]), np.array([100.0]))  # unknown row id: ignored
    assert sampler.max_priority == 4.0


def test_prioritized_new_rows_get_max_priority(tmp_path):
    store, cache = _single_episode_store(tmp_path)
    sampler = PrioritizedNStepSampler(cache, n=1, gamma=GAMMA, alpha=1.0, beta=0.0, eps=0.0)
    index = np.unique(sampler.sample(400, np.random.default_rng(1))["index"])
    sampler.update_priorities(index, np.array([1.0, 1.0, 1.0, 2.0]))
    store.commit([store.write_shard("s2", [batch_from_rows(
        episode_rows(2, [0, 1], [1, 0], "terminated"))]).id])
    cache.refresh()
    batch = sampler.sample(10_000, np.random.default_rng(2))
    new = batch["observation"][:, 1] == 2
    np.testing.assert_allclose(new.mean(), 2 / 7, atol=0.01)  # new row at max priority 2 of total 7


def test_sequence_sampler_masks_and_padding(tmp_path):
    store, cache = _single_episode_store(tmp_path, n_rows=5, end="terminated")
    sampler = SequenceSampler(cache, length=4, burn_in=1)
    batch = sampler.sample(600, np.random.default_rng(0))
    start = batch["observation"][:, 0, 0].astype(int) % 100
    assert set(start) == {0, 1, 2}  # step 3 leaves no transition after burn-in; step 4 is last
    expected_mask = {0: [1, 1, 1, 1], 1: [1, 1, 1, 1], 2: [1, 1, 1, 0]}
    expected_steps = {0: [0, 1, 2, 3], 1: [1, 2, 3, 4], 2: [2, 3, 4, 4]}
    for i in range(600):
        s = int(start[i])
        np.testing.assert_array_equal(batch["mask"][i], expected_mask[s])
        np.testing.assert_array_equal(batch["step"][i], expected_steps[s])
    assert batch["terminated"].shape == (600, 4) and batch["index"].shape == (600, 4)
    with pytest.raises(ReplayError, match="no sequence of length 10"):
        SequenceSampler(cache, length=10, burn_in=8).sample(1, np.random.default_rng(0))


def test_sequence_spans_shards_and_waits_for_continuation(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "r"))
    a, b = _shards()
    store.commit([store.write_shard("a0", [a]).id])
    cache = ReplayCache(store)
    cache.refresh()
    sampler = SequenceSampler(cache, length=3, burn_in=0)
    assert sampler.num_sampleable == 3  # ep1 steps 0,1,2; ep2 must wait for shard b
    store.commit([store.write_shard("b0", [b]).id])
    cache.refresh()
    batch = sampler.sample(500, np.random.default_rng(0))
    seqs = {tuple(batch["observation"][i, :, 0].astype(int)) for i in range(500)}
    assert (200, 201, 202) in seqs and (201, 202, 203) in seqs and (202, 203, 203) in seqs


def test_empty_cache_raises_clear_error(tmp_path):
    cache = ReplayCache(ReplayStore.open_or_create(str(tmp_path / "r")))
    cache.refresh()
    with pytest.raises(ReplayError, match="no sampleable transitions"):
        NStepSampler(cache).sample(4, np.random.default_rng(0))


# -- prioritized state through a checkpoint (--resume) ----------------------------------------------------

def _prioritized(kind, cache):
    if kind == "nstep":
        return PrioritizedNStepSampler(cache, n=3, gamma=0.9, alpha=0.6, beta=0.4)
    from core.agents.r2d2.sampler import PrioritizedSequenceSampler
    return PrioritizedSequenceSampler(cache, length=8, burn_in=2, alpha=0.9, beta=0.6)


def _train_steps(sampler, rng, steps=6, batch=16):
    """What the learner does to a prioritized sampler: sample, then set the batch's priorities."""
    batches = []
    for _ in range(steps):
        b = sampler.sample(batch, rng)
        sampler.update_priorities(b["index"], rng.random(batch) * 3.0)
        batches.append(b)
    return batches


@pytest.mark.parametrize("kind", ["nstep", "sequence"])
def test_prioritized_state_round_trips_through_a_checkpoint_exactly(tmp_path, kind):
    """Priorities saved (zarr, core.checkpoint) and restored into a fresh sampler over the same cache:
    the same RNG then draws the same batches, weights and probabilities, bit for bit. The ring overflows
    (new rows overwrite old slots) and the last refresh before the save is not synced yet."""
    from replay_fakes import random_batch
    from core.checkpoint import Checkpointer
    store = ReplayStore.open_or_create(str(tmp_path / "r"), env_id="CartPole-v1")
    caches = [ReplayCache(store, max_transitions=600) for _ in range(2)]     # refreshed in lockstep

    def commit(seed):
        store.commit([store.write_shard(f"s{seed}", [random_batch(seed)]).id])   # 256 rows each
        for c in caches:
            c.refresh()
    original = _prioritized(kind, caches[0])
    for seed in range(3):
        commit(seed)
        _train_steps(original, np.random.default_rng(seed))
    commit(3)                                  # evicts rows of shard 0; the sampler has not seen it
    with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
        ckpt.save(1, {"sampler": original.priority_state()})
        state, _ = ckpt.restore(1)
    saved = state["sampler"]
    assert saved["row_id"].dtype == np.int64 and saved["priority"].dtype == np.float64
    assert len(saved["row_id"]) == 600 and saved["max_priority"] == original.max_priority > 1.0
    restored, plain = _prioritized(kind, caches[1]), _prioritized(kind, caches[1])
    restored.restore_priorities(saved)
    for seed in (3, 4):
        if seed == 4:
            commit(4)
        ours = _train_steps(original, np.random.default_rng(10 + seed))
        theirs = _train_steps(restored, np.random.default_rng(10 + seed))
        for a, b in zip(ours, theirs):
            assert a.keys() == b.keys()
            for name in a:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        np.testing.assert_array_equal(original.tree.tree, restored.tree.tree)
    assert original.max_priority == restored.max_priority
    # Without the restore, the same cache and RNG draw other rows: the state is what makes them equal.
    fresh = _train_steps(plain, np.random.default_rng(14))
    assert any(not np.array_equal(a["index"], b["index"]) for a, b in zip(ours, fresh))


def test_prioritized_restore_keeps_only_rows_still_in_their_slot(tmp_path):
    """Restored onto a cache whose slot holds another row than saved, that slot gets the max priority, as
    a new row does; the other rows keep theirs; a changed alpha re-exponentiates (p^1 -> p^0.5)."""
    store, cache = _single_episode_store(tmp_path)            # rows 0..4, sampleable 0..3
    sampler = PrioritizedNStepSampler(cache, n=1, gamma=GAMMA, alpha=1.0, beta=0.0, eps=0.0)
    index = np.sort(np.unique(sampler.sample(400, np.random.default_rng(1))["index"]))
    sampler.update_priorities(index, np.array([1.0, 2.0, 3.0, 4.0]))
    state = sampler.priority_state()
    np.testing.assert_array_equal(state["row_id"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(state["priority"], [1.0, 2.0, 3.0, 4.0, 1.0])   # row 4: new, max at sync
    state["row_id"][1] = 7                      # as if slot 1 held another row
    again = PrioritizedNStepSampler(cache, n=1, gamma=GAMMA, alpha=0.5, beta=0.0, eps=0.0)
    again.restore_priorities(state)
    again.sample(1, np.random.default_rng(0))
    leaves = again.tree.leaves()
    np.testing.assert_allclose(leaves[:5], [1.0, 4.0 ** 0.5, 3.0 ** 0.5, 4.0 ** 0.5, 0.0], rtol=1e-15)
    assert not leaves[5:].any() and again.max_priority == 4.0     # slot 4: the episode's last row


def test_a_prioritized_sampler_that_never_sampled_saves_empty_arrays_and_restores_them(tmp_path):
    """A checkpoint before the first sample (an empty cache): empty zarr arrays, max priority 1, no tree."""
    from core.checkpoint import Checkpointer
    cache = ReplayCache(ReplayStore.open_or_create(str(tmp_path / "r")))
    with Checkpointer(str(tmp_path / "ckpt")) as ckpt:
        ckpt.save(1, {"sampler": PrioritizedNStepSampler(cache, alpha=0.6).priority_state()})
        saved = ckpt.restore(1)[0]["sampler"]
    assert saved["row_id"].shape == saved["priority"].shape == (0,) and saved["max_priority"] == 1.0
    fresh = PrioritizedNStepSampler(cache, alpha=0.6)
    fresh.restore_priorities(saved)
    assert fresh.tree is None and fresh.max_priority == 1.0
