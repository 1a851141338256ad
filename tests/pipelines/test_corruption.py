"""Corruption suite (issue 13, items 1-3): damaged run dirs fail in one line, or recover safely.

For each damage (a deleted replay chunk, a deleted checkpoint chunk, a gap in
the commit log, a ``{}`` entry, a traversal shard id, stray files and
directories under ``shards/``) the CLIs ``process stats``, ``process
compact``, ``evaluate`` and ``train --resume`` either exit 2 with one
``error:`` line naming the damage, or recover safely, and nothing outside
the store changes (for an error: nothing at all changes).

One tiny training run (local executor, 1,536 env steps, about 10 s) is made
once per module and copied per case. Most CLI runs call ``main()`` in
process (fast); ``test_real_subprocesses_*`` check exit status and stderr of
real processes.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from core.config import load_config

#: Three 512-row blocks (2 actors x 8 envs x 32 steps): log entries 1-3, one shard each.
TINY = ["executor=local", "total_env_steps=1536", "actors.num_actors=2", "replay.min_size=256",
        "eval.every_env_steps=1024", "checkpoint.every_steps=50", "actors.broadcast_period=50",
        "replay.shard_max_rows=512"]
ENTRY2 = "replay/log/00000000000000000002.json"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from pipelines.train import train
    run_dir = str(tmp_path_factory.mktemp("corruption") / "run")
    train(load_config(overrides=TINY), run_dir, progress=False)
    return run_dir


@pytest.fixture
def run(tiny_run, tmp_path):
    """A private copy of the tiny run: ``tmp_path/run`` (``tmp_path/out`` for outputs)."""
    (tmp_path / "out").mkdir()
    return shutil.copytree(tiny_run, str(tmp_path / "run"))


def tree(root):
    """{relative path: sha1} of every file under ``root``, plus every directory (value None)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), root) + "/"] = None
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                out[os.path.relpath(os.path.join(d, name), root)] = hashlib.sha1(f.read()).hexdigest()
    return out


def outside_store(snapshot):
    return {k: v for k, v in snapshot.items() if not k.startswith("replay/")}


def latest_step(run):
    from core.checkpoint import Checkpointer
    return Checkpointer(os.path.join(run, "checkpoints")).latest_step()


# -- the damages ---------------------------------------------------------------------------
def delete_replay_chunk(run):
    os.remove(os.path.join(run, "replay/shards/s00000001/observation/c/0/0"))
    return "missing chunk in replay shard 's00000001', array 'observation', chunk 'c/0/0'"


def delete_checkpoint_chunk(run):
    step = latest_step(run)
    os.remove(os.path.join(run, f"checkpoints/step_{step:08d}/learner/params/dense_0.kernel/c/0/0"))
    return (f"missing chunk in checkpoint step {step}, variable 'learner/params/dense_0.kernel',"
            " chunk 'c/0/0'")


def _flip_byte(path):
    """Invert one byte in the middle of ``path`` (a chunk: zstd data, before its crc32c trailer)."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)


def flip_replay_chunk(run):
    _flip_byte(os.path.join(run, "replay/shards/s00000001/observation/c/0/0"))
    return "checksum error in replay shard 's00000001', array 'observation', chunk 'c/0/0'"


def flip_checkpoint_chunk(run):
    step = latest_step(run)
    _flip_byte(os.path.join(run, f"checkpoints/step_{step:08d}/learner/params/dense_0.kernel/c/0/0"))
    return f"checksum/decode failure in step {step}, variable 'learner/params/dense_0.kernel', chunk 'c/0/0'"


def log_gap(run):
    os.remove(os.path.join(run, ENTRY2))
    return "commit log is damaged at version 2: entry 2 is missing while later entries exist (up to 3)"


def empty_entry(run):
    with open(os.path.join(run, ENTRY2), "w") as f:
        f.write("{}")
    return "commit log is damaged at version 2: the entry is an empty object {}"


def traversal_id(run):
    """An add, then a remove, of ``../../victim``; ``run/victim`` is what gc would have deleted."""
    os.makedirs(os.path.join(run, "victim"))
    with open(os.path.join(run, "victim", "precious.txt"), "w") as f:
        f.write("not the store's")
    log = os.path.join(run, "replay/log")
    info = dict(json.load(open(os.path.join(log, "00000000000000000003.json")))["shards"][0], id="../../victim")
    for v, entry in ((4, {"op": "add", "shards": [info]}), (5, {"op": "remove", "shards": ["../../victim"]})):
        with open(os.path.join(log, f"{v:020d}.json"), "w") as f:
            json.dump({"version": v, "time": 0.0, **entry}, f)
    return "commit log is damaged at version 4: shards[0] has invalid shard id '../../victim'"


def stray_entries(run):
    shards = os.path.join(run, "replay/shards")
    os.makedirs(os.path.join(shards, "backup"))
    for name in ("notes.txt", "backup/data.bin", "s00000099"):  # the last: a *file* named like a shard
        with open(os.path.join(shards, name), "w") as f:
            f.write("user data")
    old = 1_000_000_000  # ancient: gc's grace period never protects them
    for name in ("notes.txt", "backup/data.bin", "backup", "s00000099"):
        os.utime(os.path.join(shards, name), (old, old))
    return None


DAMAGES = {"replay_chunk": delete_replay_chunk, "checkpoint_chunk": delete_checkpoint_chunk, "log_gap": log_gap,
           "empty_entry": empty_entry, "traversal_id": traversal_id, "stray": stray_entries}
def delete_store(run):
    """The whole replay store is gone (a wrong mount, an rm): resume must not start an empty one."""
    shutil.rmtree(os.path.join(run, "replay"))
    return f"{os.path.join(run, 'replay')} is not a DataBloom replay store"


#: Damages only ``--resume`` is tested on here (readers of checksum errors have their own tests).
RESUME_DAMAGES = {**DAMAGES, "checkpoint_flip": flip_checkpoint_chunk, "replay_flip": flip_replay_chunk,
                  "lost_store": delete_store}
#: Which command each damage stops (exit 2); the others must succeed (the damage is not theirs).
STOPS = {"replay_chunk": {"stats", "compact"}, "checkpoint_chunk": {"evaluate"},
         "log_gap": {"stats", "compact"}, "empty_entry": {"stats", "compact"},
         "traversal_id": {"stats", "compact"}, "stray": set()}


def run_cli(command, run, tmp_path, capsys):
    if command == "evaluate":
        from pipelines import evaluate
        rc = evaluate.main([run, "--checkpoint", "latest", "--episodes", "1"])
    else:
        from pipelines import process
        extra = ["--plot", str(tmp_path / "out" / "r.png")] if command == "stats" else []
        rc = process.main([command, os.path.join(run, "replay"), "--executor", "local", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["stats", "compact", "evaluate"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_cli_on_damaged_run(damage, command, run, tmp_path, capsys):
    from core.replay import ReplayStore
    rows = ReplayStore.open(os.path.join(run, "replay")).state().rows
    words = DAMAGES[damage](run)
    before = tree(run)
    rc, out, err = run_cli(command, run, tmp_path, capsys)
    after = tree(run)
    if command in STOPS[damage]:
        assert rc == 2, out + err
        lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and lines[0].startswith(f"error: {words}"), err
        assert "Traceback" not in err
        assert after == before                        # an error writes nothing, anywhere
    else:
        assert rc == 0, err
        assert outside_store(after) == outside_store(before)
        if command == "stats":
            assert f"| {rows:,} " in out and "return histogram:" in out
        if command != "compact":
            assert after == before
    if damage == "traversal_id":
        assert open(os.path.join(run, "victim", "precious.txt")).read() == "not the store's"


def test_compact_never_bakes_zeros_and_keeps_strays(run, tmp_path, capsys):
    """After a successful compact beside stray entries, the merged shard holds exactly the old rows."""
    from core.replay import ReplayStore
    stray_entries(run)
    store = ReplayStore.open(os.path.join(run, "replay"))
    snap = store.snapshot()
    old = np.concatenate([snap.read_shard(s.id, ["observation"])["observation"] for s in snap.shards])
    rc, _, err = run_cli("compact", run, tmp_path, capsys)
    assert rc == 0, err
    new = ReplayStore.open(store.url).snapshot()
    assert [s.id for s in new.shards] == [f"c{snap.version:08d}-g0000"]
    np.testing.assert_array_equal(new.read_shard(new.shards[0].id, ["observation"])["observation"], old)
    assert (old != 0).any(axis=1).all()               # CartPole observations: never an all-zero row
    shards = os.path.join(run, "replay/shards")
    assert {"notes.txt", "backup", "s00000099"} <= set(os.listdir(shards))


def test_compact_refuses_before_writing_anything(run, tmp_path, capsys):
    """A lost chunk stops compact in the launcher: no merged shard, no log entry."""
    delete_replay_chunk(run)
    shards_before = sorted(os.listdir(os.path.join(run, "replay/shards")))
    rc, _, _ = run_cli("compact", run, tmp_path, capsys)
    assert rc == 2
    assert sorted(os.listdir(os.path.join(run, "replay/shards"))) == shards_before
    assert len(os.listdir(os.path.join(run, "replay/log"))) == 3


# -- library: the cache, checkpoint restore, gc --------------------------------------------------
def test_cache_quarantines_a_shard_with_a_missing_chunk(run):
    from core.replay import ReplayCache, ReplayStore
    from core.replay.schema import MissingChunkError
    delete_replay_chunk(run)
    store = ReplayStore.open(os.path.join(run, "replay"))
    with pytest.raises(MissingChunkError, match="array 'observation', chunk 'c/0/0'"):
        ReplayCache(store, quarantine_on_error=False).refresh()
    assert store.state().quarantined == {}
    rows = {s.id: s.rows for s in store.snapshot().shards}
    cache = ReplayCache(store)
    with pytest.warns(RuntimeWarning, match="skipping replay shard 's00000001': missing chunk"):
        loaded = cache.refresh()
    assert loaded == sum(rows.values()) - rows["s00000001"] == cache.size
    assert "chunk 'c/0/0'" in cache.skipped["s00000001"]
    assert list(store.state().quarantined) == ["s00000001"]
    assert "s00000001" not in [s.id for s in store.snapshot().shards]


def test_checkpoint_restore_refuses_a_missing_chunk(run):
    from core.checkpoint import CheckpointError, Checkpointer
    words = delete_checkpoint_chunk(run)
    ckpt = Checkpointer(os.path.join(run, "checkpoints"))
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(")):
        ckpt.restore()
    with pytest.raises(CheckpointError, match="missing chunk"):
        ckpt.read_variable("learner/params/dense_0.kernel", index=(0, 0))
    state, _ = ckpt.restore(select=["learner/params/dense_0.bias"])  # intact variables still read
    assert state["learner"]["params"]["dense_0.bias"].shape[0] > 0
    older = ckpt.all_steps()[-2]
    assert ckpt.restore(older, select=["learner/params/dense_0.kernel"])[0]["learner"]["params"][
        "dense_0.kernel"].any()


def test_gc_on_traversal_id_is_a_damaged_log_and_deletes_nothing(run):
    from core.replay import ReplayStore
    from core.replay.schema import LogDamagedError
    words = traversal_id(run)
    before = tree(os.path.dirname(run))
    with pytest.raises(LogDamagedError, match=words.replace("[", r"\[").replace("]", r"\]")):
        ReplayStore.open(os.path.join(run, "replay")).gc(grace_seconds=0)
    assert tree(os.path.dirname(run)) == before


def test_gc_leaves_stray_files_and_dirs_alone_with_a_warning(run):
    from core.replay import ReplayStore
    stray_entries(run)
    shards = os.path.join(run, "replay/shards")
    os.makedirs(os.path.join(shards, "s00000042", "observation"))  # stale uncommitted shard debris
    with open(os.path.join(shards, "s00000042", "observation", "zarr.json"), "w") as f:
        f.write("{}")
    os.utime(os.path.join(shards, "s00000042", "observation", "zarr.json"), (1e9, 1e9))
    before = tree(run)
    with pytest.warns(RuntimeWarning, match="leaving") as caught:
        report = ReplayStore.open(os.path.join(run, "replay")).gc(grace_seconds=0)
    assert sorted(report.skipped) == ["backup", "notes.txt", "s00000099"]
    assert report.uncommitted == ["s00000042"] and report.removed == []
    assert sum("leaving" in str(w.message) for w in caught) == 3
    gone = {k for k in before if k.startswith("replay/shards/s00000042")}
    assert tree(run) == {k: v for k, v in before.items() if k not in gone}


# -- resume (train --resume) --------------------------------------------------------------------
def _resume(run, capsys):
    from pipelines import train
    rc = train.main(["--resume", run, "--executor", "local", "--no-progress", "--set", "total_env_steps=2560"])
    return rc, capsys.readouterr().err


@pytest.mark.timeout(300)
@pytest.mark.parametrize("damage", ["checkpoint_chunk", "checkpoint_flip", "log_gap", "empty_entry",
                                    "traversal_id", "lost_store"])
def test_resume_on_damage_exits_2_without_touching_the_store(damage, run, capsys):
    """A failing resume writes nothing: not config.json (--set changed it), not the lock (gone after exit)."""
    words = RESUME_DAMAGES[damage](run)
    before = tree(run)
    rc, err = _resume(run, capsys)
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {words}"), err
    assert "Traceback" not in err
    assert tree(run) == before                        # byte for byte; run.lock is not in it
    assert not os.path.exists(os.path.join(run, "run.lock"))
    if damage == "traversal_id":
        assert os.listdir(os.path.join(run, "victim")) == ["precious.txt"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_with_a_missing_replay_chunk_quarantines_and_trains_on(run, capsys):
    from core.replay import ReplayStore
    delete_replay_chunk(run)
    rc, err = _resume(run, capsys)
    assert rc == 0, err
    state = ReplayStore.open(os.path.join(run, "replay")).state()
    assert "missing chunk" in state.quarantined["s00000001"] and "s00000001" not in state.live


def _outside(run, tiny_run):
    """Everything a resume of ``run`` must leave alone: its tmp_path siblings and the module's pristine run."""
    siblings = {k: v for k, v in tree(os.path.dirname(run)).items() if not k.startswith("run/")}
    return siblings, tree(tiny_run)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_with_a_flipped_replay_byte_quarantines_and_trains_to_completion(run, tiny_run):
    """A flipped byte in a committed shard's chunk during resume: the established checksum handling.

    ``--resume`` (a real process) quarantines the shard naming the chunk, trains on to the new
    ``total_env_steps`` and exits 0; it never hangs (the timeout) and writes nothing outside the run dir.
    """
    from core.replay import ReplayStore
    words = flip_replay_chunk(run)
    store = ReplayStore.open(os.path.join(run, "replay"))
    old = store.state()
    lost = {s.id: s.rows for s in store.snapshot().shards}["s00000001"]
    outside = _outside(run, tiny_run)
    proc = _python("-m", "pipelines.train", "--resume", run, "--executor", "local", "--no-progress",
                   "--set", "total_env_steps=2560")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and not _error_lines(proc.stderr)
    assert f"skipping replay shard 's00000001': {words}" in proc.stderr
    state = ReplayStore.open(os.path.join(run, "replay")).state()
    assert list(state.quarantined) == ["s00000001"] and state.quarantined["s00000001"].startswith(words)
    assert "s00000001" not in state.live and set(old.live) - {"s00000001"} <= set(state.live)
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["env_steps"] == 2560 == old.rows + 2 * 512          # two new 512-row blocks, s3 and s4
    assert state.rows == 2560 - lost and sorted(state.live) == ["s00000000", "s00000002", "s00000003",
                                                                "s00000004"]
    assert proc.stderr.count("skipping replay shard") == 1              # quarantined once, not per refresh
    assert json.load(open(os.path.join(run, "config.json")))["total_env_steps"] == 2560
    assert _outside(run, tiny_run) == outside
    assert not os.path.exists(os.path.join(run, "run.lock"))


# -- real processes: exit status and the one stderr line ------------------------------------------
def _python(*argv):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})


def _error_lines(stderr):
    return [ln for ln in stderr.strip().splitlines() if ln.startswith("error:")]


def test_real_subprocess_stats_on_beam_with_log_gap(run, tmp_path):
    gap_words = log_gap(run)
    before = tree(run)
    proc = _python("-m", "pipelines.process", "stats", os.path.join(run, "replay"), "--plot", str(tmp_path / "x.png"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {gap_words}; repair: python -m pipelines.process repair {os.path.join(run, 'replay')}"
        " --truncate-after 1 (shows what it removes; add --yes to apply)"], proc.stderr
    assert tree(run) == before


def test_real_subprocess_compact_with_missing_chunk(run):
    words = delete_replay_chunk(run)
    before = tree(run)
    proc = _python("-m", "pipelines.process", "compact", os.path.join(run, "replay"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {words}") and len(_error_lines(proc.stderr)) == 1
    assert "Traceback" not in proc.stderr and tree(run) == before


def test_real_subprocess_evaluate_with_missing_checkpoint_chunk(run):
    words = delete_checkpoint_chunk(run)
    proc = _python("-m", "pipelines.evaluate", run, "--checkpoint", "latest", "--episodes", "1")
    assert proc.returncode == 2, proc.stderr
    assert _error_lines(proc.stderr) == [proc.stderr.strip().splitlines()[-1]]
    assert _error_lines(proc.stderr)[0].startswith(f"error: {words}") and "Traceback" not in proc.stderr


def test_repair_of_a_run_store_notes_later_model_checkpoints(run, capsys):
    from pipelines import process
    from core.checkpoint import Checkpointer
    log_gap(run)
    store = os.path.join(run, "replay")
    ckpt = Checkpointer(os.path.join(run, "checkpoints"))
    later = [s for s in ckpt.all_steps() if ckpt.metadata(s)["replay_log_version"] > 1]
    assert later                                      # the tiny run checkpoints at versions 2 and 3
    before = tree(run)
    assert process.main(["repair", store, "--truncate-after", "1"]) == 0
    out = capsys.readouterr().out
    assert f"note: model checkpoints at learner steps {later} were saved at replay log versions after 1" in out
    assert tree(run) == before                        # a dry run
    assert process.main(["repair", store, "--truncate-after", "1", "--yes"]) == 0
    assert ckpt.all_steps() and sorted(os.listdir(os.path.join(store, "log"))) == ["00000000000000000001.json"]
    assert process.main(["stats", store, "--executor", "local", "--plot", os.path.join(run, "..", "out", "p.png")]) == 0
