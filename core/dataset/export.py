"""Export a snapshot as RLDS episodes (TFRecord, read with tf.data) or Parquet (one row per step).

Both formats carry the RLDS step flags computed from the stored rows::

    is_first    = step == 0
    is_last     = terminated or truncated     (the row holds the final observation)
    is_terminal = terminated

* ``parquet``: ``part-<index>-<shard>.parquet`` per shard, one row per stored
  step, every field as a column (vector fields as fixed-size lists), plus
  the flags. ``pandas.read_parquet(PATH)`` reads the folder.
* ``rlds``: complete episodes only (see ``episodes``), one
  ``tf.train.SequenceExample`` per episode in ``part-<index>.tfrecord``:
  context ``episode_id``, ``policy_version``; one feature list per step field
  (``observation``, ``action``, ``reward``, ``discount``, ``is_first``,
  ``is_last``, ``is_terminal``, and extras), values flattened per step.
  ``features.json`` records dtypes and shapes; :func:`load_rlds` turns the
  folder into a ``tf.data.Dataset`` of episodes whose ``steps`` is itself a
  ``tf.data.Dataset`` (the RLDS layout). An episode spanning shards is
  written by the task of its first shard, which reads the other segments.

Output is written into a hidden staging folder next to ``PATH`` and renamed
to ``PATH`` only when every part is written, so no partial export is ever
visible at ``PATH``.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional

import numpy as np

from core import urls
from core.dataset import engines as engines_lib
from core.dataset import episodes, shards
from core.dataset.errors import DatasetError

FORMATS = ("parquet", "rlds")
_SKIP_RLDS = ("terminated", "truncated", "episode_id", "step", "policy_version")


def step_flags(rows: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    return {"is_first": rows["step"] == 0, "is_last": rows["terminated"] | rows["truncated"],
            "is_terminal": rows["terminated"].copy()}


# -- parquet -------------------------------------------------------------------------------------
def parquet_shard(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: one shard -> one Parquet file in the staging folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows, _ = shards.read_rows(item)
    rows.update(step_flags(rows))
    cols = {}
    for name, v in rows.items():
        if v.ndim == 1:
            cols[name] = pa.array(v)
        else:
            width = int(np.prod(v.shape[1:]))
            cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), width)
    table = pa.table(cols).replace_schema_metadata(
        {"databloom.shapes": json.dumps({k: list(v.shape[1:]) for k, v in rows.items()}),
         "databloom.shard": item["shard_id"]})
    name = f"part-{item['index']:05d}-{item['shard_id']}.parquet"
    fs, path = urls.resolve(urls.join(item["staging"], name))
    with fs.open(path, "wb") as f:
        pq.write_table(table, f)
    return {"index": item["index"], "file": name, "rows": int(len(rows["reward"])), "episodes": 0}


# -- rlds ---------------------------------------------------------------------------------------
def plan_rlds(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Reduce: complete episodes per owning shard id, each a list of [shard_id, token, start, length]."""
    parts = episodes.ordered(parts)
    seg = episodes.all_segments(parts)
    table = episodes.episode_table(seg)
    by_index = {p["index"]: p for p in parts}
    owned: Dict[str, List[Dict[str, Any]]] = {p["shard_id"]: [] for p in parts}
    for e in np.flatnonzero(table["complete"]):
        lo, n = int(table["first"][e]), int(table["count"][e])
        pieces = [[by_index[int(seg["shard"][j])]["shard_id"], by_index[int(seg["shard"][j])]["token"],
                   int(seg["start"][j]), int(seg["length"][j])] for j in range(lo, lo + n)]
        owned[pieces[0][0]].append({"episode_id": int(table["episode_id"][e]), "pieces": pieces})
    return {"owned": owned, "episodes": int(table["complete"].sum())}


def _episode_rows(item: Dict[str, Any], pieces: List[list], readers: Dict[str, Any]) -> Dict[str, np.ndarray]:
    parts = []
    for shard_id, token, start, length in pieces:
        if shard_id not in readers:
            readers[shard_id] = shards.reader({"store_url": item["store_url"], "shard_id": shard_id, "token": token})
        r = readers[shard_id]
        parts.append({n: r.read(n, slice(start, start + length)) for n in r.field_names})
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _feature_list(values: np.ndarray):
    import tensorflow as tf
    flat = values.reshape(len(values), -1)
    if np.issubdtype(flat.dtype, np.floating):
        return tf.train.FeatureList(feature=[tf.train.Feature(float_list=tf.train.FloatList(value=r)) for r in flat])
    return tf.train.FeatureList(feature=[tf.train.Feature(int64_list=tf.train.Int64List(value=r))
                                         for r in flat.astype(np.int64)])


def rlds_shard(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: the episodes owned by one shard -> one TFRecord file of SequenceExamples."""
    import tensorflow as tf
    name = f"part-{item['index']:05d}.tfrecord"
    fs, path = urls.resolve(urls.join(item["staging"], name))
    readers: Dict[str, Any] = {}
    steps = 0
    spec: Dict[str, Any] = {}
    with fs.open(path, "wb") as f:
        for ep in item["episodes"]:
            rows = _episode_rows(item, ep["pieces"], readers)
            rows.update(step_flags(rows))
            fields = {k: v for k, v in rows.items() if k not in _SKIP_RLDS}
            spec = {k: {"dtype": v.dtype.name, "shape": list(v.shape[1:])} for k, v in fields.items()}
            ex = tf.train.SequenceExample(
                context=tf.train.Features(feature={
                    "episode_id": tf.train.Feature(int64_list=tf.train.Int64List(value=[ep["episode_id"]])),
                    "policy_version": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[int(rows["policy_version"][0])]))}),
                feature_lists=tf.train.FeatureLists(feature_list={k: _feature_list(v) for k, v in fields.items()}))
            data = ex.SerializeToString()
            f.write(_tfrecord_frame(data))
            steps += len(rows["reward"])
    return {"index": item["index"], "file": name, "rows": steps, "episodes": len(item["episodes"]), "spec": spec}


def _masked_crc(data: bytes) -> int:
    import crc32c
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord_frame(data: bytes) -> bytes:
    """One TFRecord record: length, masked crc32c of length, data, masked crc32c of data."""
    import struct
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", _masked_crc(header)) + data + struct.pack("<I", _masked_crc(data))


def load_rlds(path: str):
    """The exported folder as a ``tf.data.Dataset`` of RLDS episodes ``{episode_id, policy_version, steps}``."""
    import tensorflow as tf
    fs, root = urls.resolve(path)
    with fs.open(f"{root}/features.json") as f:
        spec = json.load(f)["steps"]
    seq = {k: tf.io.FixedLenSequenceFeature([int(np.prod(s["shape"]))] if s["shape"] else [],
                                            tf.float32 if s["dtype"].startswith("float") else tf.int64)
           for k, s in spec.items()}
    ctx = {"episode_id": tf.io.FixedLenFeature([], tf.int64), "policy_version": tf.io.FixedLenFeature([], tf.int64)}
    files = sorted(f"{path.rstrip('/')}/{p.rsplit('/', 1)[-1]}" for p in fs.ls(root, detail=False)
                   if p.endswith(".tfrecord"))

    def parse(record):
        context, steps = tf.io.parse_single_sequence_example(record, ctx, seq)
        steps = {k: tf.reshape(tf.cast(v, spec[k]["dtype"]) if spec[k]["dtype"] != "bool" else v != 0,
                               [-1, *spec[k]["shape"]]) for k, v in steps.items()}
        return {**context, "steps": tf.data.Dataset.from_tensor_slices(steps)}
    return tf.data.TFRecordDataset(files).map(parse)


# -- driver --------------------------------------------------------------------------------------
def _collect(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    results = sorted(results, key=lambda r: r["index"])
    spec = next((r["spec"] for r in results if r.get("spec")), {})
    return {"files": [r["file"] for r in results], "rows": sum(r["rows"] for r in results),
            "episodes": sum(r["episodes"] for r in results), "spec": spec}


def export_store(engine, store_url: str, fmt: str, out: str, version: Optional[int] = None) -> Dict[str, Any]:
    """Export the snapshot to ``out`` (must not exist) as ``fmt``; see module docstring."""
    if fmt not in FORMATS:
        raise DatasetError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    store, snap = shards.open_snapshot(store_url, version)
    out = urls.normalize(out)
    engines_lib.check_reachable(engine, store.url, out)
    fs, out_path = urls.resolve(out)
    if fs.exists(out_path):
        raise DatasetError(f"--out {out} already exists; valid: a path that does not exist yet")
    parent, base = out_path.rsplit("/", 1)
    staging_path = f"{parent}/.{base}.partial-{uuid.uuid4().hex[:8]}"
    staging = out.rsplit("/", 1)[0] + "/" + staging_path.rsplit("/", 1)[1]
    fs.makedirs(staging_path, exist_ok=True)
    items = [{**i, "staging": staging} for i in shards.shard_items(store, snap)]
    try:
        if fmt == "parquet":
            res = engine.map_reduce("export-parquet", parquet_shard, items, _collect)
        else:
            plan = engine.map_reduce("export-plan", episodes.shard_segments, items, plan_rlds)
            if not plan["episodes"]:
                raise DatasetError(f"{store.url} holds no complete episode; valid for --format rlds: a store"
                                   " with at least one complete episode (or use --format parquet)")
            work = [{**i, "episodes": plan["owned"][i["shard_id"]]} for i in items if plan["owned"][i["shard_id"]]]
            res = engine.map_reduce("export-rlds", rlds_shard, work, _collect)
        manifest = {"format": fmt, "source": store.url, "version": snap.version, "env_id": store.env_id,
                    "files": res["files"], "rows": res["rows"], "episodes": res["episodes"]}
        with fs.open(f"{staging_path}/{'features.json' if fmt == 'rlds' else '_manifest.json'}", "w") as f:
            json.dump({**manifest, "steps": res["spec"]} if fmt == "rlds" else manifest, f, indent=1)
        fs.mv(staging_path, out_path, recursive=True)
    except BaseException:
        if fs.exists(staging_path):
            fs.rm(staging_path, recursive=True)
        raise
    return {**manifest, "out": out}
