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
The group ``zarr.json`` is the completion marker of a shard: it is written
after every array, so a shard without it is incomplete and cannot be committed.

Group attributes (``databloom`` key): schema_version, env_id, shard_id, rows,
nbytes (raw bytes of all fields), fields ({name: {dtype, shape}}), actor_ids,
task_ids, seeds, policy_version_min/max, num_episodes_ended, num_segments,
created (unix seconds), token (random, per write attempt) plus user ``attrs``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict

#: Bump on incompatible layout changes; readers refuse stores with a newer one.
SCHEMA_VERSION = 1
STORE_MARKER = "replay.json"
STORE_FORMAT = "databloom.replay"
LOG_DIR = "log"
SHARDS_DIR = "shards"
EPISODES_GROUP = "episodes"
ATTRS_KEY = "databloom"

#: Episode-segment end codes stored in ``episodes/end``.
END_CONTINUES, END_TERMINATED, END_TRUNCATED = 0, 1, 2


class ReplayError(RuntimeError):
    """Bad input or unusable store; the message is one line naming what is wrong."""


class ChecksumError(ReplayError):
    """A stored chunk fails its crc32c check (or cannot be decoded)."""

    def __init__(self, shard_id: str, array: str, chunk: str, detail: str = ""):
        self.shard_id, self.array, self.chunk = shard_id, array, chunk
        super().__init__(
            f"checksum error in replay shard {shard_id!r}, array {array!r}, chunk {chunk!r}"
            + (f": {detail}" if detail else "")
            + "; the shard is corrupt (quarantine it with store.quarantine)")


def validate_shard_id(shard_id: str) -> str:
    """Shard ids are path components: letters, digits, '-', '_', '.'."""
    ok = shard_id and all(c.isalnum() or c in "-_." for c in shard_id) and shard_id[0] != "."
    if not ok:
        raise ReplayError(f"invalid shard id {shard_id!r}; valid: letters, digits, '-', '_', '.'"
                          " (e.g. 'r000003-g0001')")
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
