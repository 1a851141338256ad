"""Retention (FIFO by commit order, as a log entry) and garbage collection of shard data.

Retention never deletes data: it appends a ``remove`` entry naming the oldest
live shards until at most ``max_transitions`` rows stay live. Snapshots
opened at older versions stay valid until ``gc`` deletes the data, which it
does only ``grace_seconds`` after the removal entry, so a reader that opened
an old snapshot has that long to finish.

``gc`` deletes:

* data of shards removed by retention more than ``grace_seconds`` ago;
* data of shards that were never committed and whose newest file is older
  than ``grace_seconds`` (crashed or abandoned writers). Choose a grace period
  much longer than a write + commit takes: a shard deleted between its
  write and its commit makes that commit fail (cleanly: it is never visible).

Quarantined shards keep their data for inspection.

``gc`` deletes only what the store owns: directories under ``shards/`` whose
names are shard ids (``schema.SHARD_ID_RE``). Ids come from the commit log,
which validates every id it reads, so an id like ``../../victim`` is a
damaged-log error before anything is deleted. Anything else under
``shards/`` (a user's ``backup/`` folder, a stray file, a file named like a
shard) is left alone, with a warning, and listed in ``GCReport.skipped``.

Example::

    store.apply_retention(max_transitions=1_000_000)
    report = store.gc(grace_seconds=3600)   # GCReport(removed=[...], uncommitted=[...])
"""
from __future__ import annotations

import dataclasses
import datetime
import time
import warnings
from typing import Any, Dict, List

from core.replay.commit_log import LogState
from core.replay.schema import ReplayError, SHARDS_DIR, is_shard_id, validate_shard_id


def apply_retention(store, max_transitions: int) -> int:
    """Append a ``remove`` entry for the oldest shards beyond ``max_transitions``; returns the version."""
    if max_transitions < 0:
        raise ReplayError(f"max_transitions={max_transitions} must be >= 0")

    def build(state: LogState):
        total, victims = state.rows, []
        for info in state.live.values():  # commit order: oldest first
            if total <= max_transitions:
                break
            victims.append(info.id)
            total -= info.rows
        if not victims:
            return None
        return {"op": "remove", "shards": victims, "reason": f"retention max_transitions={max_transitions}"}
    return store.log.append(build)


@dataclasses.dataclass
class GCReport:
    removed: List[str] = dataclasses.field(default_factory=list)      # data of retention-removed shards
    uncommitted: List[str] = dataclasses.field(default_factory=list)  # stale uncommitted shards
    skipped: List[str] = dataclasses.field(default_factory=list)      # names under shards/ left alone


def _mtime(info: Dict[str, Any]) -> float:
    """Modification time of an fsspec ``info`` dict across backends (local, memory, gcs, s3)."""
    for key in ("mtime", "created", "updated", "LastModified", "last_modified"):
        value = info.get(key)
        if value is None:
            continue
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, str):
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        return float(value)
    return time.time()  # unknown: treat as fresh, never delete by mistake


def _entries(fs, path: str) -> List[Dict[str, Any]]:
    try:
        return fs.ls(path, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _delete(store, shard_id: str) -> None:
    """Delete one shard's data; the id is re-validated so no path outside ``shards/`` is touched."""
    store.writer.remove(validate_shard_id(shard_id))


def gc(store, grace_seconds: float = 3600.0) -> GCReport:
    """Delete unreferenced shard data older than ``grace_seconds``; returns what was deleted."""
    state, now, report = store.state(), time.time(), GCReport()
    fs, path = store.writer.fs, store.writer.path
    for shard_id, removed_at in state.removed.items():
        if now - removed_at >= grace_seconds and fs.isdir(f"{path}/{shard_id}"):
            _delete(store, shard_id)
            report.removed.append(shard_id)
    for entry in sorted(_entries(fs, path), key=lambda e: e["name"]):
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if name in state.infos:
            continue
        if entry.get("type") != "directory" or not is_shard_id(name):
            kind = "file" if entry.get("type") != "directory" else "directory"
            warnings.warn(f"gc: leaving {kind} {SHARDS_DIR}/{name} of {store.url} alone: not a shard this"
                          " store writes (shard ids look like 's00000001' or 'r000003-g0001')",
                          RuntimeWarning, stacklevel=3)
            report.skipped.append(name)
            continue
        files = fs.find(f"{path}/{name}", detail=True)
        newest = max((_mtime(i) for i in files.values()), default=0.0)
        if now - newest >= grace_seconds and name not in store.state().infos:
            _delete(store, name)
            report.uncommitted.append(name)
    return report
