"""Compact: merge many small shards into fewer large ones, swapped in one atomic log entry.

Plan (in the launcher, from the snapshot's shard list): walk the live shards
in commit order and cut them into groups of consecutive shards whose raw
bytes stay within ``target_bytes`` and whose fields agree; groups of one
shard are left alone. Each group becomes one new shard with the
deterministic id ``c<version:08d>-g<index:04d>`` (a retried task overwrites
its own uncommitted output), holding the group's rows in commit order and
keeping each source batch (actor, task id, seed). Segments of one episode
that were split across the merged shards become one segment.

The swap is one ``replace`` entry (``core.dataset.replace``): readers of the
old snapshot keep reading the old shards, whose data stays until
``store.gc`` deletes it after its grace period.

Example::

    report = compact_store(engine, "runs/a/replay", target_bytes=64 << 20)
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from core.dataset import shards
from core.dataset.replace import infos_from_json, replace_shards

DEFAULT_TARGET_BYTES = 64 << 20


def plan_groups(snap, target_bytes: int) -> List[List[int]]:
    """Indices of ``snap.shards`` per merge group (groups of >= 2 consecutive shards)."""
    groups: List[List[int]] = []
    cur: List[int] = []
    size, fields = 0, None
    for i, s in enumerate(snap.shards):
        f = snap.shard_attrs(s.id)["fields"]
        if cur and (size + s.nbytes > target_bytes or f != fields):
            groups.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += s.nbytes
        fields = f
    groups.append(cur)
    return [g for g in groups if len(g) > 1]


def merge_group(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: read the group's shards, write them as one new shard; returns its ShardInfo."""
    from core.replay import ReplayStore
    batches = []
    for src in item["sources"]:
        rows, attrs = shards.read_rows({**src, "store_url": item["store_url"]})
        batches += shards.to_batches(rows, attrs)
    store = ReplayStore.open(item["store_url"])
    info = store.write_shard(item["new_id"], batches, attrs=shards.batches_attrs(
        batches, op="compact", sources=[s["shard_id"] for s in item["sources"]]))
    return {"index": item["index"], "info": info.to_json()}


def _collect(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r["info"] for r in sorted(results, key=lambda r: r["index"])]


def compact_store(engine, store_url: str, target_bytes: int = DEFAULT_TARGET_BYTES,
                  version: Optional[int] = None) -> Dict[str, Any]:
    """Merge small shards of ``store_url`` (snapshot ``version``, default latest); one log entry."""
    store, snap = shards.open_snapshot(store_url, version)
    shards.check_reachable(engine, store.url)
    groups = plan_groups(snap, target_bytes)
    items = shards.shard_items(store, snap)
    work = [{"store_url": store.url, "index": g, "new_id": f"c{snap.version:08d}-g{g:04d}",
             "sources": [{k: items[i][k] for k in ("shard_id", "token", "index")} for i in group]}
            for g, group in enumerate(groups)]
    report = {"store": store.url, "from_version": snap.version, "shards_before": len(snap.shards),
              "rows": snap.num_rows, "groups": len(groups)}
    if not work:
        return {**report, "version": snap.version, "shards_after": len(snap.shards), "merged": 0}
    infos = infos_from_json(engine.map_reduce("compact", merge_group, work, _collect))
    swaps = [([snap.shards[i].id for i in group], [info]) for group, info in zip(groups, infos)]
    version_after = replace_shards(store, swaps, reason="compact", meta={"from_version": snap.version,
                                                                         "target_bytes": int(target_bytes)})
    after = store.snapshot(version_after)
    return {**report, "version": version_after, "shards_after": len(after.shards),
            "merged": int(np.sum([len(g) for g in groups]))}
