"""On-disk layout of a checkpoint directory, and the state <-> variables mapping.

A checkpoint directory is a zarr v3 hierarchy::

    <url>/zarr.json                       group; attributes
                                          {"databloom_checkpoints": {"schema_version": 1}}
    <url>/step_00001000/zarr.json         group; THE COMMIT MARKER, written last;
                                          attributes {"databloom_checkpoint": {
                                              "schema_version", "step", "created_unix",
                                              "variables": {path: {dtype, shape, kind}},
                                              "metadata": <user JSON>}}
    <url>/step_00001000/params/zarr.json  group (one per nested-dict level)
    <url>/step_00001000/params/dense_0/kernel/zarr.json   array
    <url>/step_00001000/params/dense_0/kernel/c/0/0       chunk: bytes | zstd | crc32c

Nested dicts become zarr subgroups, so the variable path
``"params/dense_0/kernel"`` is also its zarr path: any zarr v3 reader opens
``zarr.open_group(url)["step_00001000/params/dense_0/kernel"]``.

A step directory without its ``zarr.json`` is an incomplete checkpoint: it is
invisible to DataBloom, to zarr-python and to tensorstore alike (a zarr v3
group does not exist without its metadata document). That single rule is the
commit protocol on every store; see ``checkpointer.py`` for why.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from core import urls

#: Bump when the layout changes incompatibly; readers refuse newer versions.
SCHEMA_VERSION = 1
ROOT_ATTR = "databloom_checkpoints"
STEP_ATTR = "databloom_checkpoint"
_STEP_RE = re.compile(r"^step_(\d+)$")
#: Python scalar kinds restored as Python scalars; everything else as ndarray.
_PY_KINDS = {bool: "bool", int: "int", float: "float"}
_ALLOWED_DTYPE_KINDS = "biufc"


class CheckpointError(RuntimeError):
    """A checkpoint problem with a one-line explanation (bad path, missing step, corruption...)."""


def step_name(step: int) -> str:
    """Deterministic directory name of a step: ``step_00001000``."""
    return f"step_{step:08d}"


def parse_step(name: str) -> Optional[int]:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


# ----------------------------------------------------------------- state <-> variables
def _check_key(key: Any, prefix: str) -> str:
    if (not isinstance(key, str) or not key or "/" in key or key.startswith((".", "__"))
            or key == "zarr.json"):
        raise CheckpointError(
            f"invalid state key {key!r} under {prefix or '<root>'!r}: keys must be non-empty "
            "strings without '/', not starting with '.' or '__'")
    return key


def flatten(state: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"params": {"w": x}}`` -> ``{"params/w": x}`` (leaves untouched, order kept)."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"state must be a dict of arrays, got {type(state).__name__}")
    out: Dict[str, Any] = {}
    for key, value in state.items():
        path = f"{prefix}{_check_key(key, prefix)}"
        if isinstance(value, Mapping):
            out.update(flatten(value, path + "/"))
        else:
            out[path] = value
    return out


def unflatten(flat: Mapping[str, Any]) -> Dict[str, Any]:
    """Inverse of :func:`flatten`."""
    out: Dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def leaf_to_array(path: str, value: Any) -> Tuple[np.ndarray, str]:
    """A leaf as a (possibly shared, not copied) ndarray plus its restore kind."""
    kind = _PY_KINDS.get(type(value), "array")
    try:
        arr = np.asarray(value)  # tf.Variable / tf.Tensor / jax arrays implement __array__
    except Exception as e:  # noqa: BLE001 - report any conversion failure in one line
        raise CheckpointError(f"variable {path!r}: cannot convert {type(value).__name__} "
                              f"to an array: {e}") from None
    if arr.dtype.kind not in _ALLOWED_DTYPE_KINDS:
        raise CheckpointError(
            f"variable {path!r} has unsupported dtype {arr.dtype} ({type(value).__name__}); "
            "valid: bool, int, uint, float, complex arrays (put strings/config in metadata)")
    return arr, kind


def restore_leaf(arr: np.ndarray, kind: str) -> Any:
    if kind == "array":
        return arr
    return {"bool": bool, "int": int, "float": float}[kind](arr.item())


def select_paths(available: Sequence[str], select: Optional[Iterable[str]]) -> List[str]:
    """Variables named by ``select``: exact paths or '/'-boundary prefixes like ``"params"``."""
    if select is None:
        return list(available)
    if isinstance(select, str):
        select = [select]
    chosen: List[str] = []
    for sel in select:
        sel = sel.strip("/")
        hits = [p for p in available if p == sel or p.startswith(sel + "/")]
        if not hits:
            raise CheckpointError(f"no variable matches {sel!r}; valid: {_preview(available)}")
        chosen.extend(h for h in hits if h not in chosen)
    return chosen


def _preview(items: Sequence[Any], n: int = 12) -> str:
    items = list(items)
    more = f", ... ({len(items) - n} more)" if len(items) > n else ""
    return "[" + ", ".join(map(str, items[:n])) + more + "]"


def chunk_shape(shape: Sequence[int], itemsize: int, target_bytes: int) -> Tuple[int, ...]:
    """Regular chunk grid: halve the longest chunk axis until a chunk is <= target_bytes.

    Chunks are the unit of parallel writes and of partial reads, so a 10 MB
    kernel with a 4 MiB target becomes 4 chunks written by 4 workers.
    """
    chunks = [max(1, int(s)) for s in shape]
    while math.prod(chunks) * itemsize > target_bytes and max(chunks) > 1:
        axis = int(np.argmax(chunks))
        chunks[axis] = (chunks[axis] + 1) // 2
    return tuple(chunks)


def group_document(attributes: Optional[dict] = None) -> bytes:
    return json.dumps({"zarr_format": 3, "node_type": "group",
                       "attributes": attributes or {}}, indent=1).encode()


# --------------------------------------------------------------------- storage access
class Location:
    """The checkpoint root on a local disk or an fsspec filesystem, with the few ops we need."""

    def __init__(self, fs: Any, root: str, local: bool):
        self.fs, self.root, self.local = fs, root.rstrip("/") or "/", local

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.path(*parts))

    def read_json(self, *parts: str) -> dict:
        return json.loads(self.fs.cat_file(self.path(*parts)))

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """Atomic, durable whole-object write (``urls.write_atomic``)."""
        urls.write_atomic(self.fs, self.path(*parts), data)

    def remove_step(self, name: str) -> None:
        """Uncommit (drop the marker) first, so a crash mid-delete leaves an invisible dir."""
        marker = self.path(name, "zarr.json")
        if self.fs.exists(marker):
            self.fs.rm_file(marker)
        if self.fs.exists(self.path(name)):
            self.fs.rm(self.path(name), recursive=True)

    def step_dirs(self) -> Dict[int, bool]:
        """{step: committed} for every ``step_*`` entry under the root."""
        if not self.fs.exists(self.root):
            return {}
        out = {}
        for entry in self.fs.ls(self.root, detail=False):
            step = parse_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if step is not None:
                out[step] = self.fs.exists(f"{entry.rstrip('/')}/zarr.json")
        return out
