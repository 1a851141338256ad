"""Chunk completeness: every chunk a zarr array's shape implies must be stored.

zarr reads a chunk that is not stored as the array's ``fill_value``. That is
an optimisation for sparse arrays, but for replay shards and checkpoints it
turns lost data (a deleted or never-copied chunk file) into silent zeros.
DataBloom's writers therefore store every chunk, even one equal to the fill
value (tensorstore ``store_data_equal_to_fill_value``, zarr-python
``write_empty_chunks``), and readers compare the keys the chunk grid implies
with the keys actually stored. One listing per shard or checkpoint step
(``stored_keys``) serves all of its arrays, so the check costs one ``ls -R``
(one LIST request per 1,000 keys on object stores), not one request per chunk.

Example::

    keys = stored_keys(fs, "runs/a/replay/shards/s00000001")   # {"observation/c/0/0", ...}
    missing_chunk(zarr_array, keys, "observation")             # None, or "c/3/0"
"""
from __future__ import annotations

from typing import Any, Iterator, Optional, Set

import numpy as np


def stored_keys(fs: Any, root: str) -> Set[str]:
    """Every file under ``root`` as a path relative to it (``"observation/c/0/0"``)."""
    root = root.rstrip("/")
    try:
        found = fs.find(root)
    except (FileNotFoundError, NotADirectoryError):
        return set()
    # fsspec may return the root with or without a leading "/" (memory://): strip either form.
    prefixes = (root + "/", root.lstrip("/") + "/", "/" + root.lstrip("/") + "/")
    out = set()
    for path in found:
        for prefix in prefixes:
            if path.startswith(prefix):
                out.add(path[len(prefix):])
                break
    return out


def expected_keys(array) -> Iterator[str]:
    """The chunk keys (``c/0/0``, ...) of every chunk of a zarr v3 ``array``'s chunk grid."""
    for coords in np.ndindex(*array.cdata_shape):
        yield array.metadata.encode_chunk_key(coords)


def missing_chunk(array, stored: Set[str], array_path: str) -> Optional[str]:
    """The first chunk key of ``array`` (at ``array_path`` relative to the listing) not in ``stored``."""
    prefix = f"{array_path.strip('/')}/" if array_path.strip("/") else ""
    for key in expected_keys(array):
        if prefix + key not in stored:
            return key
    return None
