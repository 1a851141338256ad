"""ReplayStore: the replay store's front door (create/open, write, commit, read).

A store is a folder (local path or fsspec URL) holding shards, a commit log
and a marker file; see ``schema.py`` for the layout and ``commit_log.py`` for
the commit protocol and which stores are safe for concurrent writers.

Example (one round of a training run)::

    store = ReplayStore.open_or_create("runs/a/replay", env_id="CartPole-v1")
    infos = store.write_shards("r000003", batches, target_bytes=4 << 20)   # aggregated
    version = store.commit([i.id for i in infos], meta={"round": 3})
    snap = store.snapshot()              # committed shards only
    snap.field("reward").sum().compute()
    store.apply_retention(max_transitions=1_000_000)
    store.gc(grace_seconds=3600)
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence

from core import urls
from core.trajectory import TrajectoryBatch
from core.replay.aggregator import ShardAggregator
from core.replay.commit_log import CommitLog, LogState
from core.replay.exclusive import _creator_for
from core.replay.schema import (SCHEMA_VERSION, SHARDS_DIR, STORE_FORMAT, STORE_MARKER,
                                ReplayError, ShardInfo, validate_shard_id)
from core.replay.shard_reader import read_shard_info
from core.replay.shard_writer import ShardWriter


def _read_marker(url: str) -> Optional[Dict[str, Any]]:
    fs, path = urls.resolve(url)
    try:
        raw = fs.cat_file(f"{path}/{STORE_MARKER}")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        marker = json.loads(raw)
    except ValueError:
        marker = None
    if not isinstance(marker, dict) or marker.get("format") != STORE_FORMAT:
        raise ReplayError(f"{url}/{STORE_MARKER} is not a DataBloom replay store marker")
    return marker


class ReplayStore:
    """A replay store rooted at ``url``. Use ``open`` or ``open_or_create``.

    Writer options (``chunk_bytes``, ``zstd_level``, ``engine``, ``threads``)
    are passed to ``ShardWriter``.
    """

    def __init__(self, url: str, marker: Dict[str, Any], **writer_options: Any):
        self.url = urls.normalize(url)
        self.env_id: str = marker.get("env_id", "")
        self.schema_version: int = int(marker["schema_version"])
        self.shards_url = urls.join(self.url, SHARDS_DIR)
        self.log = CommitLog(self.url)
        self.writer = ShardWriter(self.shards_url, env_id=self.env_id, **writer_options)

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, **writer_options: Any) -> "ReplayStore":
        """Open an existing store and read its commit log; never deletes.

        One-line ReplayError if ``url`` is not a store, or LogDamagedError if its
        commit log is damaged (``python -m pipelines.process repair`` fixes that).
        """
        store = cls.open_unchecked(url, **writer_options)
        store.log.refresh()
        return store

    @classmethod
    def open_unchecked(cls, url: str, **writer_options: Any) -> "ReplayStore":
        """Open a store without reading its commit log (for ``repair``, which must open damaged ones)."""
        url = urls.normalize(url)
        marker = _read_marker(url)
        if marker is None:
            raise ReplayError(f"{url} is not a DataBloom replay store (no {STORE_MARKER}); valid: a folder"
                              " created by ReplayStore.open_or_create(url, env_id=...)")
        version = int(marker.get("schema_version", 0))
        if version > SCHEMA_VERSION:
            raise ReplayError(f"replay store {url} has schema version {version}, newer than this DataBloom"
                              f" reads (<= {SCHEMA_VERSION}); upgrade DataBloom to read it")
        return cls(url, marker, **writer_options)

    @classmethod
    def open_or_create(cls, url: str, env_id: str = "", **writer_options: Any) -> "ReplayStore":
        """Open the store at ``url``, creating it (empty, version 0) if the folder is absent or empty."""
        url = urls.normalize(url)
        marker = _read_marker(url)
        if marker is None:
            fs, path = urls.resolve(url)
            if fs.exists(path) and fs.ls(path, detail=False):
                raise ReplayError(f"{url} exists, is not empty and is not a DataBloom replay store;"
                                  " valid: an empty or absent folder, or an existing store")
            fs.makedirs(path, exist_ok=True)
            marker = {"format": STORE_FORMAT, "schema_version": SCHEMA_VERSION, "env_id": env_id}
            _creator_for(url, fs, path).create(STORE_MARKER, json.dumps(marker).encode())
        store = cls.open(url, **writer_options)
        if env_id and store.env_id and env_id != store.env_id:
            raise ReplayError(f"replay store {url} holds env {store.env_id!r}, not {env_id!r};"
                              " valid: the same env id, or a new store folder")
        return store

    # -- writing -----------------------------------------------------------------------------
    def write_shard(self, shard_id: str, batches: Sequence[TrajectoryBatch],
                    attrs: Optional[Dict[str, Any]] = None) -> ShardInfo:
        """Write an uncommitted shard; a retry overwrites its own uncommitted attempt.

        If ``shard_id`` is already committed (a task retried after its commit),
        nothing is written and the committed ShardInfo is returned.
        """
        validate_shard_id(shard_id)
        state = self.log.state()
        if shard_id in state.infos:
            return state.infos[shard_id]
        return self.writer.write(shard_id, batches, attrs)

    def write_shards(self, prefix: str, batches: Sequence[TrajectoryBatch], target_bytes: int = 4 << 20,
                     attrs: Optional[Dict[str, Any]] = None) -> List[ShardInfo]:
        """Aggregate ``batches`` into shards of about ``target_bytes``, ids ``<prefix>-g0000, ...``."""
        agg = ShardAggregator(target_bytes)
        groups = [g for b in batches for g in agg.add(b)] + agg.flush()
        return [self.write_shard(f"{prefix}-g{i:04d}", g, attrs) for i, g in enumerate(groups)]

    def commit(self, shard_ids: Sequence[str], meta: Optional[Dict[str, Any]] = None) -> int:
        """Make shards visible in one log entry: all or none. Idempotent; retries on conflict.

        Returns the version that contains the shards (the latest version if all
        of them were already committed).
        """
        ids = list(dict.fromkeys(validate_shard_id(s) for s in shard_ids))
        known = self.log.state().infos
        infos = [known.get(s) or read_shard_info(self.shards_url, s) for s in ids]

        def build(state: LogState):
            new = [i.to_json() for i in infos if i.id not in state.infos]
            return {"op": "add", "shards": new, "meta": meta or {}} if new else None
        return self.log.append(build)

    def quarantine(self, shard_id: str, reason: str) -> int:
        """Hide a committed shard from snapshots and caches (a log entry); returns the version."""
        if shard_id not in self.log.state().infos:
            raise ReplayError(f"cannot quarantine {shard_id!r}: it was never committed to {self.url}")

        def build(state: LogState):
            if shard_id in state.quarantined or shard_id not in state.live:
                return None
            return {"op": "quarantine", "shards": [shard_id], "reason": str(reason)}
        return self.log.append(build)

    # -- reading ------------------------------------------------------------------------------
    def latest_version(self) -> int:
        return self.log.refresh().version

    def state(self, version: Optional[int] = None) -> LogState:
        return self.log.state(version)

    def snapshot(self, version: Optional[int] = None, cache_bytes: int = 256 << 20):
        """A consistent read-only view at ``version`` (default: latest). See ``Snapshot``."""
        from core.replay.snapshot import Snapshot
        return Snapshot(self, self.log.state(version), cache_bytes=cache_bytes)

    # -- retention ------------------------------------------------------------------------------
    def apply_retention(self, max_transitions: int) -> int:
        """Remove the oldest committed shards (FIFO) beyond ``max_transitions``; a log entry."""
        from core.replay.retention import apply_retention
        return apply_retention(self, max_transitions)

    def gc(self, grace_seconds: float = 3600.0):
        """Delete data of removed shards and of stale uncommitted shards. See retention.gc."""
        from core.replay.retention import gc
        return gc(self, grace_seconds)

    def __repr__(self) -> str:
        return f"ReplayStore({self.url!r}, env_id={self.env_id!r}, version={self.latest_version()})"
