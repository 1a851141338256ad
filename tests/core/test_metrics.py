"""The metrics logger: JSONL written at once, TensorBoard scalars mirrored in record order."""
import json

from tb_events import read_summaries


def _tb_scalars(run_dir):
    return [(v.step, v.tag, v.scalar) for v in read_summaries(f"{run_dir}/tb")]


def test_jsonl_is_written_at_once_and_tensorboard_gets_every_numeric_scalar_in_order(tmp_path):
    from core.metrics import MetricsLogger, read_metrics
    log = MetricsLogger(str(tmp_path))
    for step in range(50):
        log.write("commit", step=step, rows=step * 2, write_s=0.5, ok=True, name="x")
        # the line is on disk when write returns (what --resume and the curve tools read)
        assert read_metrics(str(tmp_path), kind="commit")[-1]["rows"] == step * 2
    log.write("config", config={"a": 1})          # no step: JSONL only
    log.close()
    scalars = _tb_scalars(str(tmp_path))
    # bools and strings are not scalars; two numeric fields per record, in record order
    assert scalars == [(s, tag, v) for s in range(50)
                       for tag, v in (("commit/rows", s * 2.0), ("commit/write_s", 0.5))]
    with open(tmp_path / "metrics.jsonl") as f:
        assert [json.loads(line)["kind"] for line in f] == ["commit"] * 50 + ["config"]
