"""The episodes a shard owns, read whole inside an export write task (both formats share it).

An episode is owned by the shard it starts in (``core.dataset.export``'s plan
lists each owning shard's episodes with their pieces, ``[shard_id, token,
start, length]`` in step order). :func:`owned_episodes` reads them, rows plus
the RLDS step flags (:func:`step_flags`)::

    is_first    = step == 0
    is_last     = terminated or truncated     (the row holds the final observation)
    is_terminal = terminated

Example (in ``rlds.write_shard`` / ``parquet.write_shard``)::

    for ep, rows in owned_episodes(item):      # item: the export plan's work item of one shard
        ep["episode_id"], rows["is_first"]
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import numpy as np

from core.dataset import shards


def step_flags(rows: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    return {"is_first": rows["step"] == 0, "is_last": rows["terminated"] | rows["truncated"],
            "is_terminal": rows["terminated"].copy()}


def owned_episodes(item: Dict[str, Any]) -> Iterator[Tuple[Dict[str, Any], Dict[str, np.ndarray]]]:
    """``(episode, rows + step flags)`` for each episode the item's shard owns, in plan order.

    The owning shard is read once, whole; segments in later shards are read
    by slice (an episode continues into at most a few rows of the next shards).
    """
    own, _ = shards.read_rows(item)
    readers: Dict[str, Any] = {}
    for ep in item["episodes"]:
        parts = []
        for shard_id, token, start, length in ep["pieces"]:
            if shard_id == item["shard_id"]:
                parts.append({n: v[start:start + length] for n, v in own.items()})
                continue
            if shard_id not in readers:
                readers[shard_id] = shards.reader({"store_url": item["store_url"], "shard_id": shard_id,
                                                   "token": token})
            r = readers[shard_id]
            parts.append({n: r.read(n, slice(start, start + length)) for n in r.field_names})
        rows = {k: np.concatenate([p[k] for p in parts]) if len(parts) > 1 else parts[0][k] for k in parts[0]}
        rows.update(step_flags(rows))
        yield ep, rows
