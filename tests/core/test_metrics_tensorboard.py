"""core.metrics writes a record's scalars as one raw summary: TensorBoard must read exactly what
``tf.summary.scalar`` wrote value by value (same steps, tags, plugin, dtype, shape and values)."""
from tb_events import read_summaries


def _events(directory):
    """(step, tag, plugin, data class, dtype, shape, value bytes) of every summary value: compared exactly."""
    return [tuple(v)[:7] for v in read_summaries(str(directory))]


RECORDS = [(0, {"rows": 4096, "write_s": 0.1, "loss": 1e-30, "big": 3.4e38, "neg": -2.5, "ok": True, "name": "s"}),
           (7, {"rows": 8192, "write_s": 1 / 3, "inf": float("inf")}),
           (2 ** 31 + 5, {"rows": 0, "frac": 0.7})]


def test_one_raw_summary_per_record_reads_back_as_tf_summary_scalar_values(tmp_path):
    import tensorflow as tf
    from core.metrics import MetricsLogger
    log = MetricsLogger(str(tmp_path / "new"))
    for step, values in RECORDS:
        log.write("commit", step=step, **values)
    log.close()
    writer = tf.summary.create_file_writer(str(tmp_path / "old"))     # the way it was written before
    for step, values in RECORDS:
        with writer.as_default(step=step):
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    tf.summary.scalar(f"commit/{k}", float(v))
    writer.close()
    new, old = _events(tmp_path / "new" / "tb"), _events(tmp_path / "old")
    assert len(new) == 10 and new == old
    assert [(s, t) for s, t, *_ in new][:3] == [(0, "commit/rows"), (0, "commit/write_s"), (0, "commit/loss")]
    assert new[0][2:6] == ("scalars", 0, "float32", ())       # data_class unset, as tf.summary.scalar
