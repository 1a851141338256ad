"""MetricsLogger on an object store: records reach the store while the run goes on, not only at close."""
import json

from test_run_lock import s3_url  # noqa: F401 - the moto fixture

from core import urls
from core.metrics import MetricsLogger, read_metrics


def _stored(url):
    """The records another process would read from the store now (a fresh filesystem, no caches)."""
    fs, path = urls.resolve(url)
    fs.invalidate_cache()
    if not fs.exists(f"{path}/metrics.jsonl"):
        return []
    return [json.loads(line) for line in fs.cat_file(f"{path}/metrics.jsonl").decode().splitlines()]


def test_records_are_uploaded_every_publish_period_not_only_at_close(s3_url):  # noqa: F811
    log = MetricsLogger(s3_url, publish_s=0.0)      # upload at every write
    log.write("a", step=1, x=1)
    log.write("b", step=2, x=2)
    assert [r["kind"] for r in _stored(s3_url)] == ["a", "b"]    # visible before close (a killed trainer keeps them)
    log.close()
    with MetricsLogger(s3_url) as again:            # a resumed trainer appends
        again.write("c", step=3, x=3)
    assert [(r["kind"], r["x"]) for r in read_metrics(s3_url)] == [("a", 1), ("b", 2), ("c", 3)]
    # (one test, one server: fsspec keeps one S3 filesystem per endpoint settings for the process)
    other = urls.join(s3_url, "long")
    log = MetricsLogger(other, publish_s=3600.0)
    log.write("a", step=1, x=1)
    assert _stored(other) == []                      # fsspec uploads an appended file when it is closed
    log.close()
    assert [r["kind"] for r in _stored(other)] == ["a"]
