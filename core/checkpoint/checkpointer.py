"""Async, parallel, atomically committed zarr v3 checkpoints.

Usage (the learner loop)::

    with Checkpointer(join(run_dir, "checkpoints"), keep_last=3, keep_every=10_000) as ckpt:
        start = ckpt.latest_step()
        if start is not None:
            state, meta = ckpt.restore(start)
        for step in range(start or 0, num_steps):
            ...train...
            if step % 1000 == 0:
                ckpt.save(step, {"params": params, "opt": slots, "counters": {"step": step}},
                          metadata={"config": cfg_dict, "replay_version": v})
                # returns after a host copy; the write runs in the background

Save pipeline (Orbax/T5X pattern): ``save()`` waits for the previous save,
re-raises its error if it failed, copies every variable into host buffers and
hands them to one background thread, which writes all arrays in parallel
(chunks ~4 MiB, ``max_workers`` encode/write threads), then writes the group
documents, then commits, then applies retention. Host buffers are reused from
the previous save when shapes match, so a steady-state ``save()`` costs one
memcpy of the state (no page faults); this keeps one checkpoint's worth of
host memory alive (``reuse_buffers=False`` to opt out).

Atomic commit: the step group's ``zarr.json`` is written last, as one atomic
object (temp file + fsync + rename locally, a single PUT on object stores).
We use this marker on every store, instead of rename-a-temp-dir locally and
a marker on object stores, because: (1) one protocol, so the ``memory://``
tests exercise exactly the path ``gs://``/``s3://`` take; (2) the marker *is*
zarr's own metadata, so plain zarr-python and tensorstore readers agree with
DataBloom on what exists: an incomplete step is not a zarr group at all;
(3) object stores have no atomic directory rename. Deletion reverses it: the
marker goes first, so a crash mid-delete leaves an invisible directory.
Incomplete step directories are garbage-collected by the next successful
save. Deterministic names (``step_%08d``) make a retried save overwrite its
own output. One writer per checkpoint directory (readers: any number).

Retention keeps the last ``keep_last`` complete steps, plus every step with
``step % keep_every == 0``; the newest complete checkpoint and the one just
saved (which differ when an older step is re-saved) are never deleted.
"""
from __future__ import annotations

import json
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from core import urls

from . import engines
from .layout import (ROOT_ATTR, SCHEMA_VERSION, STEP_ATTR, CheckpointError, Location,
                     chunk_shape, flatten, group_document, leaf_to_array, restore_leaf,
                     select_paths, step_name, unflatten)

_PARALLEL_COPY_BYTES = 1 << 20


class Checkpointer:
    """Saves and restores nested dicts of arrays as one zarr v3 group per step.

    Args:
        url: checkpoint directory, a local path or fsspec URL (``memory://``, ``gs://``...).
        keep_last: keep this many newest complete checkpoints (None: keep all).
        keep_every: additionally keep every step divisible by this (None: none).
        max_workers: threads that encode/write chunks and copy state to host.
        engine: "auto" (tensorstore for local paths, zarr-python otherwise),
            "tensorstore" (local paths only), "zarr", or "dask": chunks written by the
            workers of ``dask_client`` (a location they all reach).
        dask_client: a ``distributed.Client`` for ``engine="dask"``.
        zstd_level: zstd level; 1 by default because trained float32 weights
            barely compress (~10%) at any level and level 1 is the fastest.
        target_chunk_bytes: upper bound of one chunk (unit of parallelism and of partial reads).
        reuse_buffers: reuse the previous save's host buffers (see module docstring).

    Reads (``restore``, ``read_variable``, ``metadata``) first wait for this
    instance's in-flight save, so they see their own writes and never race
    its retention. One writing instance per directory; readers may be many.

    Raises:
        CheckpointError: ``url`` exists but is not a DataBloom checkpoint directory, or
            was written with a newer schema version. Nothing is written or deleted.
    """

    def __init__(self, url: str, keep_last: Optional[int] = 3, keep_every: Optional[int] = None,
                 max_workers: int = 4, *, engine: str = "auto", zstd_level: int = 1,
                 target_chunk_bytes: int = 4 << 20, reuse_buffers: bool = True, dask_client=None):
        if keep_last is not None and keep_last < 1:
            raise CheckpointError(f"keep_last must be >= 1 or None, got {keep_last}")
        if keep_every is not None and keep_every < 1:
            raise CheckpointError(f"keep_every must be >= 1 or None, got {keep_every}")
        if max_workers < 1:
            raise CheckpointError(f"max_workers must be >= 1, got {max_workers}")
        if engine not in ("auto", "tensorstore", "zarr", "dask"):
            raise CheckpointError(f"unknown engine {engine!r}; valid: auto, tensorstore, zarr, dask")
        if (engine == "dask") != (dask_client is not None):
            raise CheckpointError("engine='dask' and dask_client go together; valid: both or neither")
        try:
            self.url = urls.normalize(url)
            fs, root = urls.resolve(self.url)
        except urls.LocationError as e:
            raise CheckpointError(str(e)) from None
        local = urls.scheme_of(self.url) == "file"
        if engine == "tensorstore" and not local:
            raise CheckpointError(f"engine='tensorstore' needs a local path, got {self.url!r}")
        if engine == "dask" and urls.scheme_of(self.url) == "memory":
            raise CheckpointError(f"engine='dask' needs a location workers reach (path, s3://, gs://),"
                                  f" got {self.url!r}")
        self._loc = Location(fs, root, local)
        self._check_root()
        self.keep_last, self.keep_every = keep_last, keep_every
        self.target_chunk_bytes, self.reuse_buffers = target_chunk_bytes, reuse_buffers
        use_ts = engine == "tensorstore" or (engine == "auto" and local)
        self._writer = (engines.DaskWriter(dask_client, max_workers, zstd_level) if engine == "dask" else
                        (engines.TensorstoreWriter if use_ts else engines.ZarrWriter)(max_workers, zstd_level))
        self._background = ThreadPoolExecutor(1, thread_name_prefix="ckpt-writer")
        self._copy_pool = ThreadPoolExecutor(max_workers, thread_name_prefix="ckpt-copy")
        self._pending: Optional[Tuple[int, Future]] = None
        self._buffers: Dict[str, np.ndarray] = {}
        self._store = None
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
            return
        try:  # do not let a background error mask the exception already propagating
            self.close()
        except CheckpointError as bg:
            warnings.warn(f"while handling {exc_type.__name__}: {bg}", RuntimeWarning)

    def wait(self) -> None:
        """Block until the in-flight save is committed; re-raise its error if it failed."""
        if self._pending is None:
            return
        step, fut = self._pending
        self._pending = None
        err = fut.exception()
        if err is not None:
            raise CheckpointError(f"background save of step {step} to {self.url} failed: "
                                  f"{type(err).__name__}: {err}") from err

    def close(self) -> None:
        """Wait for the in-flight save (re-raising its error) and release threads and buffers."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._background.shutdown(wait=True)
            self._copy_pool.shutdown(wait=True)
            engines.close_writer(self._writer)
            self._buffers.clear()

    # ----------------------------------------------------------------------- save
    def save(self, step: int, state: Mapping[str, Any], metadata: Optional[dict] = None,
             donate: bool = False) -> None:
        """Copy ``state`` to host memory and write it as ``step`` in the background.

        Waits for the previous save first (and raises its error, if any).
        ``state`` is a nested dict whose leaves are arrays, ``tf.Variable``s or
        Python/numpy scalars; ``metadata`` must be JSON-serializable.

        ``donate=True`` hands numpy leaves to the checkpointer without a copy
        (as JAX donates buffers): for states built fresh for this save, e.g.
        ``learner.state()``, whose arrays nobody else holds. The caller must
        not modify donated arrays until the next ``save()``/``wait()`` returns.
        Then ``save()`` blocks only for bookkeeping, even on the first save.
        """
        if self._closed:
            raise CheckpointError(f"save() on a closed Checkpointer ({self.url})")
        self.wait()
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise CheckpointError(f"step must be a non-negative int, got {step!r}")
        step = int(step)
        try:
            meta_json = json.loads(json.dumps(metadata or {}, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"metadata must be JSON-serializable: {e}") from None
        host, kinds = self._snapshot(flatten(state), donate)
        fut = self._background.submit(self._write_step, step, host, kinds, meta_json)
        self._pending = (step, fut)

    def _snapshot(self, flat: Mapping[str, Any], donate: bool = False
                  ) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
        """Host copies of every leaf, large ones copied in parallel (numpy copies drop the GIL).

        With ``donate``, numpy leaves in native/little-endian order are used as they are.
        """
        host, kinds, big = {}, {}, []
        previous, self._buffers = self._buffers, {}
        for path, value in flat.items():
            src, kinds[path] = leaf_to_array(path, value)
            dtype = src.dtype.newbyteorder("<") if src.dtype.byteorder == ">" else src.dtype
            if donate and isinstance(value, np.ndarray) and src.dtype == dtype and src.flags.c_contiguous:
                host[path] = src
                continue
            buf = previous.get(path)
            if buf is None or buf.shape != src.shape or buf.dtype != dtype:
                buf = np.empty(src.shape, dtype)
            host[path] = buf
            if src.nbytes >= _PARALLEL_COPY_BYTES:
                big.append((buf, src))
            else:
                np.copyto(buf, src)
        for f in [self._copy_pool.submit(np.copyto, b, s) for b, s in big]:
            f.result()
        if self.reuse_buffers:  # donated arrays belong to the caller: never reuse them as buffers
            self._buffers = {p: b for p, b in host.items() if not (donate and b is flat.get(p))}
        return host, kinds

    def _write_step(self, step: int, host: Dict[str, np.ndarray], kinds: Dict[str, str],
                    metadata: dict) -> None:
        loc, name = self._loc, step_name(step)
        if not loc.exists("zarr.json"):
            loc.write_bytes(group_document({ROOT_ATTR: {"schema_version": SCHEMA_VERSION}}),
                            "zarr.json")
        loc.remove_step(name)  # a retried or repeated step overwrites its own output
        jobs = [(self._array_location(name, path), arr,
                 chunk_shape(arr.shape, arr.dtype.itemsize, self.target_chunk_bytes))
                for path, arr in host.items()]
        self._writer.write(jobs)
        groups = sorted({"/".join(p.split("/")[:i]) for p in host
                         for i in range(1, p.count("/") + 1)})
        for g in groups:
            loc.write_bytes(group_document(), name, g, "zarr.json")
        variables = {p: {"dtype": a.dtype.name, "shape": list(a.shape), "kind": kinds[p]}
                     for p, a in host.items()}
        attrs = {STEP_ATTR: {"schema_version": SCHEMA_VERSION, "step": step,
                             "created_unix": time.time(), "variables": variables,
                             "metadata": metadata}}
        loc.write_bytes(group_document(attrs), name, "zarr.json")  # the commit
        self._apply_retention(step)

    def _array_location(self, name: str, path: str) -> str:
        if self._loc.local:
            return self._loc.path(name, path)
        return urls.join(self.url, name, path)

    def _apply_retention(self, just_written: int) -> None:
        dirs = self._loc.step_dirs()
        committed = sorted(s for s, ok in dirs.items() if ok)
        keep = set(committed if self.keep_last is None else committed[-self.keep_last:])
        if self.keep_every:
            keep |= {s for s in committed if s % self.keep_every == 0}
        keep |= {committed[-1], just_written}  # never the newest, nor the one just saved
        for s in sorted(dirs):
            if s not in keep:  # old complete steps, and debris of killed saves
                self._loc.remove_step(step_name(s))

    # -------------------------------------------------------------------- reading
    def all_steps(self) -> List[int]:
        """Steps of all complete checkpoints, ascending; incomplete ones are ignored."""
        return sorted(s for s, ok in self._loc.step_dirs().items() if ok)

    def latest_step(self) -> Optional[int]:
        """Newest complete checkpoint, or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def restore(self, step: Optional[int] = None, select: Optional[Sequence[str]] = None
                ) -> Tuple[Dict[str, Any], dict]:
        """``(state, metadata)`` of ``step`` (default: latest), reading only ``select``.

        ``select`` holds variable paths (``"params/q/dense_0/kernel"``) or
        prefixes (``"params"``); other variables are not read at all.
        """
        step, info = self._step_info(step)
        paths = select_paths(list(info["variables"]), select)
        store, name = self._reader(), step_name(step)
        stored = self._stored_keys(name)
        mapper = map if self._closed else self._copy_pool.map  # reads still work after close()
        arrays = list(mapper(lambda p: engines.read_array(store, step, name, p, stored=stored), paths))
        flat = {p: restore_leaf(a, info["variables"][p]["kind"]) for p, a in zip(paths, arrays)}
        return unflatten(flat), info["metadata"]

    def read_variable(self, path: str, step: Optional[int] = None, index: Any = None) -> np.ndarray:
        """``variable[index]`` reading only the chunks that ``index`` touches."""
        step, info = self._step_info(step)
        if path not in info["variables"]:
            raise CheckpointError(f"step {step} has no variable {path!r}; valid: "
                                  f"{sorted(info['variables'])[:12]}")
        return engines.read_array(self._reader(), step, step_name(step), path, index,
                                  stored=self._stored_keys(step_name(step)))

    def _stored_keys(self, name: str):
        """Every file of step directory ``name`` (one listing): the chunks that must all exist."""
        from core.replay.chunks import stored_keys
        return stored_keys(self._loc.fs, self._loc.path(name))

    def metadata(self, step: Optional[int] = None) -> dict:
        """The user metadata of ``step`` (default: latest) without reading any array."""
        return self._step_info(step)[1]["metadata"]

    def _step_info(self, step: Optional[int]) -> Tuple[int, dict]:
        if not self._closed:
            self.wait()  # read-your-writes; and no retention running under our feet
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"no complete checkpoint in {self.url}")
            step = steps[-1]
        elif step not in steps:
            raise CheckpointError(f"step {step} not found in {self.url}; complete "
                                  f"checkpoints: {steps}")
        try:
            attrs = self._loc.read_json(step_name(step), "zarr.json").get("attributes", {})
        except (OSError, ValueError) as e:
            raise CheckpointError(f"step {step} in {self.url}: unreadable zarr.json: {e}") from None
        info = attrs.get(STEP_ATTR)
        if not isinstance(info, dict):
            raise CheckpointError(f"step {step} in {self.url} is a zarr group but not a "
                                  f"DataBloom checkpoint (no {STEP_ATTR!r} attribute)")
        _check_schema(info.get("schema_version"), f"step {step} in {self.url}")
        return step, info

    def _reader(self):
        if self._store is None:
            self._store = engines.open_reader_store(
                self.url, self._loc.root if self._loc.local else None)
        return self._store

    def _check_root(self) -> None:
        loc, fs = self._loc, self._loc.fs
        if not fs.exists(loc.root):
            return
        if not fs.isdir(loc.root):
            raise CheckpointError(f"{self.url} is a file, not a checkpoint directory")
        if not loc.exists("zarr.json"):
            entries = [e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(loc.root, detail=False)]
            if entries:
                raise CheckpointError(
                    f"{self.url} is not a DataBloom checkpoint directory (no zarr.json; contains "
                    f"{sorted(entries)[:5]}); valid: an empty/new directory or one made by "
                    "Checkpointer")
            return
        try:
            attrs = loc.read_json("zarr.json").get("attributes", {})
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.url}: unreadable zarr.json: {e}") from None
        if not isinstance(attrs.get(ROOT_ATTR), dict):
            raise CheckpointError(f"{self.url} is a zarr node but not a DataBloom checkpoint "
                                  f"directory (no {ROOT_ATTR!r} attribute)")
        _check_schema(attrs[ROOT_ATTR].get("schema_version"), self.url)


def _check_schema(version: Any, what: str) -> None:
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise CheckpointError(f"{what} has checkpoint schema version {version!r}; this DataBloom "
                              f"reads versions <= {SCHEMA_VERSION} (upgrade DataBloom)")
