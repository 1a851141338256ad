"""Shard writer: trajectory batches -> one zarr v3 group with one array per field.

The layout is described in ``schema.py``. Two write engines produce the same
zarr v3 format (codecs ``bytes -> zstd -> crc32c``, chunked along rows):

* ``tensorstore`` (default for local paths): every array's write is issued
  at once and tensorstore encodes and writes chunks on its own thread pool
  (``threads`` bounds it). On this machine kind it writes zstd about 2.5x
  faster than zarr-python (PLATFORM_FACTS.md), which is what the throughput
  goal (>= 80 % of tensorstore) needs.
* ``zarr`` (fsspec URLs: memory://, gs://, s3://): zarr-python over
  ``FsspecStore``, which writes the chunks of an array concurrently.

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
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from core import urls
from core.trajectory import TrajectoryBatch
from core.replay.schema import (ATTRS_KEY, END_CONTINUES, END_TERMINATED, END_TRUNCATED,
                                EPISODES_GROUP, SCHEMA_VERSION, ReplayError, ShardInfo)

GROUP_JSON = {"zarr_format": 3, "node_type": "group"}


def concat_rows(batches: Sequence[TrajectoryBatch]) -> Dict[str, np.ndarray]:
    """Rows of all batches: each batch's ``flat_rows()`` (env-major), batch after batch."""
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


#: Fields kept whole in memory while writing: the episode index and attributes need them.
_INDEX_FIELDS = ("reward", "terminated", "truncated", "episode_id", "step", "policy_version")
#: Rows at least this large (e.g. image frames) are copied per env, without an intermediate copy.
_BIG_ROW_BYTES = 1024


class _Shape:
    """Shape and dtype of an array that is not allocated yet (for chunk_rows)."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.row_bytes

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))


class _ChunkStream:
    """Streams env-major rows of large fields through a few reused chunk-sized buffers.

    Copying a whole field into one fresh array costs a page fault per 4 KiB
    (slower than the copy itself for frames); reusing ``depth`` hot buffers
    avoids that. A buffer is reused once the engine has copied it out
    (tensorstore's ``WriteFutures.copy``).
    """

    def __init__(self, engine, handle, shape, dtype, chunk_bytes: int, futures: list, depth: int = 4):
        self.engine, self.handle, self.futures, self.depth = engine, handle, futures, depth
        self.rows_per_chunk = chunk_rows(_Shape(shape, dtype), chunk_bytes)
        self.row_shape, self.dtype = tuple(shape[1:]), np.dtype(dtype)
        self.free: List[np.ndarray] = []
        self.busy: List[Tuple[np.ndarray, Any]] = []
        self.buf, self.pos, self.lo = self._take(), 0, 0

    def _take(self) -> np.ndarray:
        if self.free:
            return self.free.pop()
        if len(self.busy) >= self.depth:
            buf, fut = self.busy.pop(0)
            if fut is not None:
                fut.copy.result()
            return buf
        return np.empty((self.rows_per_chunk, *self.row_shape), self.dtype)

    def _flush(self) -> None:
        if not self.pos:
            return
        fut = self.engine.write(self.handle, self.lo, self.buf[:self.pos])
        self.futures.append(fut)
        self.busy.append((self.buf, fut))
        self.lo += self.pos
        self.buf, self.pos = self._take(), 0

    def feed_all(self, values: List[np.ndarray]) -> None:
        """Write ``values`` ([T, E, ...] each) as env-major rows, then flush the last chunk."""
        row_bytes = self.dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))
        if row_bytes >= _BIG_ROW_BYTES:  # per env: a strided view, no intermediate copy
            blocks = (value[:, e] for value in values for e in range(value.shape[1]))
        else:  # small rows: one reshaping copy per run of batches (per-call overhead dominates)
            blocks = (np.swapaxes(np.stack(run), 1, 2).reshape(-1, *self.row_shape)
                      for run in _runs(values, max_bytes=1 << 20))
        for block in blocks:
            i = 0
            while i < len(block):
                take = min(len(block) - i, self.rows_per_chunk - self.pos)
                self.buf[self.pos:self.pos + take] = block[i:i + take]
                self.pos += take
                i += take
                if self.pos == self.rows_per_chunk:
                    self._flush()
        self._flush()


def field_specs(batches: Sequence[TrajectoryBatch]) -> Dict[str, Tuple[np.dtype, tuple]]:
    """``{field: (dtype, row_shape)}``, checked to agree across batches."""
    if not batches:
        raise ReplayError("a shard needs at least one TrajectoryBatch; got none")
    specs = {n: (v.dtype, v.shape[2:]) for n, v in batches[0].fields().items()}
    for i, b in enumerate(batches[1:], 1):
        other = {n: (v.dtype, v.shape[2:]) for n, v in b.fields().items()}
        if other != specs:
            diff = sorted(set(specs.items()) ^ set(other.items()), key=str)
            raise ReplayError(f"batch {i} of a shard differs from batch 0 in fields/dtypes/shapes: {diff}")
    return specs


def _runs(values: List[np.ndarray], max_bytes: int) -> List[List[np.ndarray]]:
    """Consecutive values of equal shape, in runs of at most ``max_bytes`` (a big value runs alone)."""
    runs: List[List[np.ndarray]] = []
    size = 0
    for v in values:
        if runs and v.shape == runs[-1][0].shape and size + v.nbytes <= max_bytes:
            runs[-1].append(v)
            size += v.nbytes
        else:
            runs.append([v])
            size = v.nbytes
    return runs


def episode_segments(rows: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Index of contiguous episode segments: episode_id, start, length, first_step, return, end.

    A new segment starts at row i when the episode id changes, the step is not
    the previous step + 1, or row i-1 was the last row of its episode.
    """
    ep, step = rows["episode_id"], rows["step"]
    last = rows["terminated"] | rows["truncated"]
    boundary = np.ones(len(ep), bool)
    boundary[1:] = (ep[1:] != ep[:-1]) | (step[1:] != step[:-1] + 1) | last[:-1]
    start = np.flatnonzero(boundary)
    length = np.diff(np.append(start, len(ep)))
    end_row = start + length - 1
    end = np.where(rows["terminated"][end_row], END_TERMINATED,
                   np.where(rows["truncated"][end_row], END_TRUNCATED, END_CONTINUES))
    return {
        "episode_id": ep[start].astype(np.int64),
        "start": start.astype(np.int64),
        "length": length.astype(np.int64),
        "first_step": step[start].astype(np.int64),
        "return": np.add.reduceat(rows["reward"].astype(np.float64), start),
        "end": end.astype(np.int8),
    }


def chunk_rows(arr, chunk_bytes: int) -> int:
    """Rows per chunk so that a chunk holds about ``chunk_bytes`` of raw data (``arr``: shape+dtype)."""
    row_bytes = max(1, np.dtype(arr.dtype).itemsize * int(np.prod(arr.shape[1:], dtype=np.int64)))
    return int(max(1, min(arr.shape[0], chunk_bytes // row_bytes)))


def _zarr_metadata(shape: tuple, dtype, chunks: int, level: int) -> Dict[str, Any]:
    dtype = np.dtype(dtype)
    return {
        "shape": list(shape), "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunks, *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": False if dtype == np.bool_ else 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "zstd", "configuration": {"level": level, "checksum": False}},
                   {"name": "crc32c"}],
    }


class _TensorstoreEngine:
    """Writes arrays with tensorstore's zarr3 driver on the local file kvstore."""

    def __init__(self, threads: int):
        import tensorstore as ts
        self.ts = ts
        self.context = ts.Context({"data_copy_concurrency": {"limit": threads},
                                   "file_io_concurrency": {"limit": 2 * threads}})

    def create(self, root: str, specs: Dict[str, Tuple[tuple, np.dtype, int]], level: int) -> Dict[str, Any]:
        """Create every array at once; returns handles for ``write``."""
        opens = {name: self.ts.open({
            "driver": "zarr3", "kvstore": {"driver": "file", "path": f"{root}/{name}/"},
            "metadata": _zarr_metadata(shape, dtype, chunks, level),
            "create": True, "delete_existing": True}, context=self.context)
            for name, (shape, dtype, chunks) in specs.items()}
        return {name: f.result() for name, f in opens.items()}

    def write(self, handle, lo: int, data: np.ndarray):
        """Start writing chunk-aligned rows ``[lo, lo + len(data))``; returns a future."""
        return handle[lo:lo + len(data)].write(data)

    def write_all(self, root: str, arrays: Dict[str, np.ndarray], chunk_bytes: int, level: int) -> None:
        """Write whole arrays, all in flight at once (used by the benchmark's reference)."""
        specs = {n: (a.shape, a.dtype, chunk_rows(a, chunk_bytes)) for n, a in arrays.items()}
        handles = self.create(root, specs, level)
        for f in [self.write(handles[n], 0, a) for n, a in arrays.items()]:
            f.result()


class _ZarrEngine:
    """Writes arrays with zarr-python through an fsspec store (chunks of one write go concurrently)."""

    def create(self, root: str, specs: Dict[str, Tuple[tuple, np.dtype, int]], level: int) -> Dict[str, Any]:
        import zarr
        from zarr.storage import StorePath
        from core.replay.shard_reader import zarr_store
        store = zarr_store(root, read_only=False)
        return {name: zarr.create_array(
            StorePath(store, name), shape=shape, dtype=dtype, chunks=(chunks, *shape[1:]),
            compressors=[zarr.codecs.ZstdCodec(level=level), zarr.codecs.Crc32cCodec()],
            fill_value=False if dtype == np.bool_ else 0, overwrite=True)
            for name, (shape, dtype, chunks) in specs.items()}

    def write(self, handle, lo: int, data: np.ndarray):
        handle[lo:lo + len(data)] = data
        return None


def _engine_for(url: str, engine: str, threads: int):
    if engine == "auto":
        engine = "tensorstore" if urls.scheme_of(url) == "file" else "zarr"
    if engine == "tensorstore":
        if urls.scheme_of(url) != "file":
            raise ReplayError(f"engine 'tensorstore' writes local paths only, not {url!r}; valid: 'zarr', 'auto'")
        return _TensorstoreEngine(threads)
    if engine == "zarr":
        return _ZarrEngine()
    raise ReplayError(f"unknown shard write engine {engine!r}; valid: auto, tensorstore, zarr")


class ShardWriter:
    """Writes one zarr v3 group per shard under ``<store_url>/shards/``.

    Args:
      shards_url: the ``shards`` folder of a store.
      env_id: recorded in every shard's attributes.
      chunk_bytes: raw bytes per chunk (rows per chunk are derived per array).
      zstd_level: zstd compression level.
      engine: ``"auto"`` (tensorstore for local paths, zarr-python otherwise),
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
        self.engine = _engine_for(shards_url, engine, threads)

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
        specs = field_specs(batches)
        total = sum(b.size for b in batches)
        if total == 0:
            raise ReplayError(f"shard {shard_id!r} would have no rows; write at least one step")
        self.remove(shard_id)
        root = f"{self.path}/{shard_id}"
        engine_root = root if urls.scheme_of(self.url) == "file" else urls.join(self.url, shard_id)
        shapes = {n: ((total, *shape), dtype) for n, (dtype, shape) in specs.items()}
        handles = self.engine.create(
            engine_root, {n: (shp, dt, chunk_rows(_Shape(shp, dt), self.chunk_bytes)) for n, (shp, dt) in shapes.items()},
            self.zstd_level)
        futures, rows, fields = [], {}, [b.fields() for b in batches]
        for name, (shape, dtype) in shapes.items():
            if name not in _INDEX_FIELDS:
                _ChunkStream(self.engine, handles[name], shape, dtype, self.chunk_bytes, futures).feed_all(
                    [f[name] for f in fields])
                rows[name] = _Shape(shape, dtype)  # streamed, not kept
            else:
                rows[name] = self._fill_streaming(name, fields, shape, dtype, handles[name], futures)
        segments = episode_segments(rows)
        seg_specs = {f"{EPISODES_GROUP}/{k}": (v.shape, v.dtype, chunk_rows(v, self.chunk_bytes))
                     for k, v in segments.items()}
        seg_handles = self.engine.create(engine_root, seg_specs, self.zstd_level)
        futures += [self.engine.write(seg_handles[f"{EPISODES_GROUP}/{k}"], 0, v) for k, v in segments.items()]
        for f in futures:
            if f is not None:
                f.result()
        for group in sorted({n.rsplit("/", 1)[0] for n in [*shapes, *seg_specs] if "/" in n}):
            self.fs.pipe_file(f"{root}/{group}/zarr.json", json.dumps({**GROUP_JSON, "attributes": {}}).encode())
        info = self._info(shard_id, rows, segments)
        meta = self._attrs(info, rows, segments, batches, attrs or {})
        self.fs.pipe_file(f"{root}/zarr.json",
                          json.dumps({**GROUP_JSON, "attributes": {ATTRS_KEY: meta}}).encode())
        return info

    def _fill_streaming(self, name, fields, shape, dtype, handle, futures) -> np.ndarray:
        """Copy each batch's rows (env-major) into one array, writing whole chunks as they fill.

        The engine compresses finished chunks while later batches are copied.
        Runs of small batches of equal [T, E] are copied with one stacked
        numpy call (per-call overhead, not bandwidth, bounds small rows).
        """
        out = np.empty(shape, dtype)
        per_chunk = chunk_rows(_Shape(shape, dtype), self.chunk_bytes)
        offset = written = 0
        for group in _runs([f[name] for f in fields], max_bytes=1 << 20):
            T, E = group[0].shape[:2]
            n = len(group) * T * E
            target = out[offset:offset + n].reshape(len(group), E, T, *shape[1:])
            if len(group) == 1:
                target[0] = np.swapaxes(group[0], 0, 1)
            else:
                target[...] = np.swapaxes(np.stack(group), 1, 2)
            offset += n
            ready = offset if offset == shape[0] else offset // per_chunk * per_chunk
            if ready > written:
                futures.append(self.engine.write(handle, written, out[written:ready]))
                written = ready
        return out

    @staticmethod
    def _info(shard_id: str, rows: Dict[str, np.ndarray], segments: Dict[str, np.ndarray]) -> ShardInfo:
        pv = rows["policy_version"]
        return ShardInfo(id=shard_id, rows=int(len(pv)), nbytes=int(sum(v.nbytes for v in rows.values())),
                         token=uuid.uuid4().hex, created=time.time(),
                         policy_version_min=int(pv.min()), policy_version_max=int(pv.max()),
                         num_segments=int(len(segments["start"])))

    def _attrs(self, info: ShardInfo, rows, segments, batches, user: Dict[str, Any]) -> Dict[str, Any]:
        env_ids = sorted({b.env_id for b in batches if b.env_id})
        if self.env_id and any(e != self.env_id for e in env_ids):
            raise ReplayError(f"batches of shard {info.id!r} come from env {env_ids}, the store holds {self.env_id!r}")
        return {
            "schema_version": SCHEMA_VERSION, "env_id": self.env_id or (env_ids[0] if env_ids else ""),
            "shard_id": info.id, "rows": info.rows, "nbytes": info.nbytes, "token": info.token,
            "created": info.created, "num_segments": info.num_segments,
            "num_episodes_ended": int(np.count_nonzero(segments["end"] != END_CONTINUES)),
            "policy_version_min": info.policy_version_min, "policy_version_max": info.policy_version_max,
            "fields": {n: {"dtype": v.dtype.name, "shape": list(v.shape[1:])} for n, v in rows.items()},
            "actor_ids": sorted({int(b.actor_id) for b in batches}),
            "task_ids": [b.task_id for b in batches], "seeds": [int(b.seed) for b in batches],
            "batch_rows": [int(b.size) for b in batches], "attrs": user,
        }
