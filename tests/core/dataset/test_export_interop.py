"""Exports and stores that other tools load with no DataBloom code: TFDS (RLDS), pyarrow / pandas / dask (Parquet),
xarray (replay shards and checkpoints). Every value is compared with what the store holds."""
from __future__ import annotations

import contextlib
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "replay"))
from replay_fakes import random_batch  # noqa: E402

from pipelines.executors.factory import make_pass_executor  # noqa: E402
from pipelines.executors.local import LocalExecutor  # noqa: E402
from core.dataset import export, parquet  # noqa: E402
from core.dataset.errors import DatasetError  # noqa: E402
from core.replay import ReplayStore  # noqa: E402
from core.trajectory import TrajectoryBatch  # noqa: E402
from pipelines import process  # noqa: E402

LOCAL = LocalExecutor()
STEP_FIELDS = ("observation", "action", "reward", "discount")


def time_slice(batch: TrajectoryBatch, lo: int, hi: int) -> TrajectoryBatch:
    core = {k: getattr(batch, k)[lo:hi] for k in ("observation", "action", "reward", "discount", "terminated",
                                                  "truncated", "episode_id", "step", "policy_version")}
    return TrajectoryBatch(**core, extras={k: v[lo:hi] for k, v in batch.extras.items()}, env_id=batch.env_id,
                           actor_id=batch.actor_id, task_id=f"{batch.task_id}-{lo}", seed=batch.seed)


@pytest.fixture
def store_url(tmp_path):
    """Two actors' rollouts of 2-D observations, each cut into 3 shards (episodes span shards; some never end)."""
    url = str(tmp_path / "store")
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    ids = []
    for actor in (1, 2):
        b = random_batch(actor, T=90, E=3, obs_shape=(3, 2))
        for k, (lo, hi) in enumerate(((0, 25), (25, 60), (60, 90))):
            ids.append(store.write_shard(f"a{actor}-s{k}", [time_slice(b, lo, hi)]).id)
    store.commit(ids)
    return url


def store_episodes(url: str):
    """``{episode_id: rows sorted by step}`` and the ids of complete episodes, computed from the raw snapshot."""
    snap = ReplayStore.open(url).snapshot()
    rows = {n: snap.field(n).compute(scheduler="sync") for n in snap.field_names()}
    out, complete = {}, set()
    for e in np.unique(rows["episode_id"]):
        sel = np.flatnonzero(rows["episode_id"] == e)
        sel = sel[np.argsort(rows["step"][sel], kind="stable")]
        ep = {n: v[sel] for n, v in rows.items()}
        out[int(e)] = ep
        ends = ep["terminated"] | ep["truncated"]
        if ep["step"][0] == 0 and (np.diff(ep["step"]) == 1).all() and ends[-1] and not ends[:-1].any():
            complete.add(int(e))
    return out, complete, len(rows["reward"])


# -- RLDS through TFDS ---------------------------------------------------------------------------
@pytest.mark.slow
def test_rlds_loads_with_tfds_every_value_exact(store_url, tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    expected, complete, _ = store_episodes(store_url)
    assert 5 < len(complete) < len(expected)  # the fixture has both kinds
    out = str(tmp_path / "rlds")
    summary = export.export_store(LOCAL, store_url, "rlds", out)
    assert (summary["episodes"], summary["incomplete_episodes"]) == (len(complete), len(expected) - len(complete))
    assert summary["rows"] == sum(len(expected[e]["reward"]) for e in complete)

    builder = tfds.builder_from_directory(out)
    info = builder.info
    assert isinstance(info.features["steps"], tfds.features.Dataset)
    assert info.splits["train"].num_examples == len(complete)
    assert info.metadata["env_id"] == "CartPole-v1" and info.metadata["source_version"] == 1
    assert info.metadata["databloom_version"] == export.databloom_version()
    assert "CartPole-v1" in info.description and "commit-log version 1" in info.description
    seen = []
    for ep in tfds.as_numpy(builder.as_dataset(split="train")):
        e = int(ep["episode_id"])
        want = expected[e]
        seen.append(e)
        steps = list(ep["steps"])
        assert len(steps) == len(want["reward"])
        for name in STEP_FIELDS:
            np.testing.assert_array_equal(np.stack([s[name] for s in steps]), want[name])
            assert steps[0][name].dtype == want[name].dtype
        np.testing.assert_array_equal([s["extras"]["logits"] for s in steps], want["extras/logits"])
        np.testing.assert_array_equal([s["is_first"] for s in steps], want["step"] == 0)
        np.testing.assert_array_equal([s["is_last"] for s in steps], want["terminated"] | want["truncated"])
        np.testing.assert_array_equal([s["is_terminal"] for s in steps], want["terminated"])
        assert ep["episode_return"] == want["reward"].sum(dtype=np.float64)
        assert ep["policy_version"] == want["policy_version"][0]
    assert sorted(seen) == sorted(complete)
    # the thin wrapper is TFDS itself
    assert int(next(iter(export.load_rlds(out)))["episode_id"]) == seen[0]


# -- Parquet as an Arrow dataset -----------------------------------------------------------------
@pytest.mark.slow
def test_parquet_loads_with_pyarrow_pandas_dask(store_url, tmp_path):
    import dask.dataframe as dd
    import pandas as pd
    import pyarrow as pa
    import pyarrow.dataset as pds
    expected, complete, n_rows = store_episodes(store_url)
    out = str(tmp_path / "pq")
    summary = export.export_store(LOCAL, store_url, "parquet", out)
    assert (summary["rows"], summary["episodes"], summary["incomplete_episodes"]) == \
        (n_rows, len(complete), len(expected) - len(complete))

    ds = pds.dataset(out)
    assert ds.schema.field("observation").type == pa.list_(pa.list_(pa.float32(), 2), 3)
    assert ds.schema.field("extras/logits").type == pa.list_(pa.float32(), 2)
    assert ds.schema.field("action").type == pa.int64() and ds.schema.field("is_last").type == pa.bool_()
    meta = json.loads(ds.schema.metadata[parquet.METADATA_KEY])
    assert meta["env_id"] == "CartPole-v1" and meta["source_version"] == 1
    assert meta["fields"]["observation"] == {"dtype": "float32", "shape": [3, 2]}
    # every episode lies whole in one file
    files = [set(f.to_table(columns=["episode_id"]).column(0).to_pylist()) for f in ds.get_fragments()]
    assert sum(len(f) for f in files) == len(set().union(*files)) == len(expected)

    table = ds.to_table()
    assert table.num_rows == n_rows
    obs = table.column("observation").combine_chunks().flatten().flatten().to_numpy().reshape(-1, 3, 2)
    ids, steps = table.column("episode_id").to_numpy(), table.column("step").to_numpy()
    for e, want in expected.items():
        sel = np.flatnonzero(ids == e)
        np.testing.assert_array_equal(steps[sel], want["step"])  # rows of an episode in step order
        np.testing.assert_array_equal(obs[sel], want["observation"])
        for name in ("action", "reward", "discount", "terminated", "truncated", "policy_version"):
            np.testing.assert_array_equal(table.column(name).to_numpy()[sel], want[name])
        np.testing.assert_array_equal(table.column("is_first").to_numpy()[sel], want["step"] == 0)
        np.testing.assert_array_equal(table.column("is_terminal").to_numpy()[sel], want["terminated"])

    frames = {"pandas": pd.read_parquet(out), "dask": dd.read_parquet(out).compute()}
    for name, df in frames.items():
        assert len(df) == n_rows, name
        np.testing.assert_array_equal(df["episode_id"].to_numpy(), ids)
        np.testing.assert_array_equal(df["reward"].to_numpy(), table.column("reward").to_numpy())
        np.testing.assert_array_equal(np.stack([np.stack(o) for o in df["observation"]]), obs)
        np.testing.assert_array_equal(np.stack(df["extras/logits"].to_numpy()),
                                      table.column("extras/logits").combine_chunks().flatten().to_numpy()
                                      .reshape(-1, 2))


# -- engines agree --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dask_engine():
    with contextlib.closing(make_pass_executor("dask", n_workers=2)) as e:
        yield e


def _files(folder):
    return {name: open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["rlds", "parquet"])
def test_beam_and_dask_write_identical_files(fmt, store_url, tmp_path, dask_engine):
    if fmt == "rlds":
        pytest.importorskip("tensorflow_datasets")
    with contextlib.closing(make_pass_executor("beam")) as beam:
        results = {name: export.export_store(engine, store_url, fmt, str(tmp_path / name))
                   for name, engine in (("beam", beam), ("dask", dask_engine))}
    assert {k: v for k, v in results["beam"].items() if k != "out"} == \
        {k: v for k, v in results["dask"].items() if k != "out"}
    beam_files, dask_files = _files(tmp_path / "beam"), _files(tmp_path / "dask")
    assert sorted(beam_files) == sorted(dask_files) and len(beam_files) >= 4
    for name in beam_files:
        assert beam_files[name] == dask_files[name], name


# -- summaries come from what was written, checked against the store -----------------------------
def test_cli_summary_counts_equal_the_store(store_url, tmp_path, capsys):
    expected, complete, n_rows = store_episodes(store_url)
    code = process.main(["export", store_url, "--format", "parquet", "--out", str(tmp_path / "p"),
                         "--executor", "local"])
    table = dict(tuple(c.strip() for c in line.strip("|").split("|"))
                 for line in capsys.readouterr().out.splitlines() if line.count("|") == 3)
    assert code == 0
    assert (table["rows"], table["episodes"], table["incomplete_episodes"]) == \
        (str(n_rows), str(len(complete)), str(len(expected) - len(complete)))


def test_export_whose_files_disagree_with_the_store_is_refused(store_url, tmp_path, monkeypatch):
    real = parquet.write_shard

    def drops_an_episode(item):
        return real({**item, "episodes": item["episodes"][1:]})
    monkeypatch.setattr(parquet, "write_shard", drops_an_episode)
    with pytest.raises(DatasetError, match=r"export wrote \d+ rows / \d+ episodes \(\d+ complete\), the snapshot"):
        export.export_store(LOCAL, store_url, "parquet", str(tmp_path / "bad"))
    assert sorted(os.listdir(tmp_path)) == ["store"]  # nothing left behind


def test_rlds_without_tensorflow_datasets_names_the_extra(store_url, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import now raises ImportError
    code = process.main(["export", store_url, "--format", "rlds", "--out", str(tmp_path / "r"), "--executor", "local"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "databloom[rlds]" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_rlds_to_a_location_tfds_cannot_write_is_one_line_error(store_url, capsys):
    pytest.importorskip("tensorflow_datasets")
    code = process.main(["export", store_url, "--format", "rlds", "--out", "memory://exports/r", "--executor", "local"])
    err = capsys.readouterr().err
    assert code == 2 and "valid: a local path or gs:// URL" in err and err.count("\n") == 1


# -- xarray opens shards and checkpoints ----------------------------------------------------------
def _zarr_arrays(group) -> dict:
    return {name: np.asarray(a[...]) for name, a in group.arrays()}


@pytest.mark.parametrize("engine", ["tensorstore", "zarr"])
def test_xarray_opens_a_fresh_shard(engine, tmp_path):
    import xarray as xr
    import zarr
    store = ReplayStore.open_or_create(str(tmp_path / "s"), env_id="CartPole-v1", engine=engine)
    store.write_shard("x0", [random_batch(3, T=40, E=2, obs_shape=(3, 2)), random_batch(4, T=40, E=2, obs_shape=(3, 2))])
    path = str(tmp_path / "s" / "shards" / "x0")
    for group, first_dim in ((None, "row"), ("extras", "row"), ("episodes", "segment")):
        ds = xr.open_zarr(path, group=group, consolidated=False)
        want = _zarr_arrays(zarr.open_group(path if group is None else f"{path}/{group}", mode="r"))
        assert sorted(ds.data_vars) == sorted(want) and want
        for name, values in want.items():
            assert ds[name].dims[0] == first_dim
            assert ds[name].dtype == values.dtype
            np.testing.assert_array_equal(ds[name].values, values)
    ds = xr.open_zarr(path, consolidated=False)
    assert ds["observation"].dims == ("row", "observation_dim0", "observation_dim1") and ds.sizes["row"] == 160


def test_shards_without_dimension_names_still_read(tmp_path):
    store = ReplayStore.open_or_create(str(tmp_path / "s"), env_id="CartPole-v1")
    store.commit([store.write_shard("x0", [random_batch(5, T=30, E=2)]).id])
    before = {n: store.snapshot().field(n).compute(scheduler="sync") for n in store.snapshot().field_names()}
    stripped = 0
    for root, _, names in os.walk(tmp_path / "s" / "shards"):
        if "zarr.json" in names:
            meta = json.loads(open(os.path.join(root, "zarr.json")).read())
            if meta["node_type"] == "array":
                assert meta.pop("dimension_names")
                open(os.path.join(root, "zarr.json"), "w").write(json.dumps(meta))
                stripped += 1
    assert stripped > 10
    snap = ReplayStore.open(str(tmp_path / "s")).snapshot()
    for n, v in before.items():
        np.testing.assert_array_equal(snap.field(n).compute(scheduler="sync"), v)
    from core.dataset import stats
    assert stats.compute_stats(LOCAL, str(tmp_path / "s"))["rows"] == 60


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["tensorstore", "zarr"])
def test_xarray_opens_checkpoint_params(engine, tmp_path):
    import xarray as xr
    import zarr
    from core.checkpoint import Checkpointer
    rng = np.random.default_rng(0)
    params = {"dense_0.kernel": rng.standard_normal((4, 8)).astype(np.float32),
              "dense_0.bias": rng.standard_normal(8).astype(np.float32),
              "dense_1.kernel": rng.standard_normal((8, 2)).astype(np.float32)}
    with Checkpointer(str(tmp_path / "ckpt"), engine=engine) as ckpt:
        ckpt.save(7, {"learner": {"params": params, "counters": {"learner_steps": np.array(7, np.int64)}}})
    step_path = str(tmp_path / "ckpt" / "step_00000007")
    ds = xr.open_zarr(step_path + "/learner/params", consolidated=False)
    want = _zarr_arrays(zarr.open_group(step_path + "/learner/params", mode="r"))
    assert sorted(ds.data_vars) == sorted(params) == sorted(want)
    for name, values in want.items():
        np.testing.assert_array_equal(ds[name].values, values)
        np.testing.assert_array_equal(ds[name].values, params[name])
    assert ds["dense_0.kernel"].dims == ("dense_0.kernel_dim0", "dense_0.kernel_dim1")
    counters = xr.open_zarr(step_path + "/learner/counters", consolidated=False)
    assert int(counters["learner_steps"].values) == 7
