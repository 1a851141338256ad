"""Parquet export: one Arrow dataset, one row per stored step, typed columns, self-describing schema.

Layout of ``PATH``::

    part-00000.parquet ...    one file per store shard that episodes start in; every episode
                              whole in one file, its rows in step order (sorted by episode, step)
    _common_metadata          the dataset's schema (Dask and Spark read it; readers skip ``_`` files)
    _export.json              the export summary (rows, episodes, source)

Columns: every stored field (``episode_id``, ``step``, ``policy_version``,
``observation``, ``action``, ``reward``, ``discount``, ``terminated``,
``truncated``, ``extras/<name>``) plus ``is_first``, ``is_last``,
``is_terminal``. A field with row shape ``(a, b)`` is a nested
``FixedSizeList<FixedSizeList<dtype, b>, a>`` column of its own dtype, so
its values are one contiguous buffer: ``column.flatten(recursive=True).to_numpy()``
is the ``[rows * a * b]`` array, without a copy per row. Every file has the
same schema, whose metadata key ``databloom`` holds JSON with the env id,
each field's dtype and shape, the source store and commit-log version and
the DataBloom version. Load with::

    pyarrow.dataset.dataset(PATH)   pandas.read_parquet(PATH)   dask.dataframe.read_parquet(PATH)
"""
from __future__ import annotations

import json
from typing import Any, Dict, List

import numpy as np

from core import urls
from core.dataset.ownership import owned_episodes

#: Rows buffered before a row group is written (bounds a task's Arrow copy of its rows).
ROW_GROUP_ROWS = 1 << 16
FLAG_COLUMNS = ("is_first", "is_last", "is_terminal")
METADATA_KEY = b"databloom"


def _arrow_type(dtype: str, shape: List[int]):
    import pyarrow as pa
    t = pa.from_numpy_dtype(np.dtype(dtype))
    for width in reversed(shape):
        t = pa.list_(t, int(width))
    return t


def schema(source: Dict[str, Any]):
    """The dataset's Arrow schema: stored fields in shard order, then the step flags; metadata ``databloom``."""
    import pyarrow as pa
    fields = source["fields"]
    cols = [pa.field(n, _arrow_type(s["dtype"], s["shape"]), nullable=False) for n, s in fields.items()]
    cols += [pa.field(f, pa.bool_(), nullable=False) for f in FLAG_COLUMNS]
    shapes = {**fields, **{f: {"dtype": "bool", "shape": []} for f in FLAG_COLUMNS}}
    meta = {**{k: v for k, v in source.items() if k != "fields"}, "fields": shapes}
    return pa.schema(cols, metadata={METADATA_KEY: json.dumps(meta).encode()})


def column(values: np.ndarray, arrow_type):
    """``[n, a, b]`` numpy -> ``FixedSizeList<FixedSizeList<t, b>, a>`` Arrow array (no copy for numbers)."""
    import pyarrow as pa
    arr = pa.array(np.ascontiguousarray(values).reshape(-1))
    for width in reversed(values.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, int(width))
    return arr.cast(arrow_type) if arr.type != arrow_type else arr


def _table(batch: List[Dict[str, np.ndarray]], arrow_schema):
    import pyarrow as pa
    rows = {n: np.concatenate([b[n] for b in batch]) for n in arrow_schema.names}
    return pa.Table.from_arrays([column(rows[f.name], f.type) for f in arrow_schema], schema=arrow_schema)


def write_shard(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: the episodes (complete or not) one store shard owns -> ``part-<file_index>.parquet``.

    Returns the file's row and episode counts, the rows read back from the
    written file's footer (what a reader will see).
    """
    import pyarrow.parquet as pq
    arrow_schema = schema(item["source"])
    name = f"part-{item['file_index']:05d}.parquet"
    fs, path = urls.resolve(urls.join(item["staging"], name))
    episodes, complete, batch, buffered = 0, 0, [], 0
    with fs.open(path, "wb") as f, pq.ParquetWriter(f, arrow_schema) as writer:
        for ep, rows in owned_episodes(item):
            episodes += 1
            complete += ep["complete"]
            batch.append(rows)
            buffered += len(rows["reward"])
            if buffered >= ROW_GROUP_ROWS:
                writer.write_table(_table(batch, arrow_schema))
                batch, buffered = [], 0
        if batch:
            writer.write_table(_table(batch, arrow_schema))
    with fs.open(path, "rb") as f:
        written = pq.ParquetFile(f).metadata.num_rows
    return {"file_index": item["file_index"], "file": name, "rows": int(written), "episodes": episodes,
            "complete": complete,
            "bytes": int(fs.size(path))}


def write_dataset_metadata(staging: str, source: Dict[str, Any], res: Dict[str, Any]) -> None:
    """Driver: ``_common_metadata``, the schema every file shares."""
    import pyarrow.parquet as pq
    fs, path = urls.resolve(urls.join(staging, "_common_metadata"))
    with fs.open(path, "wb") as f:
        pq.write_metadata(schema(source), f)
