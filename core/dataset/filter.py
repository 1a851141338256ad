"""Filter: copy the complete episodes with return >= X into a new store, in one commit.

Two passes over the source snapshot:

1. ``episodes.shard_segments`` per shard; ``plan`` folds them into episodes
   (an episode may span shards) and lists, per source shard, the ids of the
   selected episodes that have rows there.
2. ``copy_shard`` per shard with selected rows: writes those rows to the new
   store under the *same* shard id (uncommitted, so invisible); per-batch
   actors and task ids are kept.

The launcher then commits every written shard in one log entry, so the new
store goes from empty to complete atomically. Nothing is created when no
episode matches; a failure before the commit removes the new store.

Example::

    result = filter_store(engine, "runs/a/replay", "data/expert", min_return=400)
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional

import numpy as np

from core import urls
from core.dataset import episodes, shards
from core.dataset.errors import DatasetError


def plan(parts: List[Dict[str, Any]], min_return: float) -> Dict[str, Any]:
    """Reduce: selected episode ids per source shard id, and counts."""
    parts = episodes.ordered(parts)
    seg = episodes.all_segments(parts)
    table = episodes.episode_table(seg)
    done = table["complete"]
    chosen = done & (table["return"] >= min_return)
    picked_seg = np.repeat(chosen, table["count"])  # segments are grouped by episode, in table order
    per_shard: Dict[str, List[int]] = {}
    for p in parts:
        sel = picked_seg & (seg["shard"] == p["index"])
        if sel.any():
            per_shard[p["shard_id"]] = sorted({int(e) for e in seg["episode_id"][sel]})
    returns = table["return"][done]
    return {"per_shard": per_shard, "selected": int(chosen.sum()), "complete": int(done.sum()),
            "selected_rows": int(table["rows"][chosen].sum()),
            "max_return": float(returns.max()) if len(returns) else None,
            "min_return": float(returns.min()) if len(returns) else None}


def copy_shard(item: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Map: write the rows of ``item["episode_ids"]`` to ``item["out_url"]``; returns the ShardInfo."""
    from core.replay import ReplayStore
    rows, attrs = shards.read_rows(item)
    keep = np.isin(rows["episode_id"], np.asarray(item["episode_ids"], np.int64))
    batches = shards.to_batches(rows, attrs, keep)
    if not batches:
        return None
    out = ReplayStore.open(item["out_url"])
    info = out.write_shard(item["shard_id"], batches, attrs=shards.batches_attrs(
        batches, source=item["store_url"], source_shard=item["shard_id"]))
    return {"index": item["index"], "info": info.to_json()}


def _collect(results: List[Optional[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    return [r["info"] for r in sorted((r for r in results if r), key=lambda r: r["index"])]


def filter_store(engine, store_url: str, out_url: str, min_return: float,
                 version: Optional[int] = None) -> Dict[str, Any]:
    """Copy complete episodes with return >= ``min_return`` from ``store_url`` into new ``out_url``."""
    from core.replay import ReplayStore
    store, snap = shards.open_snapshot(store_url, version)
    out_url = urls.normalize(out_url)
    shards.check_reachable(engine, store.url, out_url)
    if out_url == store.url:
        raise DatasetError(f"--out {out_url} is the source store; valid: a new, absent or empty folder")
    fs, path = urls.resolve(out_url)
    if fs.exists(path) and fs.ls(path, detail=False):
        raise DatasetError(f"--out {out_url} already exists and is not empty; valid: a new, absent or empty folder")
    items = shards.shard_items(store, snap)
    p = engine.map_reduce("filter-plan", episodes.shard_segments, items,
                          functools.partial(plan, min_return=float(min_return)))
    if not p["selected"]:
        rng = "no complete episodes" if p["complete"] == 0 else \
            f"{p['complete']} complete episodes, returns {p['min_return']:g}..{p['max_return']:g}"
        raise DatasetError(f"no episode of {store.url} has return >= {min_return:g} ({rng}); nothing written;"
                           " valid: a threshold at or below the largest return")
    created = not fs.exists(path)
    try:
        out = ReplayStore.open_or_create(out_url, env_id=store.env_id)
        work = [{**i, "out_url": out.url, "episode_ids": p["per_shard"][i["shard_id"]]}
                for i in items if i["shard_id"] in p["per_shard"]]
        infos = engine.map_reduce("filter-copy", copy_shard, work, _collect)
        new_version = out.commit([d["id"] for d in infos], meta={
            "op": "filter", "source": store.url, "source_version": snap.version, "min_return": float(min_return)})
    except BaseException:
        if created and fs.exists(path):
            fs.rm(path, recursive=True)
        raise
    return {"source": store.url, "source_version": snap.version, "out": out.url, "out_version": new_version,
            "episodes": p["selected"], "of_complete": p["complete"], "rows": p["selected_rows"],
            "shards": len(infos)}
