"""Damage in the commit log and shards is an error naming it, never a shorter or zero-filled store.

Covers: entry validation (table-driven), gaps found at open and later, the log
checkpoint path, the strict shard-id grammar, ``repair --truncate-after``,
and shards storing every chunk (so a missing one is detectable).
"""
import json
import os

import pytest

from replay_fakes import random_batch
from core.replay import ReplayStore, ShardReader
from core.replay import commit_log
from core.replay.commit_log import CommitLog, entry_name
from core.replay.repair import apply_truncate, describe, plan_truncate
from core.replay.schema import (LogDamagedError, MissingChunkError, ReplayError, is_shard_id,
                                validate_shard_id)

INFO = {"id": "s00000009", "rows": 8, "nbytes": 100, "token": "t"}


def _store(url, n=4):
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    for i in range(n):
        store.commit([store.write_shard(f"s{i:08d}", [random_batch(i, T=4, E=2)]).id])
    return store


def _put(store, version, entry):
    data = entry if isinstance(entry, (str, bytes)) else json.dumps(entry)
    store.log.fs.pipe_file(f"{store.log.path}/{entry_name(version)}", data.encode() if isinstance(data, str) else data)


MALFORMED = [  # entry written as version 5 -> the words after "damaged at version 5: "
    ("not json", "the entry is not valid JSON"),
    ([1, 2], "the entry is a JSON list, not an object"),
    ({}, "the entry is an empty object {}"),
    ({"op": "add", "shards": []}, "the entry has no 'version'"),
    ({"version": "5", "op": "add", "shards": []}, "'version' is '5'; valid: the integer 5"),
    ({"version": 6, "op": "add", "shards": []}, "the entry in file 5 says version 6"),
    ({"version": 5, "op": "delete", "shards": []}, "'op' is 'delete'; valid: add, remove, quarantine, replace"),
    ({"version": 5, "op": "add"}, "'shards' is missing, not a list"),
    ({"version": 5, "op": "add", "shards": [dict(INFO, rows="many")]},
     "shards[0] (s00000009) has rows='many'; valid: an integer >= 0"),
    ({"version": 5, "op": "add", "shards": [dict(INFO, nbytes=-1)]},
     "shards[0] (s00000009) has nbytes=-1; valid: an integer >= 0"),
    ({"version": 5, "op": "add", "shards": [dict(INFO, id="../../victim")]},
     "shards[0] has invalid shard id '../../victim'"),
    ({"version": 5, "op": "remove", "shards": ["/etc"]}, "shards[0] has invalid shard id '/etc'"),
    ({"version": 5, "op": "quarantine", "shards": [7]}, "shards[0] has invalid shard id 7"),
    ({"version": 5, "op": "replace", "groups": [{"remove": ["s00000000"], "add": [{"id": "c1"}]}]},
     "groups[0].add[0] (c1) has rows=None; valid: an integer >= 0"),
    ({"version": 5, "op": "replace", "groups": [{"remove": [".."], "add": []}]},
     "groups[0].remove[0] has invalid shard id '..'"),
    ({"version": 5, "op": "add", "time": "noon", "shards": []}, "'time' is 'noon'; valid: a number"),
]


@pytest.mark.slow
@pytest.mark.parametrize("entry,words", MALFORMED, ids=[w[:40] for _, w in MALFORMED])
def test_malformed_entry_is_a_one_line_damaged_log_error(store_url, entry, words):
    store = _store(store_url)
    _put(store, 5, entry)
    for read in (lambda: ReplayStore.open(store_url), lambda: store.log.state(),
                 lambda: ReplayStore.open(store_url).gc(0)):
        with pytest.raises(LogDamagedError) as e:
            read()
        msg = str(e.value)
        assert msg.startswith(f"commit log is damaged at version 5: {words}") and "\n" not in msg, msg
        assert msg.endswith(f"repair: python -m pipelines.process repair {store.url} --truncate-after 4"
                            " (shows what it removes; add --yes to apply)")


def test_gap_is_found_at_open_and_after_open_and_never_filled(store_url):
    store = _store(store_url)
    store.log.fs.rm_file(f"{store.log.path}/{entry_name(2)}")
    with pytest.raises(LogDamagedError, match="damaged at version 2: entry 2 is missing while later entries"
                                              r" exist \(up to 4\)"):
        ReplayStore.open(store_url).snapshot()
    assert store.log.state(1).version == 1            # a reader that opened before holds the entries
    store.log.fs.pipe_file(f"{store.log.path}/{entry_name(2)}", json.dumps(store.log.entry(2)).encode())
    reader = ReplayStore.open(store_url)
    assert reader.latest_version() == 4
    for v in (5, 6):                                   # two more commits, then entry 5 is lost
        _put(store, v, {"version": v, "op": "add", "shards": [dict(INFO, id=f"s{v:08d}")]})
    store.log.fs.rm_file(f"{store.log.path}/{entry_name(5)}")
    with pytest.raises(LogDamagedError, match="damaged at version 5: entry 5 is missing while entry 6 exists"):
        reader.latest_version()
    with pytest.raises(LogDamagedError, match="damaged at version 5"):
        reader.commit([reader.write_shard("s00000007", [random_batch(7, T=4, E=2)]).id])
    assert not store.log.fs.exists(f"{store.log.path}/{entry_name(5)}")   # the gap was not filled


def test_append_refuses_to_write_a_malformed_entry(store_url):
    store = _store(store_url, n=1)
    with pytest.raises(ReplayError, match="refusing to commit a malformed entry.*invalid shard id '../x'"):
        store.log.append(lambda st: {"op": "remove", "shards": ["../x"]})
    assert CommitLog(store_url).listing() == ([1], [])


def test_log_checkpoint_path_validates_too(store_url, monkeypatch):
    monkeypatch.setattr(commit_log, "CHECKPOINT_EVERY", 3)
    store = _store(store_url, n=5)                       # checkpoint at 3
    fs, path = store.log.fs, store.log.path
    ckpt = json.loads(fs.cat_file(f"{path}/{commit_log.checkpoint_name(3)}"))
    fs.pipe_file(f"{path}/{commit_log.checkpoint_name(3)}", json.dumps(dict(ckpt, live=["../../x"])).encode())
    with pytest.warns(UserWarning, match="ignoring log checkpoint 3 .*invalid shard id '../../x'"):
        state = CommitLog(store_url).state()           # falls back to the entries: the right state
    assert list(state.live) == [f"s{i:08d}" for i in range(5)]
    _put(store, 5, {})                                  # damage after the checkpoint
    with pytest.raises(LogDamagedError, match="damaged at version 5: the entry is an empty object"):
        CommitLog(store_url).state()


def test_log_checkpoint_newer_than_every_entry_means_lost_entries(store_url, monkeypatch):
    monkeypatch.setattr(commit_log, "CHECKPOINT_EVERY", 3)
    store = _store(store_url, n=4)
    for v in (3, 4):
        store.log.fs.rm_file(f"{store.log.path}/{entry_name(v)}")
    with pytest.raises(LogDamagedError, match=r"damaged at version 3: entries 3..3 are missing while log"
                                              " checkpoint 3 exists"):
        ReplayStore.open(store_url).snapshot()


@pytest.mark.parametrize("sid", ["s00000001", "r000003-g0001", "c00000012-g0000", "n00000012-g00003",
                                 "r000003-s0001", "p0-s000", "a0"])
def test_every_writer_id_scheme_is_a_valid_id(sid):
    assert is_shard_id(sid) and validate_shard_id(sid) == sid


@pytest.mark.parametrize("sid", ["../../victim", "..", ".", "", "/abs", "a/b", "backup", "notes.txt",
                                 "S00000001", "s1 ", "s1\n", "s-1", "s" + "1" * 64, None, 3])
def test_anything_else_is_not_a_shard_id(sid):
    assert not is_shard_id(sid)
    with pytest.raises(ReplayError, match="invalid shard id"):
        validate_shard_id(sid)


# -- repair ----------------------------------------------------------------------------------
def _files(store):
    fs, path = store.log.fs, store.log.path
    return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))


def test_repair_plans_without_writing_then_truncates(store_url, monkeypatch):
    monkeypatch.setattr(commit_log, "CHECKPOINT_EVERY", 2)
    store = _store(store_url, n=5)                       # checkpoints 2 and 4, hint -> 4
    store.log.fs.rm_file(f"{store.log.path}/{entry_name(3)}")
    before = _files(store)
    plan = plan_truncate(store_url, 2)
    assert (plan.entries, plan.checkpoints, plan.hint, plan.new_hint) == ([5, 4], [4], 4, 2)
    assert plan.uncommitted == ["s00000002", "s00000003", "s00000004"]
    assert describe(plan) == [
        f"store {store.url}: keep versions 1..2 (2 live shards, 16 rows); newest entry present: 5",
        "remove 2 log entries: versions 4..5", "remove log checkpoints: versions 4", "_last_checkpoint: 4 -> 2",
        "shard data not committed at version 2 (kept; gc deletes it after its grace period):"
        " s00000002, s00000003, s00000004"]
    assert _files(store) == before                     # planning writes nothing
    apply_truncate(plan)
    assert _files(store) == sorted([entry_name(1), entry_name(2), commit_log.checkpoint_name(2), "_last_checkpoint"])
    assert json.loads(store.log.fs.cat_file(f"{store.log.path}/_last_checkpoint")) == {"version": 2}
    fresh = ReplayStore.open(store_url)
    assert fresh.latest_version() == 2 and [s.id for s in fresh.snapshot().shards] == ["s00000000", "s00000001"]
    assert fresh.commit([fresh.write_shard("s00000005", [random_batch(5, T=4, E=2)]).id]) == 3
    assert plan_truncate(store_url, 3).changes is False


def test_repair_refuses_unsafe_truncations(store_url):
    store = _store(store_url)
    _put(store, 3, {})
    with pytest.raises(ReplayError, match=r"cannot truncate after version 3: the log is already damaged at"
                                          r" version 3 \(the entry is an empty object \{\}\); valid:"
                                          " --truncate-after 2 or lower"):
        plan_truncate(store_url, 3)
    with pytest.raises(ReplayError, match="past the newest entry .* valid: 0..4"):
        plan_truncate(store_url, 9)
    with pytest.raises(ReplayError, match="valid: a version >= 0"):
        plan_truncate(store_url, -1)
    plan = plan_truncate(store_url, 2)
    _put(store, 5, {"version": 5, "op": "add", "shards": []})     # a writer appended meanwhile
    with pytest.raises(ReplayError, match="changed since the repair was planned"):
        apply_truncate(plan)
    assert CommitLog(store_url).listing()[0] == [1, 2, 3, 4, 5]


def test_repair_cli_dry_run_then_yes(tmp_path, capsys):
    from pipelines import process
    url = str(tmp_path / "replay")
    store = _store(url)
    os.remove(os.path.join(url, "log", entry_name(2)))
    assert process.main(["stats", url, "--executor", "local"]) == 2
    assert "damaged at version 2" in capsys.readouterr().err
    assert process.main(["repair", url, "--truncate-after", "1"]) == 0
    out = capsys.readouterr().out
    assert "remove 2 log entries: versions 3..4" in out and "dry run: nothing was changed" in out
    assert sorted(os.listdir(os.path.join(url, "log"))) == [entry_name(1), entry_name(3), entry_name(4)]
    assert process.main(["repair", url, "--truncate-after", "1", "--yes"]) == 0
    assert f"the log of {store.url} now ends at version 1" in capsys.readouterr().out
    assert ReplayStore.open(url).snapshot().num_rows == 8
    assert process.main(["repair", url, "--truncate-after", "5"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --truncate-after 5 is past the newest entry of {store.url} (1); valid: 0..1"]


# -- every chunk stored ----------------------------------------------------------------------
def test_zero_chunks_are_stored_so_a_missing_one_is_detected(store_url):
    store = _store(store_url, n=1)                      # random_batch(0): policy_version is all zeros
    fs, root = store.writer.fs, f"{store.writer.path}/s00000000"
    assert fs.exists(f"{root}/policy_version/c/0") and fs.exists(f"{root}/episodes/first_step/c/0")
    reader = ShardReader(store.shards_url, "s00000000")
    assert reader.attrs["every_chunk_stored"] is True and not reader.read("policy_version").any()
    fs.rm_file(f"{root}/episodes/first_step/c/0")
    with pytest.raises(MissingChunkError, match="array 'episodes/first_step', chunk 'c/0'"):
        ShardReader(store.shards_url, "s00000000").verify()
    with pytest.raises(MissingChunkError, match="array 'episodes/first_step', chunk 'c/0'"):
        ShardReader(store.shards_url, "s00000000").episodes()


def test_shards_from_before_every_chunk_was_stored_still_read(store_url):
    """Older shards did not store fill-value chunks: they cannot be checked, and must not be refused."""
    store = _store(store_url, n=1)
    fs, root = store.writer.fs, f"{store.writer.path}/s00000000"
    meta = json.loads(fs.cat_file(f"{root}/zarr.json"))
    del meta["attributes"]["databloom"]["every_chunk_stored"]
    fs.pipe_file(f"{root}/zarr.json", json.dumps(meta).encode())
    fs.rm_file(f"{root}/policy_version/c/0")         # what an old writer left out
    reader = ShardReader(store.shards_url, "s00000000").verify()
    assert not reader.read("policy_version").any()
