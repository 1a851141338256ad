"""The atomic "replace" commit: swap groups of live shards for new ones in one log entry.

Compaction and relabelling write new shards (invisible until committed), then
publish them with one ``replace`` entry (``core.replay.commit_log``)::

    {"op": "replace", "groups": [{"remove": [old ids], "add": [new ShardInfos]}], "reason": ...}

Readers at the new version see the new shards, each group in the commit-order
place of its first removed shard (so FIFO retention keeps its meaning);
readers of an older snapshot keep reading the old shards, whose data stays
until ``store.gc`` deletes it after its grace period. The entry is built
against the latest state: if another writer removed or quarantined one of
the old shards meanwhile, the swap is refused (DatasetError) instead of
resurrecting data. A retry after a successful commit finds every new shard
committed and writes nothing (idempotent).

Example::

    version = replace_shards(store, [(["s1", "s2"], [info_c])], reason="compact")
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from core.dataset.errors import DatasetError
from core.replay import ShardInfo


def replace_shards(store, groups: Sequence[Tuple[Sequence[str], Sequence[ShardInfo]]], reason: str,
                   meta: Dict[str, Any] | None = None) -> int:
    """Append one ``replace`` entry; returns the version that holds the new shards."""
    groups = [(list(old), list(new)) for old, new in groups if old or new]

    def build(state) -> Dict[str, Any] | None:
        if all(i.id in state.infos for _, new in groups for i in new):
            return None  # retried after it committed
        gone = [sid for old, _ in groups for sid in old if sid not in state.live]
        if gone:
            raise DatasetError(f"cannot replace shards {gone[:3]} of {store.url}: no longer live (removed or"
                               " quarantined meanwhile); rerun on the new version")
        return {"op": "replace", "reason": reason, "meta": meta or {},
                "groups": [{"remove": old, "add": [i.to_json() for i in new]} for old, new in groups]}
    return store.log.append(build)


def infos_from_json(items: List[Dict[str, Any]]) -> List[ShardInfo]:
    return [ShardInfo.from_json(d) for d in items]
