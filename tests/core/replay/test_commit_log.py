"""Commit log checkpoints: a reader starts from the latest one and gets exactly the state the entries fold to."""
import json

import pytest

from replay_fakes import random_batch
from core.replay import ReplayStore
from core.replay import commit_log
from core.replay.commit_log import CommitLog, LogState


def _full_fold(log: CommitLog, version: int) -> LogState:
    state = LogState()
    for v in range(1, version + 1):
        state.apply(log._read(v))
    return state


@pytest.fixture
def store_with_history(store_url, monkeypatch):
    """12 versions: adds, a retention removal, a quarantine, a replace; checkpoints every 5."""
    monkeypatch.setattr(commit_log, "CHECKPOINT_EVERY", 5)
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    for i in range(9):
        store.commit([store.write_shard(f"s{i}", [random_batch(i, T=4, E=2)]).id])    # versions 1..9
    store.log.append(lambda st: {"op": "remove", "shards": ["s0", "s1"], "reason": "retention"})   # 10
    store.log.append(lambda st: {"op": "quarantine", "shards": ["s4"], "reason": "bad chunk"})      # 11
    store.log.append(lambda st: {"op": "replace", "groups": [{"remove": ["s2", "s3"], "add": [
        dict(st.infos["s2"].to_json(), id="c0")]}], "reason": "compact"})                           # 12
    return store


def test_reader_starts_at_latest_checkpoint_with_the_folded_state(store_with_history, monkeypatch):
    store = store_with_history
    fs, path = store.log.fs, store.log.path
    assert json.loads(fs.cat_file(f"{path}/_last_checkpoint")) == {"version": 10}
    assert fs.exists(f"{path}/{commit_log.checkpoint_name(5)}")
    reads = []
    fresh = CommitLog(store.url)
    real_read = fresh._read
    monkeypatch.setattr(fresh, "_read", lambda v: reads.append(v) or real_read(v))
    state = fresh.state()
    assert fresh._base == 10 and reads == [10, 11, 12, 13]      # check entry 10 exists, then 11.. only
    full = _full_fold(store.log, 12)
    assert state.to_json() == full.to_json()
    assert list(state.live) == ["c0", "s5", "s6", "s7", "s8"] and "s4" in state.quarantined
    for v in (0, 3, 5, 7, 10, 11, 12):                          # time travel, before and after the base
        assert fresh.state(v).to_json() == _full_fold(store.log, v).to_json(), v
    assert fresh.entry(3)["shards"][0]["id"] == "s2" and fresh.entry(12)["op"] == "replace"
    assert ReplayStore.open(store.url).snapshot().num_rows == 40    # 5 live shards x 8 rows


def test_only_the_last_checkpoints_are_kept(store_url, monkeypatch):
    monkeypatch.setattr(commit_log, "CHECKPOINT_EVERY", 2)
    monkeypatch.setattr(commit_log, "KEEP_CHECKPOINTS", 2)
    store = ReplayStore.open_or_create(store_url, env_id="CartPole-v1")
    for i in range(9):
        store.commit([store.write_shard(f"s{i}", [random_batch(i, T=2, E=1)]).id])
    names = sorted(n.rsplit("/", 1)[-1] for n in store.log.fs.ls(store.log.path, detail=False))
    assert [n for n in names if n.endswith(".checkpoint.json")] == [
        commit_log.checkpoint_name(6), commit_log.checkpoint_name(8)]
    fresh = CommitLog(store.url)
    assert fresh.state(3).to_json() == _full_fold(store.log, 3).to_json()    # pruned: folds entries
    assert fresh.state().to_json() == _full_fold(store.log, 9).to_json() and fresh._base == 8


def test_unreadable_checkpoint_falls_back_to_the_entries(store_with_history):
    store = store_with_history
    fs, path = store.log.fs, store.log.path
    fs.pipe_file(f"{path}/{commit_log.checkpoint_name(10)}", b"{not json")
    fresh = CommitLog(store.url)
    assert fresh.state().to_json() == _full_fold(store.log, 12).to_json() and fresh._base == 0
    fs.pipe_file(f"{path}/_last_checkpoint", b"")                  # a torn hint: same
    assert CommitLog(store.url).state().version == 12
