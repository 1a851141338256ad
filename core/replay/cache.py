"""ReplayCache: committed shards in memory, in a FIFO ring, with successor pointers.

The learner samples from memory, not from storage. ``refresh()`` reads the
commit log (one small read when nothing is new), loads the rows of newly
committed shards into a ring buffer of ``capacity`` rows (the oldest rows are
overwritten first: FIFO by commit order) and drops the rows of shards that
were quarantined or removed by retention since the last refresh.

Successor pointers make n-step and sequence sampling a few numpy gathers.
``next[s]`` is the slot of the row ``(episode_id, step + 1)`` that follows the
row in slot ``s``, or -1 if it is not in the cache (yet) or ``s`` is the
last row of its episode. Inside a shard an episode segment is contiguous, so
``next[s] = s + 1`` there; only segment tails (a few per env and batch) are
linked across shards, through a dict of segment heads, and are re-resolved at
every refresh (episodes may span shards and shards may commit out of order).

Rows are identified by a global ``row id`` (insertion counter); ``slot = row_id
% capacity``. Samplers return row ids, so a priority update for a row that
was overwritten meanwhile is recognised as stale and ignored.

Example::

    cache = ReplayCache(store, max_transitions=100_000)
    cache.refresh()        # -> number of rows loaded
    cache.size             # live rows
"""
from __future__ import annotations

import itertools
import logging
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from core.replay.schema import ReplayError, ShardInfo
from core.replay.shard_reader import ShardReader

log = logging.getLogger(__name__)

#: Fields every sampler needs, loaded whatever ``fields`` says.
REQUIRED_FIELDS = ("observation", "action", "reward", "discount", "terminated", "truncated",
                   "episode_id", "step", "policy_version")


class ReplayCache:
    """In-memory FIFO cache of committed shards for samplers (not thread-safe).

    Args:
      store: a ReplayStore.
      max_transitions: capacity in rows.
      max_bytes: optional bound on the memory of the row arrays; the capacity
        becomes ``min(max_transitions, max_bytes // bytes_per_row)``.
      fields: extra fields to load besides ``REQUIRED_FIELDS`` (default: all).
      quarantine_on_error: on a checksum error or a missing chunk (every shard is
        verified before loading: ``ShardReader.verify``), or a shard whose data is
        gone or rewritten, quarantine the shard (a log entry), warn and continue;
        if False, raise.
    """

    def __init__(self, store, max_transitions: int = 100_000, max_bytes: Optional[int] = None,
                 fields: Optional[Sequence[str]] = None, quarantine_on_error: bool = True):
        if max_transitions <= 0:
            raise ReplayError(f"max_transitions={max_transitions} must be positive (e.g. 100_000)")
        self.store, self.max_transitions, self.max_bytes = store, int(max_transitions), max_bytes
        self.wanted_fields = None if fields is None else list(dict.fromkeys([*REQUIRED_FIELDS, *fields]))
        self.quarantine_on_error = quarantine_on_error
        self.capacity = 0
        self.data: Dict[str, np.ndarray] = {}
        self.version = -1
        self.generation = 0        # bumped whenever rows or links change
        self.inserted = 0          # rows ever inserted = next row id
        self.skipped: Dict[str, str] = {}  # shard id -> why it was not loaded
        self._shards: Dict[str, Tuple[int, int]] = {}  # shard id -> [first, end) row ids, while cached
        self._seen: set = set()                         # every shard id ever loaded or skipped
        self._heads: Dict[Tuple[int, int], int] = {}   # (episode_id, step) -> row id of a segment head
        self._tails: List[int] = []                    # row ids of non-last segment tails

    # -- public --------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return int(np.count_nonzero(self.alive)) if self.capacity else 0

    @property
    def pending_links(self) -> Dict[str, int]:
        """Cross-shard link bookkeeping held until the other side arrives: ``heads`` (segment heads
        waiting for a tail) and ``tails`` (non-last segment tails waiting for a head). Bounded by eviction."""
        return {"heads": len(self._heads), "tails": len(self._tails)}

    @property
    def field_names(self) -> List[str]:
        return list(self.data)

    def slots(self, row_ids: np.ndarray) -> np.ndarray:
        return np.asarray(row_ids, np.int64) % max(self.capacity, 1)

    def is_current(self, row_ids: np.ndarray) -> np.ndarray:
        """True where ``row_ids`` are still in the cache (not overwritten or dropped)."""
        row_ids = np.asarray(row_ids, np.int64)
        s = self.slots(row_ids)
        return (self.row_id[s] == row_ids) & self.alive[s]

    def refresh(self) -> int:
        """Load newly committed shards and drop dropped ones; returns the number of rows loaded."""
        state = self.store.log.state()
        if state.version == self.version:
            return 0
        changed = self._drop_not_live(state.live)
        new = [i for sid, i in state.live.items() if sid not in self._seen]
        self._seen.update(i.id for i in new)
        loaded, fitting = 0, self._newest_fitting(new)
        for info in new[:len(new) - len(fitting)]:  # never load them later, out of FIFO order
            self.skipped[info.id] = "committed too far back to fit in the cache"
        for info in fitting:
            rows = self._load(info)
            if rows is not None:
                self._insert(info.id, rows)
                loaded += len(rows["reward"])
        if loaded or changed:
            self._relink()
            self.generation += 1
        self.version = state.version
        return loaded

    # -- loading -----------------------------------------------------------------------------
    def _newest_fitting(self, new: List[ShardInfo]) -> List[ShardInfo]:
        """Skip new shards that would be evicted at once (backlog larger than the capacity)."""
        keep, rows = [], 0
        limit = self.capacity or self.max_transitions
        if not self.capacity and self.max_bytes is not None and new:  # estimate from the log's ShardInfo
            limit = min(limit, int(self.max_bytes) // max(1, new[-1].nbytes // max(new[-1].rows, 1)))
        for info in reversed(new):
            if rows >= limit:
                break
            keep.append(info)
            rows += info.rows
        return keep[::-1]

    def _load(self, info: ShardInfo) -> Optional[Dict[str, np.ndarray]]:
        try:
            reader = ShardReader(self.store.shards_url, info.id, expected_token=info.token).verify()
            names = self.wanted_fields or (list(self.data) if self.data else reader.field_names)
            missing = [n for n in names if n not in reader.field_names]
            if missing:
                raise ReplayError(f"shard {info.id!r} lacks fields {missing} that the cache holds")
            return reader.read_all(names)
        except ReplayError as e:
            if not self.quarantine_on_error:
                raise
            warnings.warn(f"skipping replay shard {info.id!r}: {e}", RuntimeWarning, stacklevel=3)
            self.skipped[info.id] = str(e)
            try:
                self.store.quarantine(info.id, str(e))
            except ReplayError as q:  # e.g. already removed meanwhile
                log.warning("could not quarantine %s: %s", info.id, q)
            return None

    def _allocate(self, rows: Dict[str, np.ndarray]) -> None:
        row_bytes = sum(v.itemsize * int(np.prod(v.shape[1:], dtype=np.int64)) for v in rows.values())
        cap = self.max_transitions
        if self.max_bytes is not None:
            cap = max(1, min(cap, int(self.max_bytes) // max(row_bytes, 1)))
        self.capacity = cap
        self.data = {n: np.zeros((cap, *v.shape[1:]), v.dtype) for n, v in rows.items()}
        self.row_id = np.full(cap, -1, np.int64)
        self.alive = np.zeros(cap, bool)
        self.last = np.zeros(cap, bool)
        self.next = np.full(cap, -1, np.int64)

    def _insert(self, shard_id: str, rows: Dict[str, np.ndarray]) -> None:
        if not self.capacity:
            self._allocate(rows)
        n_all = len(rows["reward"])
        rows = {k: v[-self.capacity:] for k, v in rows.items()}  # a shard larger than the cache
        n = len(rows["reward"])
        first = self.inserted + (n_all - n)
        ids = np.arange(first, first + n, dtype=np.int64)
        slots = ids % self.capacity
        for name, arr in self.data.items():
            arr[slots] = rows[name]
        ep, step = rows["episode_id"], rows["step"]
        last = rows["terminated"] | rows["truncated"]
        self.row_id[slots], self.alive[slots], self.last[slots] = ids, True, last
        # In-shard successor: the next row continues the same episode segment.
        cont = np.zeros(n, bool)
        cont[:-1] = (ep[1:] == ep[:-1]) & (step[1:] == step[:-1] + 1) & ~last[:-1]
        self.next[slots] = np.where(cont, np.roll(slots, -1), -1)
        head = np.ones(n, bool)
        head[1:] = ~cont[:-1]
        for i in np.flatnonzero(head):
            self._heads[(int(ep[i]), int(step[i]))] = int(ids[i])
        self._tails.extend(int(ids[i]) for i in np.flatnonzero(~cont & ~last))
        self._shards[shard_id] = (first, first + n)
        self.inserted = first + n

    # -- links ---------------------------------------------------------------------------------
    def _drop_not_live(self, live: Dict[str, ShardInfo]) -> bool:
        changed = False
        for sid, (lo, hi) in list(self._shards.items()):
            if sid in live:
                continue
            ids = np.arange(max(lo, self.inserted - self.capacity), hi, dtype=np.int64)
            s = self.slots(ids)
            self.alive[s[self.row_id[s] == ids]] = False
            del self._shards[sid]
            changed = True
        return changed

    def _relink(self) -> None:
        """Re-resolve cross-shard links of segment tails; prune stale heads, tails, shards.

        Vectorized: heads and tails grow with the cache (thousands at 100k rows), and a
        per-entry Python check cost ~1 us each at every refresh, on the learner's path.
        """
        cap = self.capacity
        if self._heads:
            heads = np.fromiter(self._heads.values(), np.int64, len(self._heads))
            keep = self.is_current(heads)
            if not keep.all():
                self._heads = dict(itertools.compress(self._heads.items(), keep.tolist()))
        tails = np.asarray(self._tails, np.int64)
        tails = tails[self.is_current(tails)]
        self._tails = tails.tolist()
        oldest = self.inserted - cap
        self._shards = {k: v for k, v in self._shards.items() if v[1] > oldest}
        if len(tails):
            slots = tails % cap
            keys = zip(self.data["episode_id"][slots].tolist(), (self.data["step"][slots] + 1).tolist())
            get = self._heads.get
            target = np.fromiter((get(k, -1) for k in keys), np.int64, len(tails))
            self.next[slots] = np.where(target >= 0, target % cap, -1)
        # In-shard links into dropped rows (a dropped shard's own rows) are cut too.
        bad = (self.next >= 0) & ~self.alive[np.maximum(self.next, 0)]
        self.next[bad] = -1
