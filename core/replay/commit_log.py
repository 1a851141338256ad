"""The commit log: numbered, exclusively created JSON entries that define visibility.

A shard becomes visible only when a log entry naming it exists. Entries are
``<root>/log/<version:020d>.json`` for versions 1, 2, 3, ...; version 0 is the
empty store. Each entry is a *delta*; the state at version ``v`` (live shards
in commit order, removed and quarantined shards) is the fold of entries
``1..v``::

    {"version": 7, "op": "add", "time": 1.7e9, "writer": "host:pid",
     "shards": [{"id": "r000003-g0001", "rows": 1024, "nbytes": ..., "token": ...}],
     "meta": {...}}
    {"version": 8, "op": "remove", "shards": ["r000001-g0000"], "reason": "retention"}
    {"version": 9, "op": "quarantine", "shards": ["r000002-g0003"], "reason": "..."}
    {"version": 10, "op": "replace", "groups": [{"remove": ["a", "b"], "add": [{"id": "c", ...}]}],
     "reason": "compact"}   # core.dataset.replace: swap shards in one entry, in place

Commit protocol (optimistic concurrency, as in Delta Lake): read the state at
the latest version ``v`` (probing ``v+1, v+2, ...`` until one is missing),
build the entry, and *exclusively create* entry ``v+1``. If another committer
created it first, the create fails; re-read the new entries, rebuild (an
``add`` drops ids that are already committed, which makes commits
idempotent) and retry at the next version. One entry holds all shards of a
commit, so a commit is atomic: all of its shards become visible or none.
Entries are never rewritten, so readers need no locks and a snapshot at
version ``v`` never changes.

Log checkpoints (as in Delta Lake): every ``CHECKPOINT_EVERY`` versions the
committer also writes the folded state, ``<version:020d>.checkpoint.json``,
and the hint ``_last_checkpoint``; a reader starts there instead of folding
every entry since version 1 (see ``CommitLog``).

Exclusive create comes from ``exclusive.py`` (os.link on local disk, tensorstore
conditional writes on gs:// and s3://, a lock for memory://), which also says
which stores are safe for concurrent writers.

Why not Icechunk: it gives ACID commits over zarr but its layout is readable
only through icechunk, which would cost the plain-zarr interoperability of
shards. Here shards stay plain zarr v3 groups and the log is a few small JSON
files; the only primitive we rely on is exclusive create, taken from the OS
(link) or from tensorstore's kvstore (generations) rather than hand-written.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

from core import urls
from core.replay.exclusive import TensorstoreCreator, _creator_for  # noqa: F401 - re-exported
from core.replay.log_entries import check_checkpoint, check_entry
from core.replay.schema import LOG_DIR, LogDamagedError, ReplayError, ShardInfo


def entry_name(version: int) -> str:
    return f"{version:020d}.json"


def checkpoint_name(version: int) -> str:
    return f"{version:020d}.checkpoint.json"


def parse_entry_name(name: str) -> Optional[int]:
    """The version of an entry file name (``00000000000000000007.json`` -> 7), else None."""
    stem = name[:-len(".json")] if name.endswith(".json") else ""
    return int(stem) if len(stem) == 20 and stem.isdigit() else None


#: Versions between log checkpoints (see CommitLog).
CHECKPOINT_EVERY = 100
CHECKPOINT_FORMAT = "databloom-log-checkpoint-1"
#: Log checkpoints kept; older ones are deleted (they only speed up reads).
KEEP_CHECKPOINTS = 3
#: Names the latest checkpoint's version; overwritten, so only a hint.
LAST_CHECKPOINT = "_last_checkpoint"


@dataclasses.dataclass
class LogState:
    """The fold of log entries 1..version."""

    version: int = 0
    live: Dict[str, ShardInfo] = dataclasses.field(default_factory=dict)  # commit order
    committed_version: Dict[str, int] = dataclasses.field(default_factory=dict)
    removed: Dict[str, float] = dataclasses.field(default_factory=dict)  # id -> removal time
    quarantined: Dict[str, str] = dataclasses.field(default_factory=dict)  # id -> reason
    infos: Dict[str, ShardInfo] = dataclasses.field(default_factory=dict)  # every id ever added

    def copy(self) -> "LogState":
        return LogState(self.version, dict(self.live), dict(self.committed_version),
                        dict(self.removed), dict(self.quarantined), dict(self.infos))

    def to_json(self) -> Dict[str, Any]:
        """The state as a log checkpoint (``from_json`` restores it exactly, commit order included)."""
        return {"format": CHECKPOINT_FORMAT, "version": self.version, "live": list(self.live),
                "infos": [i.to_json() for i in self.infos.values()],
                "committed_version": self.committed_version, "removed": self.removed,
                "quarantined": self.quarantined}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "LogState":
        if not isinstance(d, dict) or d.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"not a {CHECKPOINT_FORMAT} log checkpoint")
        check_checkpoint(d)  # ids and types, as for entries (ValueError: fold entries instead)
        infos = {i["id"]: ShardInfo.from_json(i) for i in d["infos"]}
        return cls(int(d["version"]), {sid: infos[sid] for sid in d["live"]},
                   {k: int(v) for k, v in d["committed_version"].items()},
                   {k: float(v) for k, v in d["removed"].items()}, dict(d["quarantined"]), infos)

    def apply(self, entry: Dict[str, Any]) -> None:
        op, v = entry["op"], int(entry["version"])
        if v != self.version + 1:
            raise ReplayError(f"commit log entry {v} follows version {self.version}; the log is damaged")
        if op == "add":
            for d in entry["shards"]:
                info = ShardInfo.from_json(d)
                if info.id not in self.infos:
                    self.infos[info.id] = info
                    self.live[info.id] = info
                    self.committed_version[info.id] = v
        elif op == "remove":
            for sid in entry["shards"]:
                if self.live.pop(sid, None) is not None:
                    self.removed[sid] = float(entry.get("time", 0.0))
        elif op == "quarantine":
            for sid in entry["shards"]:
                self.live.pop(sid, None)
                self.quarantined[sid] = str(entry.get("reason", ""))
        elif op == "replace":  # compaction / relabelling (core.dataset.replace): one atomic swap
            self._replace(entry["groups"], v, float(entry.get("time", 0.0)))
        else:
            raise ReplayError(f"commit log entry {v} has unknown op {op!r}; valid: add, remove, quarantine,"
                              " replace")
        self.version = v

    def _replace(self, groups: List[Dict[str, Any]], v: int, now: float) -> None:
        """Each group's ``add`` shards take the commit-order place of its first ``remove`` shard."""
        first = {g["remove"][0]: g for g in groups if g["remove"]}
        gone = {sid for g in groups for sid in g["remove"]}
        live: Dict[str, ShardInfo] = {}

        def add(group: Dict[str, Any]) -> None:
            for d in group["add"]:
                info = ShardInfo.from_json(d)
                if info.id not in self.infos:
                    self.infos[info.id] = live[info.id] = info
                    self.committed_version[info.id] = v
        for sid, info in self.live.items():
            if sid in first:
                add(first.pop(sid))
            if sid in gone:
                self.removed[sid] = now
            else:
                live[sid] = info
        for group in first.values():  # its first shard was no longer live: append
            add(group)
        self.live = live

    @property
    def rows(self) -> int:
        return sum(i.rows for i in self.live.values())


class CommitLog:
    """Reads and appends entries of one store's commit log.

    Every ``CHECKPOINT_EVERY`` versions the committer of that version also
    writes the folded state as a *checkpoint* (``<version>.checkpoint.json``,
    created exclusively like entries) and points ``_last_checkpoint`` at it. A
    reader opening the log starts from the latest checkpoint and reads only the
    entries after it, so opening a store costs O(entries since the checkpoint),
    not O(all entries). Checkpoints are caches: entries stay the truth, and a
    missing or unreadable checkpoint only means reading more entries. Only the
    last ``KEEP_CHECKPOINTS`` are kept, since each holds every shard ever
    committed.

    Damage is an error, never a shorter history (``LogDamagedError``, "commit
    log is damaged at version N"): every entry read is validated
    (``log_entries.py``: a ``{}`` or an id like ``../x`` is damage); the first
    read lists the log folder once and requires versions ``1..latest`` without
    a gap; later reads that find no entry ``v+1`` also probe ``v+2`` (one more
    small read), since a healthy log never has an entry after a missing one
    (entry ``v+2`` can only be created by a committer that read ``v+1``).
    ``python -m pipelines.process repair`` truncates a damaged log.

    Example::

        log = CommitLog("memory://run/replay")
        v = log.append(lambda state: {"op": "add", "shards": [info.to_json()]})
        log.state().live  # {"r000000-g0000": ShardInfo(...)}
    """

    def __init__(self, url: str, use_checkpoints: bool = True):
        self.store_url = url
        self.url = urls.join(url, LOG_DIR)
        self.fs, self.path = urls.resolve(self.url)
        self._creator = _creator_for(url, self.fs, self.path)
        self._base, self._base_state = 0, LogState()  # the checkpoint _state started from
        self._entries: List[Dict[str, Any]] = []       # entries _base+1 .. _state.version
        self._state = LogState()
        self._opened = not use_checkpoints             # False: fold every entry from version 1
        self._listed = False                           # the one full listing (gap check) done
        self._lock = threading.Lock()

    def _read(self, version: int) -> Optional[Dict[str, Any]]:
        try:
            raw = self.fs.cat_file(f"{self.path}/{entry_name(version)}")
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(raw)
        except ValueError:
            raise LogDamagedError(self.store_url, version, "the entry is not valid JSON") from None
        return check_entry(entry, version, self.store_url)

    def listing(self) -> "tuple[List[int], List[int]]":
        """``(entry versions, log checkpoint versions)`` present in the log folder, ascending."""
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.path, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        entries = sorted(v for v in map(parse_entry_name, names) if v is not None)
        checkpoints = sorted(int(n[:20]) for n in names if n.endswith(".checkpoint.json") and n[:20].isdigit())
        return entries, checkpoints

    def _check_contiguous(self) -> None:
        """LogDamagedError at the first missing version below the newest entry or log checkpoint.

        A checkpoint is written after its entry and removed only when older ones
        are pruned, so one newer than every entry means entries were lost.
        """
        versions, checkpoints = self.listing()
        latest = versions[-1] if versions else 0
        if versions and latest != len(versions):  # healthy: exactly 1..latest
            present = set(versions)
            missing = next(v for v in range(1, latest + 1) if v not in present)
            raise LogDamagedError(self.store_url, missing, f"entry {missing} is missing while later"
                                  f" entries exist (up to {latest})")
        if checkpoints and checkpoints[-1] > latest:
            raise LogDamagedError(self.store_url, latest + 1, f"entries {latest + 1}..{checkpoints[-1]} are"
                                  f" missing while log checkpoint {checkpoints[-1]} exists")

    def _gap_after(self, version: int) -> bool:
        """Entry ``version + 1`` was missing: True if it exists after all (a commit raced the read);
        LogDamagedError if a later entry exists without it; False if the log ends at ``version``."""
        if not self.fs.exists(f"{self.path}/{entry_name(version + 2)}"):
            return False
        if self.fs.exists(f"{self.path}/{entry_name(version + 1)}"):
            return True
        raise LogDamagedError(self.store_url, version + 1, f"entry {version + 1} is missing while"
                              f" entry {version + 2} exists")

    def _read_checkpoint(self, version: Optional[int] = None) -> Optional[LogState]:
        """The checkpoint at ``version`` (default: the one ``_last_checkpoint`` names), or None."""
        try:
            if version is None:
                version = int(json.loads(self.fs.cat_file(f"{self.path}/{LAST_CHECKPOINT}"))["version"])
            raw = self.fs.cat_file(f"{self.path}/{checkpoint_name(version)}")
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None                                # a cache: read entries instead
        try:
            return LogState.from_json(json.loads(raw))
        except (ValueError, KeyError, TypeError) as e:
            warnings.warn(f"ignoring log checkpoint {version} of {self.url} ({e}); reading entries instead")
            return None

    def _write_checkpoint(self, state: LogState) -> None:
        """Best effort: a failure only means later readers read more entries."""
        try:
            self._creator.create(checkpoint_name(state.version), json.dumps(state.to_json()).encode())
            urls.write_atomic(self.fs, f"{self.path}/{LAST_CHECKPOINT}",
                              json.dumps({"version": state.version}).encode())
            # Each checkpoint holds every shard ever committed: keep the last KEEP_CHECKPOINTS only
            # (older versions are then read by folding entries).
            old = state.version - KEEP_CHECKPOINTS * CHECKPOINT_EVERY
            if old > 0:
                self.fs.rm_file(f"{self.path}/{checkpoint_name(old)}")
        except FileNotFoundError:
            pass                                        # already pruned by another committer
        except Exception as e:  # noqa: BLE001 - never fail a commit that has already happened
            warnings.warn(f"could not write commit log checkpoint {state.version} of {self.url}: {e}")

    def refresh(self, checkpoint_at: int = 0) -> LogState:
        """Read entries newer than the cached state; returns the latest state.

        ``checkpoint_at``: a version this process just committed; if it is a
        multiple of ``CHECKPOINT_EVERY``, the state at exactly that version is
        written as a checkpoint.
        """
        with self._lock:
            if not self._listed:
                self._check_contiguous()
                self._listed = True
            if not self._opened:
                self._opened = True
                start = self._read_checkpoint()
                if start is not None and self._read(start.version) is not None:  # same log, not a recreated one
                    self._state, self._base, self._base_state = start, start.version, start.copy()
            while True:
                entry = self._read(self._state.version + 1)
                if entry is None:
                    if self._gap_after(self._state.version):
                        continue
                    return self._state
                self._state.apply(entry)
                self._entries.append(entry)
                if checkpoint_at and self._state.version == checkpoint_at and checkpoint_at % CHECKPOINT_EVERY == 0:
                    self._write_checkpoint(self._state.copy())

    def state(self, version: Optional[int] = None) -> LogState:
        """The state at ``version`` (default: latest). Returns a private copy."""
        latest = self.refresh()
        if version is None:
            return latest.copy()
        if not 0 <= version <= latest.version:
            raise ReplayError(f"replay log version {version} does not exist; valid: 0..{latest.version}")
        if version >= self._base:
            state = self._base_state.copy()
            entries = self._entries[:version - self._base]
        else:  # older than where this reader started: from the nearest earlier checkpoint
            c = version // CHECKPOINT_EVERY * CHECKPOINT_EVERY
            state = self._read_checkpoint(c) if c else None
            state = state or LogState()
            entries = [self._read_existing(v) for v in range(state.version + 1, version + 1)]
        for entry in entries:
            state.apply(entry)
        return state

    def _read_existing(self, version: int) -> Dict[str, Any]:
        entry = self._read(version)
        if entry is None:  # below the latest version: every entry must exist
            raise LogDamagedError(self.store_url, version, f"entry {version} is missing")
        return entry

    def entry(self, version: int) -> Dict[str, Any]:
        self.refresh()
        if version > self._base:
            return dict(self._entries[version - self._base - 1])
        entry = self._read(version) if version >= 1 else None
        if entry is None:
            raise ReplayError(f"commit log entry {version} of {self.url} does not exist")
        return entry

    def append(self, build: Callable[[LogState], Optional[Dict[str, Any]]],
               max_attempts: int = 10_000) -> int:
        """Optimistically append the entry ``build(latest_state)``; returns its version.

        ``build`` is called again after every conflict with the newer state; it
        returns None when nothing needs to be written (then the latest version
        is returned).
        """
        for attempt in range(max_attempts):
            state = self.state()
            entry = build(state)
            if entry is None:
                return state.version
            entry = {"version": state.version + 1, "time": time.time(),
                     "writer": f"{socket.gethostname()}:{os.getpid()}", **entry}
            try:  # never write an entry that readers would reject as damage
                check_entry(entry, entry["version"], self.store_url)
            except LogDamagedError as e:
                raise ReplayError(f"refusing to commit a malformed entry to {self.url}: {e.what}") from None
            if self._creator.create(entry_name(entry["version"]), json.dumps(entry).encode()):
                self.refresh(checkpoint_at=entry["version"])
                return entry["version"]
            time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))  # jittered backoff
        raise ReplayError(f"could not commit to {self.url} after {max_attempts} conflicting attempts")
