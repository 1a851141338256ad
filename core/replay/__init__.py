"""Replay storage: zarr v3 shards, an atomic commit log, snapshots, caches and samplers.

One concept per module:

* ``schema``       on-disk layout, schema version, errors, shard-id grammar, ShardInfo
* ``chunks``       chunk completeness: every chunk a zarr array's grid implies must be stored
* ``aggregator``   ShardAggregator: many small task batches -> one shard
* ``shard_writer`` ShardWriter: batches -> one zarr v3 group (tensorstore or zarr-python)
* ``write_engines`` the tensorstore and zarr-python engines a shard is written with, the array layout
* ``shard_reader`` ShardReader: decode arrays; checksum/missing-chunk errors name shard/array/chunk
* ``exclusive``    exclusive create per store kind (os.link, tensorstore generations, a lock)
* ``commit_log``   numbered, exclusively created log entries; optimistic concurrency; gap checks
* ``log_entries``  validation of every entry read (malformed -> "commit log is damaged at version N")
* ``repair``       truncate a damaged log after its last good version (``process repair``)
* ``store``        ReplayStore: open/create, write_shard, commit, snapshot, quarantine
* ``snapshot``     Snapshot: consistent view at a version; dask / xarray access
* ``retention``    FIFO retention (a log entry) and garbage collection
* ``cache``        ReplayCache: committed rows in memory with successor pointers
* ``sumtree``      SumTree for prioritized sampling
* ``samplers``     NStepSampler, PrioritizedNStepSampler, SequenceSampler

Example (what a training loop does)::

    store = ReplayStore.open_or_create("runs/a/replay", env_id="CartPole-v1")
    infos = store.write_shards("r000003", task_batches)          # aggregated shards
    store.commit([i.id for i in infos], meta={"round": 3})       # atomic, idempotent
    cache = ReplayCache(store, max_transitions=100_000)
    cache.refresh()
    batch = NStepSampler(cache, n=3, gamma=0.99).sample(256, np.random.default_rng(0))
"""
from core.replay.aggregator import ShardAggregator
from core.replay.cache import ReplayCache
from core.replay.commit_log import CommitLog, LogState
from core.replay.retention import GCReport
from core.replay.samplers import NStepSampler, PrioritizedNStepSampler, SequenceSampler
from core.replay.schema import (SCHEMA_VERSION, ChecksumError, LogDamagedError, MissingChunkError, ReplayError,
                                ShardInfo)
from core.replay.shard_reader import ShardReader
from core.replay.shard_writer import ShardWriter
from core.replay.snapshot import Snapshot
from core.replay.store import ReplayStore
from core.replay.sumtree import SumTree

__all__ = [
    "ChecksumError", "CommitLog", "GCReport", "LogDamagedError", "LogState", "MissingChunkError", "NStepSampler",
    "PrioritizedNStepSampler",
    "ReplayCache", "ReplayError", "ReplayStore", "SCHEMA_VERSION", "SequenceSampler", "ShardAggregator",
    "ShardInfo", "ShardReader", "ShardWriter", "Snapshot", "SumTree",
]
