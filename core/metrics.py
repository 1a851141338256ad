"""One metrics logger for every stage: JSONL (always) + TensorBoard.

Each record is one JSON line ``{"kind": ..., "time": ..., **values}`` in
``<run_dir>/metrics.jsonl``. Scalars are mirrored as TensorBoard summaries in
``<run_dir>/tb/`` when TensorBoard is importable and the run dir is local
(``tensorboard --logdir runs/``). Non-scalar values go to JSONL only.

On an object store (``s3://``, ``gs://``) there is no append: fsspec uploads
an appended file when it is closed. The logger therefore closes and reopens
the remote file at the first write after every :data:`PUBLISH_S` seconds, so a
trainer killed mid-run loses at most the records of its last ``PUBLISH_S``
seconds, not every record of that attempt.

Example::

    with MetricsLogger("runs/a") as log:
        log.write("learner", step=100, loss=0.3, steps_per_s=812.0)
    read_metrics("runs/a", kind="learner")[0]["loss"]   # 0.3
"""
from __future__ import annotations

import itertools
import json
import numbers
import os
import socket
import time
from typing import Any, Dict, List, Optional

import numpy as np

from core import urls


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _scalars_event(step: int, scalars: List) -> Any:
    """A record's scalars as one TensorBoard event, holding what ``tf.summary.scalar`` writes value by value.

    TensorBoard's own protos (:class:`EventFile`), not TensorFlow's summary ops: ~0.1 ms a record, not
    ~1 ms (one raw-summary op; 5.3 ms as one ``tf.summary.scalar`` op per value), which the driver pays
    for every block's records, and a driver whose learner is on a worker never imports TensorFlow.
    """
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
    # the metadata tf.summary.scalar writes (no data_class: TensorBoard infers it from the plugin on reading)
    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    shape = tensor_shape_pb2.TensorShapeProto()
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT, tensor_shape=shape, float_val=[value])) for tag, value in scalars])
    return event_pb2.Event(wall_time=time.time(), step=step, summary=summary)


class EventFile:
    """A TensorBoard event file (``events.out.tfevents.*``) as ``tf.summary.create_file_writer`` writes it.

    TensorBoard's record writer (TFRecord framing, masked CRC32C) on a local file; its own
    ``EventFileWriter`` would import TensorFlow for ``tf.io.gfile``. Flushed every
    :data:`TB_FLUSH_S` seconds and on close (TensorFlow's writer: every 120 s).
    """

    def __init__(self, directory: str):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.record_writer import RecordWriter
        os.makedirs(directory, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
                f"{next(_EVENT_FILE_UIDS)}")
        self._writer = RecordWriter(open(os.path.join(directory, name), "wb"))
        self._flushed = time.monotonic()
        self.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

    def write(self, event: Any) -> None:
        self._writer.write(event.SerializeToString())
        if time.monotonic() - self._flushed >= TB_FLUSH_S:
            self._writer.flush()
            self._flushed = time.monotonic()

    def close(self) -> None:
        self._writer.close()


#: Seconds between flushes of a TensorBoard event file.
TB_FLUSH_S = 10.0
_EVENT_FILE_UIDS = itertools.count()     # event files of one process get distinct names

#: Seconds between uploads of a remote metrics file (see the module docstring).
PUBLISH_S = 10.0


class MetricsLogger:
    """Append-only JSONL metrics with optional TensorBoard mirroring."""

    def __init__(self, run_dir: str, tensorboard: bool = True, publish_s: float = PUBLISH_S):
        self.run_dir = urls.normalize(run_dir)
        fs, path = urls.resolve(self.run_dir)
        fs.makedirs(path, exist_ok=True)
        self._fs, self._path = fs, f"{path}/metrics.jsonl"
        self._file = fs.open(self._path, "a")
        self._publish_s = publish_s if urls.is_remote(self.run_dir) else None
        self._published = time.monotonic()
        self._tb = None
        if tensorboard and not urls.is_remote(self.run_dir) and urls.scheme_of(self.run_dir) == "file":
            try:
                self._tb = EventFile(f"{path}/tb")
            except ImportError:
                self._tb = None

    def write(self, kind: str, step: Optional[int] = None, **values: Any) -> Dict[str, Any]:
        record = {"kind": kind, "time": time.time()}
        if step is not None:
            record["step"] = int(step)
        record.update(_jsonable(values))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._publish_s is not None and time.monotonic() - self._published >= self._publish_s:
            self.publish()
        if self._tb is not None and step is not None:
            scalars = [(f"{kind}/{k}", float(v)) for k, v in values.items()
                       if isinstance(v, numbers.Number) and not isinstance(v, bool)]
            if scalars:
                self._tb.write(_scalars_event(int(step), scalars))
        return record

    def publish(self) -> None:
        """Upload the records so far to an object store (close the appended file, reopen it)."""
        if self._publish_s is not None:
            self._file.close()
            self._file = self._fs.open(self._path, "a")
            self._published = time.monotonic()

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(run_dir: str, kind: Optional[str] = None) -> List[Dict[str, Any]]:
    """All records of ``run_dir/metrics.jsonl`` (optionally of one kind)."""
    fs, path = urls.resolve(run_dir)
    with fs.open(f"{path}/metrics.jsonl", "r") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if kind is None or r["kind"] == kind]
