"""Replay store schema: version, on-disk layout, errors and shard metadata.

On-disk layout of a store rooted at ``<root>`` (a local path or fsspec URL)::

    <root>/replay.json                      store marker: format, schema_version, env_id
    <root>/log/00000000000000000001.json    commit log entries (see commit_log.py)
    <root>/log/00000000000000000100.checkpoint.json, _last_checkpoint   log checkpoints
    <root>/shards/<shard_id>/zarr.json      zarr v3 group; attributes below; written LAST
    <root>/shards/<shard_id>/observation/   one zarr v3 array per field, [rows, ...]
    <root>/shards/<shard_id>/action/ reward/ discount/ terminated/ truncated/
                             episode_id/ step/ policy_version/
    <root>/shards/<shard_id>/extras/<name>/ algorithm extras (``extras/<name>`` fields
                                            of a TrajectoryBatch), a zarr subgroup
    <root>/shards/<shard_id>/episodes/      episode-segment index, a zarr subgroup:
        episode_id, start, length, first_step, return, end   (one entry per segment)

Rows are the concatenation of ``TrajectoryBatch.flat_rows()`` of the batches
aggregated into the shard (env-major inside each batch), so each episode
segment is a contiguous run of rows. ``episodes/end`` is 0 when the episode
continues beyond the segment (possibly in another shard), 1 when it ends
terminated, 2 when it ends truncated. ``episodes/return`` is the sum of the
segment's rewards (the episode return when the episode lies in one segment).

Every array uses codecs ``bytes -> zstd -> crc32c`` and is chunked along rows
only, with about ``chunk_bytes`` (default 4 MiB) of raw data per chunk.
Every chunk is stored, even one equal to the fill value (attribute
``every_chunk_stored``), so a chunk that is not stored is lost data, never zeros.
The group ``zarr.json`` is the completion marker of a shard: it is written
after every array, so a shard without it is incomplete and cannot be committed.

Group attributes (``databloom`` key): schema_version, env_id, shard_id, rows,
nbytes (raw bytes of all fields), fields ({name: {dtype, shape}}), actor_ids,
task_ids, seeds, policy_version_min/max, num_episodes_ended, num_segments,
created (unix seconds), token (random, per write attempt), every_chunk_stored
(true) plus user ``attrs``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, Optional

#: Bump on incompatible layout changes; readers refuse stores with a newer one.
SCHEMA_VERSION = 1
STORE_MARKER = "replay.json"
STORE_FORMAT = "databloom.replay"
LOG_DIR = "log"
SHARDS_DIR = "shards"
EPISODES_GROUP = "episodes"
ATTRS_KEY = "databloom"
#: Shard attribute: every chunk of every array is stored, even one equal to the fill value,
#: so a chunk that is not stored is lost data (readers check: ``chunks.py``).
EVERY_CHUNK_ATTR = "every_chunk_stored"

#: Episode-segment end codes stored in ``episodes/end``.
END_CONTINUES, END_TERMINATED, END_TRUNCATED = 0, 1, 2


class ReplayError(RuntimeError):
    """Bad input or unusable store; the message is one line naming what is wrong."""


class ChecksumError(ReplayError):
    """A stored chunk fails its crc32c check (or cannot be decoded).

    Also constructible from a finished message alone (``ChecksumError(message)``):
    Beam re-raises a worker's error as ``type(e)(annotated message)``, and an error
    that cannot be rebuilt that way would reach the CLI as a RuntimeError traceback.
    """

    def __init__(self, shard_id: str, array: Optional[str] = None, chunk: str = "", detail: str = ""):
        self.shard_id, self.array, self.chunk, self.detail = shard_id, array, chunk, detail
        ReplayError.__init__(self, shard_id if array is None else self._message())

    def _message(self) -> str:
        return (f"checksum error in replay shard {self.shard_id!r}, array {self.array!r}, chunk {self.chunk!r}"
                + (f": {self.detail}" if self.detail else "")
                + "; the shard is corrupt (quarantine it with store.quarantine)")

    def __reduce__(self):  # pickled by Dask workers: rebuild from the fields, not from the message
        return type(self), ((self.shard_id, self.array, self.chunk, self.detail) if self.array is not None
                            else self.args)


class MissingChunkError(ChecksumError):
    """A chunk that the array's shape implies is not stored: zarr would read its fill value instead.

    Handled exactly like a checksum error (the replay cache quarantines the shard).
    """

    def _message(self) -> str:
        return (f"missing chunk in replay shard {self.shard_id!r}, array {self.array!r}, chunk {self.chunk!r}"
                " (zarr would read zeros in its place); the shard is damaged (quarantine it with"
                " store.quarantine, or restore the file)")


class LogDamagedError(ReplayError):
    """A commit-log entry is missing (a gap), not valid JSON, or valid JSON of the wrong shape.

    Like ChecksumError, also constructible from a finished message alone (Beam).
    """

    def __init__(self, store_url: str, version: Optional[int] = None, what: str = ""):
        self.store_url, self.version, self.what = store_url, version, what
        if version is None:
            super().__init__(store_url)
            return
        super().__init__(
            f"commit log is damaged at version {version}: {what}; repair: python -m pipelines.process"
            f" repair {store_url} --truncate-after {max(int(version) - 1, 0)} (shows what it removes;"
            " add --yes to apply)")

    def __reduce__(self):
        return type(self), (self.args if self.version is None else (self.store_url, self.version, self.what))


#: Every id a DataBloom writer produces: a lowercase letter and digits, hyphen-joined segments.
#: ``s00000001`` (driver, central, collect: ``stages.shard_id_for``), ``r000003-g0001`` (Beam
#: rounds, ``write_shards(prefix)``), ``c00000012-g0000`` (compact), ``n00000012-g00003``
#: (relabel); filter keeps its source ids. A strict grammar, so that the shards folder is a
#: namespace the store owns: anything else there (a user's ``backup/``, ``notes.txt``) is not
#: a shard, and an id read from the log that is not one (``../../victim``) is damage.
SHARD_ID_RE = re.compile(r"[a-z][0-9]+(?:-[a-z][0-9]+)*")
MAX_SHARD_ID_LEN = 64


def is_shard_id(name: object) -> bool:
    """True if ``name`` is a shard id of the grammar the writers produce (all of it: ``SHARD_ID_RE.fullmatch``)."""
    return isinstance(name, str) and len(name) <= MAX_SHARD_ID_LEN and SHARD_ID_RE.fullmatch(name) is not None


def validate_shard_id(shard_id: str) -> str:
    """``shard_id`` if it is a valid shard id (``is_shard_id``); ReplayError otherwise."""
    if not is_shard_id(shard_id):
        raise ReplayError(f"invalid shard id {shard_id!r}; valid: a lowercase letter and digits,"
                          " hyphen-joined (e.g. 's00000001', 'r000003-g0001'), at most"
                          f" {MAX_SHARD_ID_LEN} characters")
    return shard_id


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """What the commit log records about one shard.

    Attributes:
      id: the deterministic shard id (e.g. ``"r000003-g0001"``).
      rows: number of rows (steps) in the shard.
      nbytes: raw (uncompressed) bytes of all fields.
      token: random token of the write attempt that produced the committed data;
        readers check it so that a late zombie rewrite is detected.
      created: unix time the shard was written.
      policy_version_min, policy_version_max: range of policy versions in the shard.
      num_segments: entries of the episode-segment index.
    """

    id: str
    rows: int
    nbytes: int
    token: str = ""
    created: float = 0.0
    policy_version_min: int = 0
    policy_version_max: int = 0
    num_segments: int = 0

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ShardInfo":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
