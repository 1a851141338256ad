"""Policy payloads as files in the run directory, read by path (Beam rounds).

A round's pipeline must not carry the policy in its job graph: ActorQ-size
payloads are 8.6 MB (int8) to 34 MB (fp32), and Dataflow caps a job request
at 20 MB (and every byte of a ``beam.Create`` is part of it). The learner
stage writes each version once; rollout and evaluation stages get the
*path* and read it, once per worker process::

    <run_dir>/policies/v000007.tflite    the flatbuffer (PolicyPayload.data)
    <run_dir>/policies/v000007.json      PolicyPayload.describe(): written last, so a reader that
                                         finds it finds a complete flatbuffer

Nothing here imports TensorFlow or LiteRT: the launcher lists and
describes payloads without either.

Example::

    path = write_payload(run_dir, payload)        # the learner stage (or a test) publishes
    payload = read_payload(path)                  # a rollout task, anywhere the run dir is reachable
    describe(run_dir, 7)["nbytes"]                # the launcher: metadata only
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Dict, Optional

from core import urls

#: Payloads a worker process keeps (the round's version, and the previous one during a change-over).
_CACHE_SIZE = 2
_CACHE: "OrderedDict[str, Any]" = OrderedDict()
_CACHE_LOCK = threading.Lock()


def payload_path(run_dir: str, version: int) -> str:
    """Where version ``version``'s flatbuffer lives (deterministic: a retry rewrites the same file)."""
    return urls.join(run_dir, "policies", f"v{int(version):06d}.tflite")


def _meta_path(path: str) -> str:
    return path[: -len(".tflite")] + ".json"


def exists(run_dir: str, version: int) -> bool:
    """True once version ``version`` is completely written (its JSON is written last)."""
    fs, path = urls.resolve(_meta_path(payload_path(run_dir, version)))
    return fs.exists(path)


def write_payload(run_dir: str, payload, version: Optional[int] = None) -> str:
    """Write ``payload`` as version ``version`` (default: its own); returns its path."""
    path = payload_path(run_dir, payload.version if version is None else version)
    fs, local = urls.resolve(path)
    fs.makedirs(local.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(local, "wb") as f:
        f.write(payload.data)
    with fs.open(_meta_path(local), "w") as f:     # the marker: last
        json.dump(payload.describe(), f)
    return path


def describe(run_dir: str, version: int) -> Optional[Dict[str, Any]]:
    """``PolicyPayload.describe()`` of a written version, or None if it is not (completely) written."""
    fs, path = urls.resolve(_meta_path(payload_path(run_dir, version)))
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)


def read_payload(path: str):
    """The :class:`~core.quantize.PolicyPayload` at ``path`` (cached per process).

    Raises:
        FileNotFoundError: no complete payload there (names the path).
    """
    with _CACHE_LOCK:
        if path in _CACHE:
            _CACHE.move_to_end(path)
            return _CACHE[path]
    from core.quantize import PolicyPayload   # numpy only: no TensorFlow
    fs, local = urls.resolve(path)
    if not fs.exists(_meta_path(local)):
        raise FileNotFoundError(f"no policy payload at {path} (its .json marker is missing)")
    with fs.open(_meta_path(local)) as f:
        meta = json.load(f)
    with fs.open(local, "rb") as f:
        data = f.read()
    payload = PolicyPayload(int(meta["version"]), meta["precision"], data, float(meta["convert_seconds"]),
                            int(meta["input_dim"]), int(meta["output_dim"]), meta.get("method", "convert"))
    with _CACHE_LOCK:
        _CACHE[path] = payload
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return payload
