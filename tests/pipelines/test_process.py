"""Offline dataset processing (core.dataset, pipelines.process): exact values, engines agree, bad input."""
from __future__ import annotations

import contextlib
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core", "replay"))
from replay_fakes import random_batch  # noqa: E402

from pipelines.executors.factory import make_pass_executor  # noqa: E402
from pipelines.executors.local import LocalExecutor  # noqa: E402
from core.dataset import compact, episodes, export, relabel, stats  # noqa: E402
from core.dataset import filter as filter_lib  # noqa: E402
from core.dataset.shards import check_reachable, make_batch  # noqa: E402
from core.replay import NStepSampler, ReplayCache, ReplayStore  # noqa: E402
from pipelines import process  # noqa: E402


def rows(episode, steps, rewards, end="", version=1):
    n = len(steps)
    term, trunc = np.zeros(n, bool), np.zeros(n, bool)
    if end:
        (term if end == "terminated" else trunc)[-1] = True
    steps = np.asarray(steps, np.int32)
    return {"observation": np.stack([100.0 * episode + steps, np.full(n, episode)], 1).astype(np.float32),
            "action": (steps % 2).astype(np.int64), "reward": np.asarray(rewards, np.float32),
            "discount": (~term).astype(np.float32), "terminated": term, "truncated": trunc,
            "episode_id": np.full(n, episode, np.int64), "step": steps,
            "policy_version": np.full(n, version, np.int64)}


def cat(*parts):
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@pytest.fixture
def hand_store(tmp_path):
    """Shard A (actor 1, policy 1): ep 1 (terminated, return 3) + ep 2 steps 0-2.
    Shard B (actor 2, policy 2): ep 2 steps 3-4 (truncated, return 8) + ep 3 steps 0-1 (incomplete)."""
    url = str(tmp_path / "hand")
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    a = cat(rows(1, range(4), [1, 1, 1, 0], "terminated"), rows(2, range(3), [2, 2, 2]))
    b = cat(rows(2, [3, 4], [2, 0], "truncated", version=2), rows(3, [0, 1], [5, 5], version=2))
    store.write_shard("a0", [make_batch(a, "CartPole-v1", actor=1, task="a0001-t0000000")])
    store.write_shard("b0", [make_batch(b, "CartPole-v1", actor=2, task="a0002-t0000000")])
    store.commit(["a0", "b0"])
    return url


@pytest.fixture
def random_store(tmp_path):
    url = str(tmp_path / "random")
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    store.commit([store.write_shard(f"s{i:02d}", [random_batch(i, T=48, E=3)]).id for i in range(6)])
    return url


LOCAL = LocalExecutor()


def test_stats_exact_values(hand_store):
    s = stats.compute_stats(LOCAL, hand_store, bins=5)
    assert (s["shards"], s["rows"], s["transitions"], s["episodes"], s["incomplete_episodes"]) == (2, 11, 9, 2, 1)
    assert s["episode_length"] == {"mean": 3.5, "min": 3, "max": 4}
    d = s["return"]
    assert (d["mean"], d["std"], d["min"], d["median"], d["max"]) == (5.5, 2.5, 3.0, 5.5, 8.0)
    assert d["hist_counts"] == [1, 0, 0, 0, 1] and d["hist_edges"] == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert s["per_policy_version"] == [{"policy_version": 1, "rows": 7, "episodes": 2, "mean_return": 5.5},
                                       {"policy_version": 2, "rows": 4, "episodes": 0, "mean_return": None}]
    assert s["per_actor"] == [{"actor": 1, "rows": 7, "episodes": 2, "mean_return": 5.5},
                              {"actor": 2, "rows": 4, "episodes": 0, "mean_return": None}]


def test_filter_copies_matching_episodes_in_one_commit(hand_store, tmp_path):
    out = str(tmp_path / "expert")
    r = filter_lib.filter_store(LOCAL, hand_store, out, min_return=5)
    assert (r["episodes"], r["rows"], r["out_version"]) == (1, 5, 1)
    new = ReplayStore.open(out)
    assert new.latest_version() == 1 and [s.id for s in new.snapshot().shards] == ["a0", "b0"]
    ep = new.snapshot().field("episode_id").compute(scheduler="sync")
    assert ep.tolist() == [2] * 5
    s = stats.compute_stats(LOCAL, out)
    assert (s["episodes"], s["incomplete_episodes"], s["return"]["mean"]) == (1, 0, 8.0)
    assert [a["actor"] for a in s["per_actor"]] == [1, 2]  # per-batch actors survive the copy


def test_relabel_nstep_exact_across_shards(hand_store):
    before = ReplayStore.open(hand_store).latest_version()
    relabel.relabel_store(LOCAL, hand_store, n_step=2, discount=0.5)
    store = ReplayStore.open(hand_store)
    assert store.latest_version() == before + 1 and store.log.entry(before + 1)["op"] == "replace"
    snap = store.snapshot()
    ret = snap.field("extras/nstep_return").compute(scheduler="sync")
    disc = snap.field("extras/nstep_discount").compute(scheduler="sync")
    k = snap.field("extras/nstep_count").compute(scheduler="sync")
    nan = np.nan
    # ep1 (terminated at step 3) | ep2 steps 0-2 (shard A) ... 3-4 (shard B, truncated) | ep3 (no end)
    np.testing.assert_array_equal(ret, [1.5, 1.5, 1, 0, 3, 3, 3, 2, 0, nan, nan])
    np.testing.assert_array_equal(disc, [0.25, 0, 0, 0, 0.25, 0.25, 0.25, 0.5, 0, nan, nan])
    np.testing.assert_array_equal(k, [2, 2, 1, 0, 2, 2, 2, 1, 0, -1, -1])


def test_relabel_matches_replay_sampler(random_store):
    # Split the episodes across shards more: compact nothing, relabel, compare with NStepSampler.
    relabel.relabel_store(LOCAL, random_store, n_step=3, discount=0.9)
    cache = ReplayCache(ReplayStore.open(random_store), 100_000)
    cache.refresh()
    sampler = NStepSampler(cache, n=3, gamma=0.9)
    slots = sampler.ready_slots
    t = sampler.transitions(slots)
    np.testing.assert_allclose(cache.data["extras/nstep_return"][slots], t["reward"], rtol=1e-6)
    np.testing.assert_allclose(cache.data["extras/nstep_discount"][slots], t["discount"], rtol=1e-6)
    np.testing.assert_array_equal(cache.data["extras/nstep_count"][slots], t["nstep"])


def test_compact_is_one_atomic_swap_and_old_snapshot_still_reads(random_store):
    store = ReplayStore.open(random_store)
    old = store.snapshot()
    before = stats.compute_stats(LOCAL, random_store)
    r = compact.compact_store(LOCAL, random_store, target_bytes=1 << 30)
    assert (r["shards_before"], r["shards_after"], r["version"]) == (6, 1, old.version + 1)
    assert store.log.entry(r["version"])["op"] == "replace"
    new = store.snapshot()
    for name in ("observation", "episode_id", "step", "reward", "extras/logits"):
        np.testing.assert_array_equal(new.field(name).compute(scheduler="sync"), old.field(name).compute(scheduler="sync"))
    after = stats.compute_stats(LOCAL, random_store)
    assert {k: v for k, v in after.items() if k not in ("version", "shards")} == \
        {k: v for k, v in before.items() if k not in ("version", "shards")}
    # Readers of the old snapshot are unaffected until gc deletes the old data.
    assert old.field("reward").sum().compute(scheduler="sync") == pytest.approx(float(new.field("reward").sum().compute(scheduler="sync")))
    assert sorted(store.gc(grace_seconds=0).removed) == [s.id for s in old.shards]


def test_replace_keeps_commit_order(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "o"), env_id="CartPole-v1")
    for i in range(4):
        store.commit([store.write_shard(f"s{i}", [random_batch(i, T=8, E=1)]).id])
    info = store.write_shard("m0", [random_batch(9, T=8, E=1)])
    from core.dataset.replace import replace_shards
    v = replace_shards(store, [(["s1", "s2"], [info])], reason="test")
    assert list(store.state().live) == ["s0", "m0", "s3"] and store.state().committed_version["m0"] == v
    assert replace_shards(store, [(["s1", "s2"], [info])], reason="test") == v  # idempotent retry
    assert list(store.state(v - 1).live) == ["s0", "s1", "s2", "s3"]


def test_export_parquet_and_rlds(hand_store, tmp_path):
    import pandas as pd
    export.export_store(LOCAL, hand_store, "parquet", str(tmp_path / "pq"))
    df = pd.read_parquet(tmp_path / "pq")
    assert len(df) == 11 and df["is_first"].sum() == 3 and df["is_last"].sum() == 2
    assert df["is_terminal"].sum() == 1 and list(df["observation"][4]) == [200.0, 2.0]
    r = export.export_store(LOCAL, hand_store, "rlds", str(tmp_path / "rlds"))
    assert (r["episodes"], r["rows"]) == (2, 9)
    eps = {int(e["episode_id"]): e for e in export.load_rlds(str(tmp_path / "rlds"))}
    assert sorted(eps) == [1, 2]
    steps = [{k: v.numpy() for k, v in s.items()} for s in eps[2]["steps"]]
    assert [s["reward"] for s in steps] == [2, 2, 2, 2, 0]
    assert [bool(s["is_first"]) for s in steps] == [True, False, False, False, False]
    assert [bool(s["is_last"]) for s in steps] == [False, False, False, False, True]
    assert not any(s["is_terminal"] for s in steps)  # truncated, not terminal
    ep1 = [bool(s["is_terminal"]) for s in eps[1]["steps"]]
    assert ep1 == [False, False, False, True]
    assert steps[3]["observation"].tolist() == [203.0, 2.0]  # the segment from the second shard


@pytest.fixture(scope="module")
def dask_engine():
    with contextlib.closing(make_pass_executor("dask", n_workers=2)) as e:
        yield e


@pytest.mark.slow
def test_beam_and_dask_give_identical_results(random_store, tmp_path, dask_engine):
    with contextlib.closing(make_pass_executor("beam")) as beam:
        results = {}
        for name, engine in (("beam", beam), ("dask", dask_engine)):
            s = stats.compute_stats(engine, random_store)
            f = filter_lib.filter_store(engine, random_store, str(tmp_path / f"f-{name}"), min_return=5)
            out = ReplayStore.open(f["out"]).snapshot()
            copied = {n: out.field(n).compute(scheduler="sync").tolist() for n in ("episode_id", "step", "reward")}
            plan = engine.map_reduce("plan", episodes.shard_segments, _items(random_store), export.plan_rlds)
            results[name] = (s, {k: v for k, v in f.items() if k != "out"}, copied, plan)
    assert results["beam"] == results["dask"]
    assert results["beam"][0] == stats.compute_stats(LOCAL, random_store)


def _items(url):
    from core.dataset.shards import open_snapshot, shard_items
    return shard_items(*open_snapshot(url))


@pytest.mark.slow
def test_relabel_and_compact_identical_on_beam_and_dask(tmp_path, dask_engine):
    fields = {}
    for name in ("beam", "dask"):
        url = str(tmp_path / name)
        store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
        store.commit([store.write_shard(f"s{i}", [random_batch(i, T=40, E=2)]).id for i in range(4)])
        engine = make_pass_executor("beam") if name == "beam" else dask_engine
        relabel.relabel_store(engine, url, 3, 0.99)
        compact.compact_store(engine, url, target_bytes=1 << 30)
        snap = store.snapshot()
        fields[name] = ([s.id for s in snap.shards], {n: snap.field(n).compute(scheduler="sync") for n in snap.field_names()})
    assert fields["beam"][0] == fields["dask"][0] == ["c00000002-g0000"]
    for n, v in fields["beam"][1].items():
        np.testing.assert_array_equal(v, fields["dask"][1][n])


# -- CLI and bad input ------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    code = process.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_stats_prints_tables_and_writes_png(hand_store, tmp_path, capsys):
    png, js = tmp_path / "h.png", tmp_path / "s.json"
    code, out, _ = run_cli(capsys, "stats", hand_store, "--plot", str(png), "--json", str(js))
    assert code == 0 and "| policy version |" in out and "| actor |" in out
    assert png.read_bytes()[:4] == b"\x89PNG" and json.loads(js.read_text())["episodes"] == 2


@pytest.mark.parametrize("argv, message", [
    (["stats", "ftp://host/store"], "unsupported URL scheme 'ftp'"),
    (["stats", "{tmp}/missing"], "is not a DataBloom replay store"),
    (["stats", "{tmp}/empty"], "is empty"),
    (["filter", "{hand}", "--min-return", "100", "--out", "{tmp}/none"], "no episode of"),
    (["export", "{hand}", "--format", "csv", "--out", "{tmp}/x"], "unknown export format 'csv'; valid: parquet, rlds"),
    (["stats", "{hand}", "--executor", "spark"], "unknown executor 'spark'"),
])
def test_cli_bad_input_one_line_exit_2_no_output(argv, message, hand_store, tmp_path, capsys):
    ReplayStore.open_or_create(str(tmp_path / "empty"), env_id="CartPole-v1")
    argv = [a.format(tmp=tmp_path, hand=hand_store) for a in argv]
    before = sorted(os.listdir(tmp_path))
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == before  # no partial output


def test_export_to_existing_path_is_refused(hand_store, tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    code, _, err = run_cli(capsys, "export", hand_store, "--format", "parquet", "--out", str(tmp_path / "taken"),
                           "--executor", "local")
    assert code == 2 and "already exists" in err


def test_dask_rejects_memory_store(dask_engine):
    with pytest.raises(Exception, match="memory://"):
        check_reachable(dask_engine, "memory://x/y")


def test_cli_filter_compact_relabel_export_on_memory_store(capsys, tmp_path):
    import uuid
    url = f"memory://process-tests/{uuid.uuid4().hex}"
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    store.commit([store.write_shard(f"s{i}", [random_batch(i, T=32, E=2)]).id for i in range(3)])
    assert run_cli(capsys, "compact", url, "--executor", "local")[0] == 0
    assert [s.id for s in store.snapshot().shards] == ["c00000001-g0000"]
    code, out, _ = run_cli(capsys, "relabel", url, "--n-step", "2", "--discount", "0.9", "--executor", "local")
    assert code == 0 and "extras/nstep_return" in store.snapshot().field_names()
    code, _, _ = run_cli(capsys, "filter", url, "--min-return", "3", "--out", url + "-f", "--executor", "local")
    assert code == 0 and ReplayStore.open(url + "-f").latest_version() == 1
    code, _, _ = run_cli(capsys, "export", url + "-f", "--format", "parquet", "--out", str(tmp_path / "p"),
                         "--executor", "local")
    import pandas as pd
    assert code == 0 and "extras/nstep_return" in pd.read_parquet(tmp_path / "p").columns
