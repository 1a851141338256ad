"""One metrics logger for every stage: JSONL (always) + TensorBoard (learner side).

Each record is one JSON line ``{"kind": ..., "time": ..., **values}`` in
``<run_dir>/metrics.jsonl``. Scalars are mirrored as TensorBoard summaries in
``<run_dir>/tb/`` when TensorFlow is importable and the run dir is local
(``tensorboard --logdir runs/``). Non-scalar values go to JSONL only.

Example::

    with MetricsLogger("runs/a") as log:
        log.write("learner", step=100, loss=0.3, steps_per_s=812.0)
    read_metrics("runs/a", kind="learner")[0]["loss"]   # 0.3
"""
from __future__ import annotations

import json
import numbers
import queue
import threading
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


class MetricsLogger:
    """Append-only JSONL metrics with optional TensorBoard mirroring.

    The JSONL line is written and flushed before ``write`` returns (what the
    run's tools and ``--resume`` read). The TensorBoard scalars, one eager TF op
    each (milliseconds per record on a busy CPU, on the driver's per-block path),
    are written by one background thread in record order; ``close`` waits for
    them and re-raises the thread's first error.
    """

    def __init__(self, run_dir: str, tensorboard: bool = True):
        self.run_dir = urls.normalize(run_dir)
        fs, path = urls.resolve(self.run_dir)
        fs.makedirs(path, exist_ok=True)
        self._file = fs.open(f"{path}/metrics.jsonl", "a")
        self._tb = None
        self._tb_queue: Optional[queue.SimpleQueue] = None
        self._tb_thread: Optional[threading.Thread] = None
        self._tb_error: Optional[BaseException] = None
        if tensorboard and not urls.is_remote(self.run_dir) and urls.scheme_of(self.run_dir) == "file":
            try:
                import tensorflow as tf
                self._tb = tf.summary.create_file_writer(urls.join(self.run_dir, "tb"))
            except ImportError:
                self._tb = None
            else:
                self._tb_queue = queue.SimpleQueue()
                self._tb_thread = threading.Thread(target=self._tb_loop, name="metrics-tensorboard", daemon=True)
                self._tb_thread.start()

    def write(self, kind: str, step: Optional[int] = None, **values: Any) -> Dict[str, Any]:
        record = {"kind": kind, "time": time.time()}
        if step is not None:
            record["step"] = int(step)
        record.update(_jsonable(values))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb_queue is not None and step is not None:
            scalars = [(f"{kind}/{k}", float(v)) for k, v in values.items()
                       if isinstance(v, numbers.Number) and not isinstance(v, bool)]
            if scalars:
                self._tb_queue.put((int(step), scalars))
        return record

    def _tb_loop(self) -> None:
        import tensorflow as tf
        while True:
            item = self._tb_queue.get()
            if item is None:
                return
            if self._tb_error is not None:
                continue                     # keep draining: close() reports the first error
            step, scalars = item
            try:
                with self._tb.as_default(step=step):
                    for name, v in scalars:
                        tf.summary.scalar(name, v)
            except Exception as e:  # noqa: BLE001 - re-raised by close()
                self._tb_error = e

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            if self._tb_thread is not None:
                self._tb_queue.put(None)
                self._tb_thread.join()
                self._tb_thread = self._tb_queue = None
            self._tb.flush()
            self._tb.close()
            self._tb = None
        if self._tb_error is not None:
            error, self._tb_error = self._tb_error, None
            raise error

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
