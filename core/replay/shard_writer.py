"""Shard writer: trajectory batches -> one zarr v3 group with one array per field.

The layout is described in ``schema.py``. Two write engines produce the same
zarr v3 format (codecs ``bytes -> zstd -> crc32c``, chunked along rows):

* ``tensorstore`` (the default): the batches' rows are gathered
  env-major into host buffers the writer reuses (``buffers.py``), and whole
  chunks are handed to tensorstore as they fill; it encodes and writes them on
  its own thread pool (``threads`` bounds it) straight from those buffers. On
  this machine kind it writes zstd about 2.5x faster than zarr-python
  (PLATFORM_FACTS.md); the writer reaches 0.78-0.88x (median 0.83x) of bare
  tensorstore on CartPole steps (benchmarks/RESULTS.md).
  The same engine writes s3:// and gs:// through tensorstore's own kvstores.
* ``zarr`` (memory://, or on request): zarr-python over ``FsspecStore``,
  which writes the chunks of an array concurrently.

The engines and the array layout they share (chunking, codecs, dimension
names) are in ``write_engines.py``; this module gathers the rows, computes the
episode index and writes the completion marker.

Both write the group ``zarr.json`` with the ``databloom`` attributes *last*:
it is the shard's completion marker, checked by ``read_shard_info`` before a
commit, so a writer killed mid-shard leaves a shard that cannot be committed
(and is invisible anyway, because only the commit log makes shards visible).
Retrying a task removes its previous uncommitted attempt first, so stale
chunks of a larger earlier attempt never mix with the new data.

Example::

    writer = ShardWriter("runs/a/replay", env_id="CartPole-v1")
    info = writer.write("r000003-g0001", [batch0, batch1])  # ShardInfo(rows=2048, ...)
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from core import urls
from core.trajectory import CORE_FIELDS, TrajectoryBatch
from core.replay.buffers import BufferPool
from core.replay.schema import (ATTRS_KEY, END_CONTINUES, END_TERMINATED, END_TRUNCATED,
                                EPISODES_GROUP, EVERY_CHUNK_ATTR, SCHEMA_VERSION, ReplayError, ShardInfo)
from core.replay.write_engines import _engine_for, _engine_name, _row_bytes, chunk_rows

GROUP_JSON = {"zarr_format": 3, "node_type": "group"}


def concat_rows(batches: Sequence[TrajectoryBatch]) -> Dict[str, np.ndarray]:
    """Rows of all batches: each batch's ``flat_rows()`` (env-major), batch after batch.

    The arrays a shard of ``batches`` holds, built the simple way (for benchmarks and tools).
    """
    if not batches:
        raise ReplayError("a shard needs at least one TrajectoryBatch; got none")
    per_batch = [b.flat_rows() for b in batches]
    names = list(per_batch[0])
    for i, rows in enumerate(per_batch[1:], 1):
        if list(rows) != names:
            raise ReplayError(f"batch {i} has fields {sorted(rows)}, batch 0 has {sorted(names)};"
                              " all batches of a shard need the same fields")
    out = {}
    for name in names:
        parts = [rows[name] for rows in per_batch]
        specs = {(p.dtype.str, p.shape[1:]) for p in parts}
        if len(specs) != 1:
            raise ReplayError(f"field {name!r} has different dtypes/shapes across batches: {sorted(specs)}")
        out[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return out


def field_values(batches: Sequence[TrajectoryBatch]) -> Dict[str, List[np.ndarray]]:
    """``{field: [value of batch 0, value of batch 1, ...]}``, fields in schema order.

    Checks that every batch has the same fields; dtypes and row shapes are checked
    where the values are copied (``_copy_rows``), by numpy, at no extra cost.
    """
    if not batches:
        raise ReplayError("a shard needs at least one TrajectoryBatch; got none")
    extras = list(batches[0].extras)
    for i, b in enumerate(batches):
        if list(b.extras) != extras:
            raise ReplayError(f"batch {i} has extras {sorted(b.extras)}, batch 0 has {sorted(extras)};"
                              " all batches of a shard need the same fields")
    out = {name: [getattr(b, name) for b in batches] for name in CORE_FIELDS}
    out.update({f"extras/{k}": [b.extras[k] for b in batches] for k in extras})
    return out


#: Fields the episode index is computed from (copied first).
_SEGMENT_FIELDS = ("reward", "terminated", "truncated", "episode_id", "step")
#: Raw bytes of the widest field copied per numpy call: large enough that per-call overhead
#: does not dominate small rows, small enough that chunks start compressing early.
_RUN_BYTES = 1 << 20


def batch_runs(shapes: Sequence[Tuple[int, int]], max_rows: int) -> List[Tuple[int, int]]:
    """``[lo, hi)`` ranges of consecutive batches with equal ``[T, E]`` and at most ``max_rows`` rows
    together (a batch larger than that runs alone): each run is copied with one numpy call."""
    runs: List[Tuple[int, int]] = []
    lo, rows = 0, 0
    for i, shape in enumerate(shapes):
        n = shape[0] * shape[1]
        if i > lo and (shape != shapes[lo] or rows + n > max_rows):
            runs.append((lo, i))
            lo, rows = i, 0
        rows += n
    runs.append((lo, len(shapes)))
    return runs


def _copy_rows(name: str, values: Sequence[np.ndarray], runs, out: np.ndarray, per_chunk: int,
               on_chunks: Callable[[int, np.ndarray], None]) -> None:
    """Copy ``values`` ([T, E, ...] each) env-major into ``out`` ([sum of T * E, ...]).

    Each run is one ``np.stack`` straight into a transposed view of ``out`` (one
    copy, no intermediate; a plain memory copy for batches stored env-major, see
    ``trajectory.step_buffer``); ``casting="no"`` makes numpy check dtypes and
    shapes as it goes. ``on_chunks(lo, rows)`` is called for every newly
    completed stretch of whole ``per_chunk``-row chunks, so the engine
    compresses them while later runs are still being copied; ``out`` is not
    modified there again.
    """
    offset = written = 0
    for lo, hi in runs:
        T, E = values[lo].shape[:2]
        n = (hi - lo) * T * E
        target = out[offset:offset + n].reshape(hi - lo, E, T, *out.shape[1:]).swapaxes(1, 2)
        try:
            np.stack(values[lo:hi], out=target, casting="no")
        except (TypeError, ValueError):
            raise ReplayError(_mismatch(name, values, out.dtype, out.shape[1:])) from None
        offset += n
        ready = offset if offset == len(out) else offset // per_chunk * per_chunk
        if ready > written:
            on_chunks(written, out[written:ready])
            written = ready


def _wait_all(futures: Sequence[Any]) -> None:
    """Wait for every future (None: a synchronous write); then raise the first error, if any."""
    error = None
    for f in futures:
        if f is not None:
            try:
                f.result()
            except BaseException as e:  # noqa: B036 - re-raised below
                error = error or e
    if error is not None:
        raise error


def _mismatch(name: str, values: Sequence[np.ndarray], dtype, row_shape: tuple) -> str:
    for i, v in enumerate(values):
        if v.dtype != dtype or v.shape[2:] != tuple(row_shape):
            return (f"field {name!r} of batch {i} is {v.dtype}{list(v.shape[2:])}, batch 0's is"
                    f" {np.dtype(dtype)}{list(row_shape)}; all batches of a shard need the same dtypes/shapes")
    return f"field {name!r}: batches do not stack (shapes {sorted({v.shape for v in values})})"


def episode_segments(rows: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Index of contiguous episode segments: episode_id, start, length, first_step, return, end.

    A new segment starts at row i when the episode id changes, the step is not
    the previous step + 1, or row i-1 was the last row of its episode.
    """
    ep, step, term, trunc = rows["episode_id"], rows["step"], rows["terminated"], rows["truncated"]
    boundary = np.empty(len(ep), bool)
    boundary[:1] = True
    b = boundary[1:]
    np.not_equal(ep[1:], ep[:-1], out=b)
    b |= step[1:] != step[:-1] + 1
    b |= term[:-1]
    b |= trunc[:-1]
    start = np.flatnonzero(boundary)
    length = np.diff(start, append=len(ep))
    end_row = start + length - 1
    end = np.where(term[end_row], END_TERMINATED, np.where(trunc[end_row], END_TRUNCATED, END_CONTINUES))
    return {
        "episode_id": ep[start].astype(np.int64),
        "start": start.astype(np.int64),
        "length": length.astype(np.int64),
        "first_step": step[start].astype(np.int64),
        "return": np.add.reduceat(rows["reward"], start, dtype=np.float64) if len(start) else np.zeros(0),
        "end": end.astype(np.int8),
    }


class ShardWriter:
    """Writes one zarr v3 group per shard under ``<store_url>/shards/``.

    Args:
      shards_url: the ``shards`` folder of a store.
      env_id: recorded in every shard's attributes.
      chunk_bytes: raw bytes per chunk (rows per chunk are derived per array).
      zstd_level: zstd compression level.
      engine: ``"auto"`` (tensorstore, except zarr-python for memory://),
        ``"tensorstore"`` or ``"zarr"``.
      threads: encoder/writer threads (keep small on shared machines).
    """

    def __init__(self, shards_url: str, env_id: str = "", chunk_bytes: int = 4 << 20,
                 zstd_level: int = 3, engine: str = "auto", threads: int = 2):
        if not (1 << 10) <= chunk_bytes <= (1 << 30):
            raise ReplayError(f"chunk_bytes={chunk_bytes} is out of range; valid: 1 KiB..1 GiB (target 1-8 MiB)")
        self.url, self.env_id = shards_url, env_id
        self.fs, self.path = urls.resolve(shards_url)
        self.chunk_bytes, self.zstd_level = chunk_bytes, zstd_level
        # Checked now, built at the first write: a store that only commits and reads (the driver's: its
        # write tasks open stores of their own) never imports tensorstore (~1 s, ml_dtypes 0.8 s of it).
        self._engine_name, self._threads = _engine_name(shards_url, engine), threads
        self._engine = None
        self._engine_lock = threading.Lock()
        self._buffers = BufferPool()

    @property
    def engine(self):
        """The write engine (tensorstore or zarr-python), built on first use."""
        with self._engine_lock:
            if self._engine is None:
                self._engine = _engine_for(self.url, self._engine_name, self._threads)
            return self._engine

    def remove(self, shard_id: str) -> None:
        """Delete a shard's data, completion marker first."""
        root = f"{self.path}/{shard_id}"
        for target, recursive in ((f"{root}/zarr.json", False), (root, True)):
            try:
                self.fs.rm(target, recursive=recursive)
            except FileNotFoundError:
                pass

    def write(self, shard_id: str, batches: Sequence[TrajectoryBatch],
              attrs: Optional[Dict[str, Any]] = None) -> ShardInfo:
        """Write (or overwrite) the uncommitted shard ``shard_id``; returns its ShardInfo."""
        values = field_values(batches)
        total = sum(b.size for b in batches)
        if total == 0:
            raise ReplayError(f"shard {shard_id!r} would have no rows; write at least one step")
        env_id = self._env_of(shard_id, batches)
        self.remove(shard_id)
        root = f"{self.path}/{shard_id}"
        engine_root = urls.join(self.url, shard_id)
        shapes = {n: ((total, *v[0].shape[2:]), v[0].dtype) for n, v in values.items()}
        with self._buffers.lease(shapes) as rows:  # reused memory: no page faults (core/replay/buffers.py)
            try:
                segments = self._write_arrays(engine_root, values, [b.reward.shape[:2] for b in batches], rows)
            except BaseException:
                self.remove(shard_id)  # no half-written attempt is left behind (it was never visible)
                raise
            info = self._info(shard_id, rows, segments)
            meta = self._attrs(info, env_id, rows, segments, batches, attrs or {})
            del rows
        # Markers last, atomic and durable (tensorstore has fsynced the chunks): a crash never
        # leaves a committed shard without its marker, or a torn one.
        for group in sorted({n.rsplit("/", 1)[0] for n in shapes if "/" in n} | {EPISODES_GROUP}):
            urls.write_atomic(self.fs, f"{root}/{group}/zarr.json",
                              json.dumps({**GROUP_JSON, "attributes": {}}).encode())
        urls.write_atomic(self.fs, f"{root}/zarr.json",
                          json.dumps({**GROUP_JSON, "attributes": {ATTRS_KEY: meta}}).encode())
        return info

    def _write_arrays(self, root: str, values: Dict[str, List[np.ndarray]], batch_shapes,
                      rows: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Fill ``rows`` (one array per field) from ``values``, writing them and the episode
        index under ``root``; returns the episode index.

        The arrays are created while the first rows are copied. Whole chunks
        are handed to the engine as they fill, and it compresses them on its own
        threads, straight from ``rows`` (no copy of its own). The fields the
        episode index needs come first, so the index is computed, and its arrays
        created, while the engine compresses; the rest follow largest first.
        """
        specs = {n: (a.shape, a.dtype, chunk_rows(a.shape, a.dtype, self.chunk_bytes)) for n, a in rows.items()}
        pending = self.engine.create(root, specs, self.zstd_level)
        futures: List[Any] = list(pending.values())
        row_bytes = max(_row_bytes(a.shape, a.dtype) for a in rows.values())
        runs = batch_runs(batch_shapes, max_rows=max(1, _RUN_BYTES // max(1, row_bytes)))

        def copy(name: str) -> None:
            def write(lo: int, block: np.ndarray, created=pending[name]) -> None:
                futures.append(self.engine.write(created.result(), lo, block, referenced=True))
            _copy_rows(name, values[name], runs, rows[name], specs[name][2], write)

        try:
            for name in _SEGMENT_FIELDS:
                copy(name)
            segments = episode_segments(rows)
            seg_pending = self.engine.create(root, {
                f"{EPISODES_GROUP}/{k}": (v.shape, v.dtype, chunk_rows(v.shape, v.dtype, self.chunk_bytes))
                for k, v in segments.items()}, self.zstd_level, small=True)
            futures += seg_pending.values()
            for name in sorted(set(rows) - set(_SEGMENT_FIELDS), key=lambda n: -rows[n].nbytes):
                copy(name)  # largest first: the last chunks left to compress are the smallest
            futures += [self.engine.write(seg_pending[f"{EPISODES_GROUP}/{k}"].result(), 0, v, referenced=True)
                        for k, v in segments.items()]
        finally:
            _wait_all(futures)  # even after an error: nothing may still be writing when the caller cleans up
        return segments

    @staticmethod
    def _info(shard_id: str, rows: Dict[str, np.ndarray], segments: Dict[str, np.ndarray]) -> ShardInfo:
        pv = rows["policy_version"]
        return ShardInfo(id=shard_id, rows=int(len(pv)), nbytes=int(sum(v.nbytes for v in rows.values())),
                         token=uuid.uuid4().hex, created=time.time(),
                         policy_version_min=int(pv.min()), policy_version_max=int(pv.max()),
                         num_segments=int(len(segments["start"])))

    def _env_of(self, shard_id: str, batches: Sequence[TrajectoryBatch]) -> str:
        """The env id the shard records; a batch from another env than the store's is refused."""
        env_ids = sorted({b.env_id for b in batches if b.env_id})
        if self.env_id and any(e != self.env_id for e in env_ids):
            raise ReplayError(f"batches of shard {shard_id!r} come from env {env_ids}, the store holds {self.env_id!r}")
        return self.env_id or (env_ids[0] if env_ids else "")

    @staticmethod
    def _attrs(info: ShardInfo, env_id: str, rows, segments, batches, user: Dict[str, Any]) -> Dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "env_id": env_id,
            "shard_id": info.id, "rows": info.rows, "nbytes": info.nbytes, "token": info.token,
            "created": info.created, "num_segments": info.num_segments,
            "num_episodes_ended": int(np.count_nonzero(segments["end"] != END_CONTINUES)),
            "policy_version_min": info.policy_version_min, "policy_version_max": info.policy_version_max,
            "fields": {n: {"dtype": v.dtype.name, "shape": list(v.shape[1:])} for n, v in rows.items()},
            "actor_ids": sorted({int(b.actor_id) for b in batches}),
            "task_ids": [b.task_id for b in batches], "seeds": [int(b.seed) for b in batches],
            "batch_rows": [int(b.size) for b in batches], "attrs": user,
            EVERY_CHUNK_ATTR: True,
        }
