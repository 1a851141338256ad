"""Reusable host memory for the arrays of a shard being written.

Fresh memory costs a page fault per 4 KiB on first touch: for a 56 MB shard
that took 4-10k minor faults and made gathering its rows 2-3x slower than into
reused memory (benchmarks/RESULTS.md).
A writer keeps the buffers of its previous shards and carves the next shard's
arrays out of one of them.

A buffer is reused only once nothing references it any more: the engine may
keep references to the data it writes (tensorstore's
``can_reference_source_data_indefinitely``), and a caller may keep arrays. A
lease compares the buffer's reference count when it ends with the count when
it began, and a buffer that is still held elsewhere is dropped, not reused.

Example::

    pool = BufferPool()
    with pool.lease({"reward": ((1024,), np.float32), ...}) as arrays:
        ...                  # fill and write the arrays
        del arrays           # drop them before the lease ends, or the buffer is not reused
"""
from __future__ import annotations

import sys
import threading
from typing import Dict, List, Tuple

import numpy as np

#: Arrays carved from a buffer start at multiples of this (cache-line and SIMD friendly).
ALIGN = 64


def layout_bytes(specs: Dict[str, Tuple[tuple, np.dtype]]) -> int:
    """Bytes ``carve`` needs for arrays of ``{name: (shape, dtype)}``."""
    return sum(_aligned(_nbytes(shape, dtype)) for shape, dtype in specs.values())


def carve(buf: np.ndarray, specs: Dict[str, Tuple[tuple, np.dtype]]) -> Dict[str, np.ndarray]:
    """Arrays of ``{name: (shape, dtype)}`` laid out one after another in ``buf`` (uint8)."""
    out, offset = {}, 0
    for name, (shape, dtype) in specs.items():
        n = _nbytes(shape, dtype)
        out[name] = buf[offset:offset + n].view(dtype).reshape(shape)
        offset += _aligned(n)
    if offset > len(buf):
        raise ValueError(f"buffer of {len(buf)} bytes is too small for {offset} bytes of arrays")
    return out


class BufferPool:
    """Keeps up to ``max_buffers`` released buffers for reuse (thread-safe)."""

    def __init__(self, max_buffers: int = 1):
        self.max_buffers = max_buffers
        self._free: List[np.ndarray] = []
        self._lock = threading.Lock()

    def lease(self, specs: Dict[str, Tuple[tuple, np.dtype]]) -> "Lease":
        """Arrays of ``{name: (shape, dtype)}`` (uninitialized) in a buffer of this pool."""
        return Lease(self, self._take(layout_bytes(specs)), specs)

    def _take(self, nbytes: int) -> np.ndarray:
        """The smallest free buffer of at least ``nbytes``, else a new one."""
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if len(b) >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: len(self._free[i])))
        return np.empty(max(nbytes, ALIGN), np.uint8)

    def _give(self, buf: np.ndarray) -> None:
        with self._lock:
            self._free.append(buf)
            self._free.sort(key=len, reverse=True)
            del self._free[self.max_buffers:]  # keep the largest

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._free)


class Lease:
    """Context manager: ``__enter__`` returns the carved arrays; on exit the buffer goes back to
    the pool if nothing but the lease holds it any more."""

    def __init__(self, pool: BufferPool, buf: np.ndarray, specs: Dict[str, Tuple[tuple, np.dtype]]):
        self.pool, self.buf, self.specs = pool, buf, specs
        self.kept = False

    def __enter__(self) -> Dict[str, np.ndarray]:
        self._idle = sys.getrefcount(self.buf)  # held by this lease only
        return carve(self.buf, self.specs)

    def __exit__(self, *exc) -> None:
        if sys.getrefcount(self.buf) <= self._idle:
            self.pool._give(self.buf)
            self.kept = True
        self.buf = None


def _nbytes(shape: tuple, dtype) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN
