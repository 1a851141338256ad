"""Exclusive create: publish a small object only if no object of that name exists yet.

The commit log's only concurrency primitive (see ``commit_log.py``). Per store kind, and which are
safe for concurrent writers:

* **local disk** (plain path, ``file://``): the entry is written to a private
  temp file, fsynced, then published with ``os.link(tmp, entry)``, which fails
  with EEXIST if the entry exists. link(2) is atomic on POSIX file systems
  (also NFSv3+), and the entry appears complete or not at all. **Safe for
  concurrent processes and machines sharing the file system.**
* **gs://, s3://**: tensorstore's kvstore conditional write
  (``if_equal`` = the "no value" generation), which GCS implements with
  ``ifGenerationMatch=0`` and S3 with ``If-None-Match: *``. **Safe for
  concurrent writers** (credentials come from tensorstore's usual
  environment, not fsspec's). Data and reads still go through fsspec.
  An S3-compatible server (MinIO, Ceph, moto) is named by
  ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (region: ``AWS_REGION`` or
  ``AWS_DEFAULT_REGION``), which s3fs reads itself and ``_creator_for``
  passes to tensorstore (``core.urls.s3_endpoint_options``); the server must
  answer ``If-None-Match: *`` on PUT with 412 (AWS S3 since 2024-08;
  moto >= 5.0.15; older moto ignores it, which the test detects).
  Tested against moto: ``tests/core/replay/test_replay_s3.py``.
* **memory://**: fsspec's in-process memory file system, a check-then-create
  under a process-wide lock. Safe for threads of one process, which is all
  that can see a memory:// store. (tensorstore's own ``memory`` kvstore is a
  different, per-Context store, so it cannot back fsspec's memory://.)

Example::

    creator = _creator_for("runs/a/replay", fs, "runs/a/replay/log")
    creator.create("00000000000000000007.json", data)   # True, or False if it exists
"""
from __future__ import annotations

import os
import threading
import uuid
from typing import Any, Dict

from core import urls

_MEMORY_LOCK = threading.Lock()


class _LinkCreator:
    """Local disk: publish a fully written temp file with os.link (atomic, EEXIST on conflict)."""

    def __init__(self, directory: str):
        self.dir = directory

    def create(self, name: str, data: bytes) -> bool:
        os.makedirs(self.dir, exist_ok=True)
        tmp = os.path.join(self.dir, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, os.path.join(self.dir, name))
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)


class _LockedCreator:
    """memory://: check-then-create under a process-wide lock (one process sees the store)."""

    def __init__(self, fs, directory: str):
        self.fs, self.dir = fs, directory

    def create(self, name: str, data: bytes) -> bool:
        path = f"{self.dir}/{name}"
        with _MEMORY_LOCK:
            if self.fs.exists(path):
                return False
            self.fs.pipe_file(path, data)
            return True


class TensorstoreCreator:
    """Object stores: tensorstore kvstore write conditioned on "no value" generation."""

    def __init__(self, kvstore_spec: Dict[str, Any]):
        import tensorstore as ts
        self.kv = ts.KvStore.open(kvstore_spec).result()
        self.no_value = self.kv.read(".generation-probe-never-written").result().stamp.generation

    def create(self, name: str, data: bytes) -> bool:
        stamp = self.kv.write(name, data, if_equal=self.no_value).result()
        return stamp.generation != b""  # an unmet condition returns the unknown generation


def _creator_for(url: str, fs, log_path: str):
    scheme = urls.scheme_of(url)
    if scheme == "file":
        return _LinkCreator(log_path)
    if scheme == "memory":
        return _LockedCreator(fs, log_path)
    # s3 takes an S3-compatible server from AWS_ENDPOINT_URL(_S3), as s3fs does for data.
    return TensorstoreCreator(urls.kvstore_spec(f"{scheme}://{log_path}"))
