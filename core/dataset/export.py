"""Export a snapshot for the tools RL users already have: RLDS (a TFDS dataset) or Parquet (an Arrow dataset).

Both formats carry the RLDS step flags computed from the stored rows::

    is_first    = step == 0
    is_last     = terminated or truncated     (the row holds the final observation)
    is_terminal = terminated

* ``rlds`` (``core.dataset.rlds``): complete episodes, written with
  tensorflow-datasets' own writer; ``tfds.builder_from_directory(PATH)``
  loads it. Needs the ``[rlds]`` extra.
* ``parquet`` (``core.dataset.parquet``): every stored row, one Arrow
  dataset; ``pyarrow.dataset.dataset(PATH)``, ``pandas.read_parquet(PATH)``
  and ``dask.dataframe.read_parquet(PATH)`` load it.

Plan (the same for both, and for every engine)::

    shards --map export_segments--> segments + fields --reduce plan_*--> episodes per owning shard
           --map rlds.write_shard | parquet.write_shard--> one file per owning shard (counts read back)
           --driver--> dataset-level metadata, counts checked against the plan, one rename

Every episode is written whole by the task of the shard it starts in (it
reads the segments in later shards itself: :mod:`core.dataset.ownership`), so no episode is split across
files. A task holds one shard's rows and one episode in memory, never the
store. Output goes to a hidden staging folder next to ``PATH``, renamed to
``PATH`` only when every file is written, so no partial export is visible.
The summary's ``rows`` and ``episodes`` are what the files hold, checked
against the store's episode table (a mismatch is an error, not a summary).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional, Tuple

from core import urls
from core.dataset import episodes, shards
from core.dataset.errors import DatasetError

FORMATS = ("parquet", "rlds")
#: The layout version of what ``export`` writes (recorded in both formats' metadata).
EXPORT_FORMAT_VERSION = "1.0.0"


def databloom_version() -> str:
    from importlib import metadata
    try:
        return metadata.version("databloom")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


def check_format(fmt: str) -> None:
    """DatasetError (one line) for an unknown format, or for ``rlds`` without tensorflow-datasets."""
    if fmt not in FORMATS:
        raise DatasetError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    if fmt == "rlds":
        from core.dataset import rlds
        rlds.require_tfds()


# -- plan ----------------------------------------------------------------------------------------
def export_segments(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: a shard's episode segments (``episodes.shard_segments``) plus its field spec."""
    out = episodes.shard_segments(item)
    out["fields"] = shards.reader(item).attrs["fields"]
    return out


def plan_episodes(parts: List[Dict[str, Any]], complete_only: bool) -> Dict[str, Any]:
    """Reduce: the episodes each shard owns (those that start in it), and the expected totals.

    Returns ``owned`` (``{shard_id: [{episode_id, return, policy_version,
    rows, complete, pieces}]}``, each piece ``[shard_id, token, start,
    length]`` in step order), ``episodes`` / ``incomplete`` (complete and
    other episodes of the snapshot), ``rows`` (rows the export must hold),
    and ``fields`` (the shards' common field spec, when the parts carry it).
    """
    parts = episodes.ordered(parts)
    seg = episodes.all_segments(parts)
    table = episodes.episode_table(seg)
    by_index = {p["index"]: p for p in parts}
    owned: Dict[str, List[Dict[str, Any]]] = {p["shard_id"]: [] for p in parts}
    rows = 0
    for e in range(len(table["episode_id"])):
        complete = bool(table["complete"][e])
        if complete_only and not complete:
            continue
        lo, n = int(table["first"][e]), int(table["count"][e])
        pieces = [[by_index[int(seg["shard"][j])]["shard_id"], by_index[int(seg["shard"][j])]["token"],
                   int(seg["start"][j]), int(seg["length"][j])] for j in range(lo, lo + n)]
        owned[pieces[0][0]].append({"episode_id": int(table["episode_id"][e]), "return": float(table["return"][e]),
                                    "policy_version": int(table["policy_version"][e]),
                                    "rows": int(table["rows"][e]), "complete": complete, "pieces": pieces})
        rows += int(table["rows"][e])
    n_complete = int(table["complete"].sum())
    return {"owned": owned, "episodes": n_complete, "incomplete": int(len(table["complete"])) - n_complete,
            "rows": rows, "fields": _common_fields(parts)}


def plan_rlds(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Reduce for ``rlds``: complete episodes only (RLDS episodes start at ``is_first`` and end at ``is_last``)."""
    return plan_episodes(parts, complete_only=True)


def plan_parquet(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Reduce for ``parquet``: every episode, complete or not (every stored row)."""
    return plan_episodes(parts, complete_only=False)


def _common_fields(parts: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    specs = [p["fields"] for p in parts if "fields" in p]
    for p in parts:
        if "fields" in p and p["fields"] != specs[0]:
            raise DatasetError(f"shard {p['shard_id']} has fields {p['fields']}, shard {parts[0]['shard_id']} has"
                               f" {specs[0]}; valid for export: shards with one field layout (run relabel on all)")
    return specs[0] if specs else None


# -- driver --------------------------------------------------------------------------------------
def _collect(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    results = sorted(results, key=lambda r: r["file_index"])
    return {"files": [r["file"] for r in results], "file_rows": [r["rows"] for r in results],
            "file_episodes": [r["episodes"] for r in results], "file_bytes": [r["bytes"] for r in results],
            "rows": sum(r["rows"] for r in results), "episodes": sum(r["episodes"] for r in results),
            "complete": sum(r["complete"] for r in results)}


def _staging(out: str) -> Tuple[Any, str, str, str]:
    """``(fs, out_path, staging_path, staging_url)``: a hidden folder beside ``out``."""
    fs, out_path = urls.resolve(out)
    if fs.exists(out_path):
        raise DatasetError(f"--out {out} already exists; valid: a path that does not exist yet")
    parent, base = out_path.rsplit("/", 1)
    name = f".{base}.partial-{uuid.uuid4().hex[:8]}"
    return fs, out_path, f"{parent}/{name}", out.rsplit("/", 1)[0] + "/" + name


def _check_counts(fmt: str, plan: Dict[str, Any], res: Dict[str, Any], store_rows: int) -> None:
    """What the files hold must be what the snapshot holds (a mismatch is a bug or damage: never a summary)."""
    expect_rows = plan["rows"] if fmt == "rlds" else store_rows
    expect_eps = plan["episodes"] if fmt == "rlds" else plan["episodes"] + plan["incomplete"]
    if (res["rows"], res["episodes"], res["complete"]) != (expect_rows, expect_eps, plan["episodes"]):
        raise DatasetError(f"export wrote {res['rows']} rows / {res['episodes']} episodes ({res['complete']}"
                           f" complete), the snapshot holds {expect_rows} / {expect_eps} ({plan['episodes']});"
                           " output discarded")


def export_store(engine, store_url: str, fmt: str, out: str, version: Optional[int] = None) -> Dict[str, Any]:
    """Export the snapshot to ``out`` (must not exist) as ``fmt``; see module docstring.

    Returns the summary: ``format, source, version, env_id, files, rows,
    episodes, incomplete_episodes, out`` (``incomplete_episodes``: exported
    as rows in Parquet, left out of RLDS).
    """
    check_format(fmt)
    from core.dataset import parquet, rlds
    store, snap = shards.open_snapshot(store_url, version)
    out = urls.normalize(out)
    shards.check_reachable(engine, store.url, out)
    if fmt == "rlds":
        rlds.check_target(out)
    fs, out_path, staging_path, staging = _staging(out)
    items = shards.shard_items(store, snap)
    plan = engine.map_reduce("export-plan", export_segments, items, plan_rlds if fmt == "rlds" else plan_parquet)
    if fmt == "rlds" and not plan["episodes"]:
        raise DatasetError(f"{store.url} holds no complete episode; valid for --format rlds: a store"
                           " with at least one complete episode (or use --format parquet)")
    source = {"env_id": store.env_id, "source": store.url, "source_version": snap.version,
              "store_schema_version": store.schema_version, "databloom_version": databloom_version(),
              "export_format_version": EXPORT_FORMAT_VERSION, "fields": plan["fields"]}
    owners = [i for i in items if plan["owned"][i["shard_id"]]]
    work = [{**i, "episodes": plan["owned"][i["shard_id"]], "file_index": j, "num_files": len(owners),
             "staging": staging, "source": source} for j, i in enumerate(owners)]
    fs.makedirs(staging_path, exist_ok=True)
    try:
        writer = rlds if fmt == "rlds" else parquet
        res = engine.map_reduce(f"export-{fmt}", writer.write_shard, work, _collect)
        _check_counts(fmt, plan, res, sum(s.rows for s in snap.shards))
        writer.write_dataset_metadata(staging, source, res)
        summary = {"format": fmt, "source": store.url, "version": snap.version, "env_id": store.env_id,
                   "files": res["files"], "rows": res["rows"], "episodes": res["complete"],
                   "incomplete_episodes": res["episodes"] - res["complete"] if fmt == "parquet" else plan["incomplete"]}
        with fs.open(f"{staging_path}/_export.json", "w") as f:
            json.dump({**summary, "source_metadata": source}, f, indent=1)
        fs.mv(staging_path, out_path, recursive=True)
    except BaseException:
        if fs.exists(staging_path):
            fs.rm(staging_path, recursive=True)
        raise
    return {**summary, "out": out}


def load_rlds(path: str, split: str = "train"):
    """An RLDS export as TFDS loads it: ``tfds.builder_from_directory(path).as_dataset(split=split)``."""
    from core.dataset import rlds
    return rlds.require_tfds().builder_from_directory(str(path)).as_dataset(split=split)
