"""The engines that write a shard's zarr v3 arrays, and the array layout they share.

Two engines write the same format (codecs ``bytes -> zstd -> crc32c``,
chunked along rows, every chunk stored, ``dimension_names`` for xarray):

* ``_TensorstoreEngine``: tensorstore's zarr3 driver on its own thread pool,
  writing local disk, s3:// or gs:// (``urls.kvstore_spec``); it can encode
  straight from the caller's buffers (``referenced``).
* ``_ZarrEngine``: zarr-python over ``FsspecStore`` (memory://, or on request).

:func:`_engine_for` picks one for a store URL; :func:`chunk_rows` sizes
chunks from a byte target. :class:`core.replay.shard_writer.ShardWriter`
drives them.

Example::

    engine = _engine_for("runs/a/replay/shards", "auto", threads=2)    # tensorstore for a local path
    handles = {n: f.result() for n, f in engine.create(root, specs, level=3).items()}
    engine.write(handles["reward"], 0, rewards).result()
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from core import urls
from core.replay.schema import EPISODES_GROUP, ReplayError


def _row_bytes(shape: tuple, dtype) -> int:
    return np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64))


def chunk_rows(shape: tuple, dtype, chunk_bytes: int) -> int:
    """Rows per chunk so that a chunk of an array of ``shape``/``dtype`` holds about ``chunk_bytes``."""
    return int(max(1, min(shape[0], chunk_bytes // max(1, _row_bytes(shape, dtype)))))


#: The dimension of the episode index arrays (one entry per episode segment).
SEGMENT_DIM = "segment"
#: The leading dimension of every field array (one entry per stored step).
ROW_DIM = "row"


def dimension_names(name: str, ndim: int) -> List[str]:
    """zarr v3 ``dimension_names`` of the shard array ``name`` with ``ndim`` dimensions.

    Field arrays are ``row`` then one dimension per field axis, named after the
    field (``observation_dim0``), so arrays of one group never share a name of
    a different size; the episode index has its own ``segment`` dimension.
    xarray needs the names to open a shard (``xarray.open_zarr(shard)``, and
    ``group="extras"`` / ``group="episodes"``); DataBloom's readers ignore them,
    so shards written before they existed still read.
    """
    leaf = name.rsplit("/", 1)[-1]
    first = SEGMENT_DIM if name.startswith(f"{EPISODES_GROUP}/") else ROW_DIM
    return [first, *(f"{leaf}_dim{i}" for i in range(ndim - 1))]


def _zarr_metadata(name: str, shape: tuple, dtype, chunks: int, level: int) -> Dict[str, Any]:
    dtype = np.dtype(dtype)
    return {
        "shape": list(shape), "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [chunks, *shape[1:]]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": False if dtype == np.bool_ else 0,
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                   {"name": "zstd", "configuration": {"level": level, "checksum": False}},
                   {"name": "crc32c"}],
        "dimension_names": dimension_names(name, len(shape)),
    }


class _TensorstoreEngine:
    """Writes arrays with tensorstore's zarr3 driver: local disk, s3:// or gs:// (``urls.kvstore_spec``)."""

    def __init__(self, threads: int):
        import tensorstore as ts
        self.ts = ts
        self.context = ts.Context({"data_copy_concurrency": {"limit": threads},
                                   "file_io_concurrency": {"limit": 2 * threads}})
        # Small arrays (the episode index) get executors of their own, so that creating
        # them is not queued behind the chunks the large arrays are compressing.
        self.small_context = ts.Context({"data_copy_concurrency": {"limit": 1},
                                         "file_io_concurrency": {"limit": 2}})

    def create(self, root: str, specs: Dict[str, Tuple[tuple, np.dtype, int]], level: int,
               small: bool = False) -> Dict[str, Any]:
        """Start creating every array; returns ``{name: future}`` whose ``result()`` is the write handle.

        ``small``: the arrays are small (see ``small_context``).
        """
        context = self.small_context if small else self.context
        return {name: self.ts.open({
            "driver": "zarr3", "kvstore": urls.kvstore_spec(urls.join(root, name)),
            "metadata": _zarr_metadata(name, shape, dtype, chunks, level),
            "store_data_equal_to_fill_value": True,  # every chunk stored: see EVERY_CHUNK_ATTR
            "create": True, "delete_existing": True}, context=context)
            for name, (shape, dtype, chunks) in specs.items()}

    def write(self, handle, lo: int, data: np.ndarray, referenced: bool = False):
        """Start writing chunk-aligned rows ``[lo, lo + len(data))``; returns a future.

        ``referenced``: the caller never modifies ``data`` again, so tensorstore may
        encode straight from it instead of copying it first.
        """
        return handle[lo:lo + len(data)].write(data, can_reference_source_data_indefinitely=referenced)

    def write_all(self, root: str, arrays: Dict[str, np.ndarray], chunk_bytes: int, level: int,
                  referenced: bool = False) -> None:
        """Write whole arrays, all in flight at once (the benchmark's reference)."""
        specs = {n: (a.shape, a.dtype, chunk_rows(a.shape, a.dtype, chunk_bytes)) for n, a in arrays.items()}
        handles = {n: f.result() for n, f in self.create(root, specs, level).items()}
        for f in [self.write(handles[n], 0, a, referenced) for n, a in arrays.items()]:
            f.result()


class _Done:
    """An already-finished future (the zarr engine creates arrays synchronously)."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _ZarrEngine:
    """Writes arrays with zarr-python through an fsspec store (chunks of one write go concurrently)."""

    def create(self, root: str, specs: Dict[str, Tuple[tuple, np.dtype, int]], level: int,
               small: bool = False) -> Dict[str, Any]:
        import zarr
        from zarr.storage import StorePath
        from core.replay.shard_reader import zarr_store
        store = zarr_store(root, read_only=False)
        return {name: _Done(zarr.create_array(
            StorePath(store, name), shape=shape, dtype=dtype, chunks=(chunks, *shape[1:]),
            compressors=[zarr.codecs.ZstdCodec(level=level), zarr.codecs.Crc32cCodec()],
            fill_value=False if dtype == np.bool_ else 0, dimension_names=dimension_names(name, len(shape)),
            overwrite=True, config={"write_empty_chunks": True}))  # every chunk stored: see EVERY_CHUNK_ATTR
            for name, (shape, dtype, chunks) in specs.items()}

    def write(self, handle, lo: int, data: np.ndarray, referenced: bool = False):
        handle[lo:lo + len(data)] = data  # synchronous: nothing is referenced after it returns
        return None


def _engine_name(url: str, engine: str) -> str:
    """``engine`` for ``url`` resolved (``auto``) and checked: ``"tensorstore"`` or ``"zarr"``; ReplayError else."""
    if engine == "auto":
        engine = "zarr" if urls.scheme_of(url) == "memory" else "tensorstore"
    if engine == "tensorstore" and urls.scheme_of(url) == "memory":
        raise ReplayError(f"engine 'tensorstore' cannot write {url!r} (no shared memory kvstore);"
                          " valid: 'zarr', 'auto'")
    if engine not in ("tensorstore", "zarr"):
        raise ReplayError(f"unknown shard write engine {engine!r}; valid: auto, tensorstore, zarr")
    return engine


def _engine_for(url: str, engine: str, threads: int):
    return _TensorstoreEngine(threads) if _engine_name(url, engine) == "tensorstore" else _ZarrEngine()
