"""Read TensorBoard event files back in tests: every summary value of every event, in file order.

One reader for the tests that check what :class:`core.metrics.MetricsLogger` writes to TensorBoard::

    values = read_summaries(str(tmp_path / "tb"))      # events.out.tfevents.* in name order
    [(v.step, v.tag, v.scalar) for v in values]         # e.g. [(0, "commit/rows", 0.0), ...]
"""
import glob
from typing import List, NamedTuple, Tuple


class SummaryValue(NamedTuple):
    step: int
    tag: str
    plugin: str            # metadata.plugin_data.plugin_name ("scalars" for tf.summary.scalar)
    data_class: int        # metadata.data_class (1: DATA_CLASS_SCALAR)
    dtype: str             # the tensor's dtype name, e.g. "float32"
    shape: Tuple[int, ...]
    data: bytes            # the tensor's values as bytes (exact comparison)
    scalar: float          # the tensor's value as a Python float (a 0-d tensor)


def read_summaries(directory: str) -> List[SummaryValue]:
    """Every summary value in ``directory``'s ``events.out.tfevents.*`` files (sorted by name), in order."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2
    out = []
    for path in sorted(glob.glob(f"{directory}/events.out.tfevents.*")):
        for raw in tf.data.TFRecordDataset(path):
            event = event_pb2.Event.FromString(raw.numpy())
            for v in event.summary.value:
                array = tf.make_ndarray(v.tensor)
                out.append(SummaryValue(event.step, v.tag, v.metadata.plugin_data.plugin_name,
                                        v.metadata.data_class, tf.dtypes.as_dtype(v.tensor.dtype).name,
                                        tuple(array.shape), array.tobytes(),
                                        float(array) if array.size == 1 else float("nan")))
    return out
