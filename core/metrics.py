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
    """Append-only JSONL metrics with optional TensorBoard mirroring."""

    def __init__(self, run_dir: str, tensorboard: bool = True):
        self.run_dir = urls.normalize(run_dir)
        fs, path = urls.resolve(self.run_dir)
        fs.makedirs(path, exist_ok=True)
        self._file = fs.open(f"{path}/metrics.jsonl", "a")
        self._tb = None
        if tensorboard and not urls.is_remote(self.run_dir) and urls.scheme_of(self.run_dir) == "file":
            try:
                import tensorflow as tf
                self._tb = tf.summary.create_file_writer(urls.join(self.run_dir, "tb"))
            except ImportError:
                self._tb = None

    def write(self, kind: str, step: Optional[int] = None, **values: Any) -> Dict[str, Any]:
        record = {"kind": kind, "time": time.time()}
        if step is not None:
            record["step"] = int(step)
        record.update(_jsonable(values))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None and step is not None:
            import tensorflow as tf
            with self._tb.as_default(step=int(step)):
                for k, v in values.items():
                    if isinstance(v, numbers.Number) and not isinstance(v, bool):
                        tf.summary.scalar(f"{kind}/{k}", float(v))
        return record

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.flush()
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
