"""Snapshot: a consistent, read-only view of a store at one commit-log version.

A snapshot lists exactly the shards live at its version (committed, not
removed, not quarantined), in commit order; uncommitted shards are never
read. Field data is exposed lazily as one dask array over all shards
(``field``), or as an xarray Dataset (``to_xarray``, needs xarray). Decoded
per-shard arrays are kept in an LRU cache bounded by ``cache_bytes``.

Example::

    snap = store.snapshot()            # or store.snapshot(version=12)
    [s.id for s in snap.shards]
    obs = snap.field("observation")    # dask array [snap.num_rows, 4]
    obs[:1000].mean(axis=0).compute()
"""
from __future__ import annotations

import collections
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from core.replay.commit_log import LogState
from core.replay.schema import ReplayError, ShardInfo
from core.replay.shard_reader import ShardReader, read_shard_attrs


class ByteLRU:
    """A thread-safe LRU mapping bounded by the total ``nbytes`` of its numpy values."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.nbytes = int(max_bytes), 0
        self._items: "collections.OrderedDict[Tuple, np.ndarray]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key) -> Optional[np.ndarray]:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key, value: np.ndarray) -> None:
        if value.nbytes > self.max_bytes:
            return  # larger than the whole cache: do not evict everything for it
        with self._lock:
            if key in self._items:
                return
            self._items[key] = value
            self.nbytes += value.nbytes
            while self.nbytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self.nbytes -= old.nbytes


class _ShardField:
    """Array-like (shape, dtype, __getitem__) over one field of one shard, for dask.

    Picklable, so dask arrays built from a snapshot also compute on a
    distributed cluster: in this process reads go through the snapshot's
    bounded cache; a pickled copy (on a worker) drops the snapshot and reads
    the shard directly, still checking the committed token.
    """

    def __init__(self, snap: "Snapshot", shard_id: str, name: str, shape, dtype, token: str):
        self.snap, self.shard_id, self.name, self.token = snap, shard_id, name, token
        self.shards_url = snap.store.shards_url
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)

    def __getstate__(self):
        return {**self.__dict__, "snap": None}

    def __getitem__(self, key):
        if self.snap is not None:
            return self.snap.read(self.shard_id, self.name)[key]
        return ShardReader(self.shards_url, self.shard_id, expected_token=self.token).read(self.name)[key]


class Snapshot:
    """Read-only view of ``store`` at ``state.version``. Create with ``store.snapshot()``."""

    def __init__(self, store, state: LogState, cache_bytes: int = 256 << 20):
        self.store, self.version = store, state.version
        self.shards: List[ShardInfo] = list(state.live.values())
        self.quarantined: Dict[str, str] = dict(state.quarantined)
        self.cache = ByteLRU(cache_bytes)
        self._attrs: Dict[str, dict] = {}

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    def shard_attrs(self, shard_id: str) -> dict:
        """The shard's group attributes (schema.py lists them)."""
        if shard_id not in self._attrs:
            attrs = read_shard_attrs(self.store.shards_url, shard_id)
            if attrs is None:
                raise ReplayError(f"committed shard {shard_id!r} has no data (deleted by gc?)")
            self._attrs[shard_id] = attrs
        return self._attrs[shard_id]

    def reader(self, shard_id: str) -> ShardReader:
        info = {s.id: s for s in self.shards}.get(shard_id)
        if info is None:
            raise ReplayError(f"shard {shard_id!r} is not live at version {self.version};"
                              f" valid: {len(self.shards)} shards listed in snapshot.shards")
        return ShardReader(self.store.shards_url, shard_id, expected_token=info.token)

    def read(self, shard_id: str, name: str) -> np.ndarray:
        """One field of one shard, decoded (cached, bounded by ``cache_bytes``)."""
        key = (shard_id, name)
        value = self.cache.get(key)
        if value is None:
            value = self.reader(shard_id).read(name)
            self.cache.put(key, value)
        return value

    def read_shard(self, shard_id: str, names: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
        """All fields (or ``names``) of one shard as numpy arrays (not cached)."""
        return self.reader(shard_id).read_all(names)

    def field_names(self) -> List[str]:
        return list(self.shard_attrs(self.shards[0].id)["fields"]) if self.shards else []

    def field(self, name: str):
        """Lazy dask array of ``name`` over all shards of the snapshot, rows in commit order."""
        import dask.array as da
        if not self.shards:
            raise ReplayError(f"snapshot at version {self.version} has no shards")
        parts = []
        for s in self.shards:
            spec = self.shard_attrs(s.id)["fields"].get(name)
            if spec is None:
                raise ReplayError(f"shard {s.id!r} has no field {name!r}; valid: "
                                  + ", ".join(self.shard_attrs(s.id)["fields"]))
            shape = (s.rows, *spec["shape"])
            arr = _ShardField(self, s.id, name, shape, spec["dtype"], s.token)
            parts.append(da.from_array(arr, chunks=shape, name=f"replay-{s.id}-{s.token}-{name}",
                                       meta=np.empty((0,) * len(shape), spec["dtype"])))
        return da.concatenate(parts, axis=0)

    def to_xarray(self, names: Optional[Sequence[str]] = None):
        """An xarray Dataset (dimension ``row``) of lazy fields; requires ``xarray``."""
        try:
            import xarray as xr
        except ImportError:
            raise ReplayError("Snapshot.to_xarray needs xarray; install databloom[xarray]") from None
        data = {}
        for name in names or self.field_names():
            arr = self.field(name)
            dims = ("row",) + tuple(f"{name.replace('/', '.')}_dim{i}" for i in range(1, arr.ndim))
            data[name.replace("/", ".")] = (dims, arr)
        return xr.Dataset(data, attrs={"version": self.version, "env_id": self.store.env_id})
