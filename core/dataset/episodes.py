"""Episode segments per shard, and the global episode table they fold into.

Each shard stores an index of its contiguous episode segments (schema.py:
``episode_id, start, length, first_step, return, end``). An episode may span
shards, so per-shard segments are folded into episodes by sorting on
``(episode_id, first_step)``. An episode is **complete** when its segments
start at step 0, follow each other without gaps
(``first_step' = first_step + length``) and only its last segment ends
(``end != 0``). For a complete episode::

    rows     = sum of segment lengths          (RLDS steps, incl. the final observation)
    length   = rows - 1                        (env steps = transitions)
    return   = sum of segment returns          (float64, segments in step order)

It is attributed to the policy version and actor of its first row.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from core.dataset import shards

SEGMENT_COLUMNS = ("episode_id", "first_step", "length", "return", "end", "policy_version", "actor",
                   "start", "shard")


def shard_segments(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map function: the shard's segments plus its row counts per policy version and actor."""
    r = shards.reader(item)
    seg = r.episodes()
    pv = r.read("policy_version")
    actors = shards.row_actors(r.attrs)
    start = seg["start"].astype(np.int64)
    versions, v_rows = np.unique(pv, return_counts=True)
    actor_ids, a_rows = np.unique(actors, return_counts=True)
    return {
        "index": int(item["index"]), "shard_id": item["shard_id"], "token": item["token"],
        "rows": int(len(pv)),
        "segments": {
            "episode_id": seg["episode_id"].astype(np.int64), "first_step": seg["first_step"].astype(np.int64),
            "length": seg["length"].astype(np.int64), "return": seg["return"].astype(np.float64),
            "end": seg["end"].astype(np.int8), "policy_version": pv[start].astype(np.int64),
            "actor": actors[start], "start": start,
            "shard": np.full(len(start), int(item["index"]), np.int64)},
        "rows_per_version": (versions.astype(np.int64), v_rows.astype(np.int64)),
        "rows_per_actor": (actor_ids.astype(np.int64), a_rows.astype(np.int64)),
    }


def ordered(parts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per-shard results in commit order (engines may deliver them in any order)."""
    return sorted(parts, key=lambda p: p["index"])


def all_segments(parts: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    """Segments of all shards, sorted by ``(episode_id, first_step)``."""
    parts = ordered(parts)
    seg = {c: np.concatenate([p["segments"][c] for p in parts]) for c in SEGMENT_COLUMNS}
    order = np.lexsort((seg["first_step"], seg["episode_id"]))
    return {c: v[order] for c, v in seg.items()}


def episode_table(seg: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """One entry per episode id (see module docstring); ``seg`` from :func:`all_segments`.

    Returns ``episode_id, rows, return, complete, policy_version, actor`` and
    ``first`` / ``count``: the episode's first segment and number of segments in ``seg``.
    """
    n = len(seg["episode_id"])
    if n == 0:
        empty = np.zeros(0, np.int64)
        return {"episode_id": empty, "rows": empty, "return": np.zeros(0), "complete": np.zeros(0, bool),
                "policy_version": empty, "actor": empty, "first": empty, "count": empty}
    ep = seg["episode_id"]
    new = np.ones(n, bool)
    new[1:] = ep[1:] != ep[:-1]
    first = np.flatnonzero(new)
    count = np.diff(np.append(first, n))
    last = first + count - 1
    # Links between consecutive segments of one episode: no gap, and only the last one ends.
    cont_ok = np.ones(n, bool)
    cont_ok[1:] = new[1:] | ((seg["first_step"][1:] == seg["first_step"][:-1] + seg["length"][:-1])
                             & (seg["end"][:-1] == 0))
    links_ok = np.logical_and.reduceat(cont_ok, first)
    complete = links_ok & (seg["first_step"][first] == 0) & (seg["end"][last] != 0)
    return {"episode_id": ep[first], "rows": np.add.reduceat(seg["length"], first),
            "return": np.add.reduceat(seg["return"], first), "complete": complete,
            "policy_version": seg["policy_version"][first], "actor": seg["actor"][first],
            "first": first, "count": count}
