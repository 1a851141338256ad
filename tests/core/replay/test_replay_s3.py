"""ReplayStore on s3:// against a local S3 server (moto): data through s3fs, log entries through tensorstore.

The commit log's exclusive create on S3 is tensorstore's kvstore write with
``if_equal`` = the "no value" generation, which tensorstore sends as
``PUT`` with ``If-None-Match: *`` (S3 answers 412 if the key exists). Both
clients find the server through ``AWS_ENDPOINT_URL`` (core.urls.s3_endpoint_options
for tensorstore, botocore itself for s3fs).

The server is moto's ``ThreadedMotoServer`` with one wrapper around its WSGI app
that (a) records every request (method, path, If-None-Match, status), so the tests
can show which requests the log entries took, and (b) handles PUTs one at a time:
moto checks ``If-None-Match`` and stores the object in two steps without a lock,
while S3 decides a conditional PUT atomically per key. With (b) the server models
S3; without it a rare thread switch inside moto could let two creates both succeed.
Needs moto >= 5.0.15 (older moto ignores If-None-Match on PUT: the direct create check fails).
"""
import logging
import multiprocessing
import threading
import uuid

import numpy as np
import pytest

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")

from replay_fakes import random_batch
from core import urls
from core.replay import ReplayStore
from core.replay.commit_log import TensorstoreCreator, _creator_for, entry_name

REGION = "us-east-1"
WORKERS, COMMITS_PER_WORKER = 4, 10


class _RecordingApp:
    """WSGI wrapper: records (client, method, path, If-None-Match, status); PUTs are handled one at a time."""

    def __init__(self, app):
        self.app, self.requests, self._put_lock = app, [], threading.Lock()

    def __call__(self, environ, start_response):
        client = environ.get("HTTP_USER_AGENT", "").split("/", 1)[0]  # "tensorstore", "aiobotocore", ...
        record = [client, environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                  environ.get("HTTP_IF_NONE_MATCH"), None]

        def start(status, headers, *args):
            record[4] = int(status.split()[0])
            return start_response(status, headers, *args)
        try:
            if record[1] == "PUT":
                with self._put_lock:
                    return self.app(environ, start)
            return self.app(environ, start)
        finally:
            self.requests.append(tuple(record))

    def log_entry_requests(self, bucket):
        """(method, key, If-None-Match, status) of tensorstore's requests for log entries of ``bucket``.

        (s3fs reads entries too, with GET and HEAD; those are left out.)
        """
        prefix = f"/{bucket}/"
        return [(m, p[len(prefix):], inm, s) for c, m, p, inm, s in list(self.requests)
                if c == "tensorstore" and p.startswith(prefix) and "/log/" in p and p.endswith(".json")]


@pytest.fixture(scope="module")
def s3_server():
    werkzeug_log = logging.getLogger("werkzeug")  # one INFO line per request otherwise
    level = werkzeug_log.level
    werkzeug_log.setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    recorder = _RecordingApp(server._server.app)
    server._server.app = recorder  # werkzeug's handler calls server.app per request
    host, port = server.get_host_and_port()
    recorder.endpoint = f"http://{host}:{port}"
    yield recorder
    server.stop()
    werkzeug_log.setLevel(level)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch):
    """A fresh bucket on the moto server; the AWS variables point s3fs and tensorstore at it."""
    import s3fs
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_REGION",
                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_REGION", REGION)
    s3fs.S3FileSystem.clear_instance_cache()  # instances made before the variables were set
    bucket = f"replay-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server.endpoint, region_name=REGION).create_bucket(Bucket=bucket)
    yield bucket
    s3fs.S3FileSystem.clear_instance_cache()


def _keys(bucket, prefix=""):
    client = boto3.client("s3", region_name=REGION)  # endpoint from AWS_ENDPOINT_URL, as s3fs finds it
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_s3_endpoint_options_follow_the_aws_variables(monkeypatch):
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    assert urls.s3_endpoint_options() == {}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert urls.s3_endpoint_options() == {}  # AWS S3 itself: tensorstore finds the bucket's region
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://all:1/")
    assert urls.s3_endpoint_options() == {"endpoint": "http://all:1", "aws_region": "eu-west-1"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3only:2")
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    assert urls.s3_endpoint_options() == {"endpoint": "http://s3only:2", "aws_region": "us-west-2"}
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert urls.s3_endpoint_options() == {}


@pytest.mark.slow
def test_write_commit_and_read_back_on_s3(s3_bucket, s3_server):
    url = f"s3://{s3_bucket}/replay"
    store = ReplayStore.open_or_create(url, env_id="CartPole-v1")
    batches = [random_batch(0), random_batch(1)]
    a = store.write_shard("r0-g0", batches[:1])
    b = store.write_shard("r0-g1", batches[1:])
    assert store.latest_version() == 0 and store.snapshot().shards == []  # written, not committed
    assert store.commit([a.id, b.id], meta={"round": 0}) == 1
    reopened = ReplayStore.open(url)
    assert reopened.env_id == "CartPole-v1" and reopened.latest_version() == 1
    snap = reopened.snapshot()
    assert [s.id for s in snap.shards] == ["r0-g0", "r0-g1"] and snap.num_rows == 512
    rows = [x.flat_rows() for x in batches]
    for name in ("observation", "action", "reward", "discount", "terminated", "truncated", "episode_id",
                 "step", "policy_version", "extras/logits"):
        np.testing.assert_array_equal(snap.field(name).compute(), np.concatenate([r[name] for r in rows]))
    assert reopened.log.entry(1)["meta"] == {"round": 0}
    # Shard chunks are written by tensorstore's own s3 kvstore (the default engine), markers by s3fs.
    puts = [(c, p) for c, m, p, _, st in list(s3_server.requests)
            if m == "PUT" and p.startswith(f"/{s3_bucket}/replay/shards/r0-g0/") and st == 200]
    assert {c for c, p in puts if "/c/" in p} == {"tensorstore"} and len([p for c, p in puts if "/c/" in p]) >= 10
    assert [c for c, p in puts if p.endswith("/r0-g0/zarr.json")] == ["aiobotocore"]
    # Everything is on the S3 server: marker and log entry (tensorstore), shards.
    keys = _keys(s3_bucket, "replay/")
    assert [k for k in keys if not k.startswith("replay/shards/")] == [
        "replay/log/00000000000000000001.json", "replay/replay.json"]
    assert "replay/shards/r0-g0/zarr.json" in keys and "replay/shards/r0-g1/reward/zarr.json" in keys
    # The entry was created by one conditional PUT (tensorstore 0.1.86 HEADs it first, not counted here).
    assert [r for r in s3_server.log_entry_requests(s3_bucket) if r[0] == "PUT"] == [
        ("PUT", "replay/log/00000000000000000001.json", "*", 200)]


def test_commit_twice_is_idempotent_and_versioned_on_s3(s3_bucket):
    url = f"s3://{s3_bucket}/replay"
    store = ReplayStore.open_or_create(url)
    a = store.write_shard("r0-g0", [random_batch(0, T=16)])
    b = store.write_shard("r1-g0", [random_batch(1, T=16)])
    assert store.commit([a.id]) == 1
    assert store.commit([a.id]) == 1  # no-op: no second entry
    assert store.commit([a.id, b.id]) == 2  # only b is added
    assert store.commit([b.id]) == 2 and store.commit([a.id, b.id]) == 2
    other = ReplayStore.open(url)  # another client sees the same log
    assert other.latest_version() == 2
    assert [e["shards"] for e in (other.log.entry(1), other.log.entry(2))] == [[a.to_json()], [b.to_json()]]
    assert [s.id for s in other.snapshot().shards] == ["r0-g0", "r1-g0"]
    assert [s.id for s in other.snapshot(1).shards] == ["r0-g0"]
    assert _keys(s3_bucket, "replay/log/") == ["replay/log/00000000000000000001.json",
                                               "replay/log/00000000000000000002.json"]


def test_exclusive_create_refuses_a_second_create_on_s3(s3_bucket, s3_server):
    url = f"s3://{s3_bucket}/replay"
    fs, path = urls.resolve(urls.join(url, "log"))
    creator = _creator_for(url, fs, path)
    assert isinstance(creator, TensorstoreCreator)
    assert creator.kv.spec().to_json()["endpoint"] == s3_server.endpoint
    name = entry_name(1)
    assert creator.create(name, b"first") is True
    assert creator.create(name, b"second") is False
    assert _creator_for(url, fs, path).create(name, b"third") is False  # another client, same answer
    # Without tensorstore's HEAD check, the server's answer to the conditional PUT refuses it (412).
    direct = TensorstoreCreator({"driver": "s3", "bucket": s3_bucket, "path": "replay/log/",
                                 "use_conditional_write": True, **urls.s3_endpoint_options()})
    assert direct.create(name, b"fourth") is False
    assert direct.create(entry_name(2), b"other") is True
    client = boto3.client("s3", region_name=REGION)
    assert client.get_object(Bucket=s3_bucket, Key=f"replay/log/{name}")["Body"].read() == b"first"
    key1, key2 = f"replay/log/{name}", f"replay/log/{entry_name(2)}"
    requests = s3_server.log_entry_requests(s3_bucket)
    # Every PUT was conditional; one succeeded per entry, so nothing overwrote "first". (With a
    # custom endpoint tensorstore 0.1.86 first HEADs the entry and skips the PUT if it exists:
    # the 2nd and 3rd creates ended there, with HEAD -> 412.)
    assert [r for r in requests if r[0] == "PUT" and r[3] == 200] == [("PUT", key1, "*", 200),
                                                                      ("PUT", key2, "*", 200)]
    assert all(inm == "*" for method, _, inm, _ in requests if method == "PUT")
    assert ("PUT", key1, "*", 412) in requests  # the direct creator's create, refused by S3 itself


def _commit_worker(url, template_keys, worker, barrier, results):
    """Make this worker's shards, wait for all workers, then commit them one by one."""
    try:
        bucket = url.split("://", 1)[1].split("/", 1)[0]
        client = boto3.client("s3", region_name=REGION)
        ids = [f"w{worker}-s{i:02d}" for i in range(COMMITS_PER_WORKER)]
        for sid in ids:  # server-side copies of a written shard: complete shards, ~33 requests each
            for key in template_keys:
                client.copy_object(Bucket=bucket, Key=key.replace("/t0/", f"/{sid}/"),
                                   CopySource={"Bucket": bucket, "Key": key})
        store = ReplayStore.open(url)
        barrier.wait(timeout=120)
        results.put((worker, [(sid, store.commit([sid])) for sid in ids]))
    except BaseException as e:  # reported to the test instead of a bare exit code
        results.put((worker, f"{type(e).__name__}: {e}"))
        raise


@pytest.mark.slow
def test_concurrent_processes_commit_each_shard_exactly_once_on_s3(s3_bucket, s3_server):
    """4 processes x 10 commits at once: every shard once, versions 1..40, no entry overwritten.

    The 40 shards are server-side copies of one shard written by ReplayStore.write_shard
    (writing each through zarr costs ~200 requests, ~1 s on moto; copying ~33); the
    commits (shard info read, log append with conditional create) are the real path.
    """
    url = f"s3://{s3_bucket}/replay"
    template = ReplayStore.open_or_create(url).write_shard("t0", [random_batch(7, T=4, E=2)])
    template_keys = _keys(s3_bucket, "replay/shards/t0/")
    ctx = multiprocessing.get_context("spawn")  # tensorstore's threads do not survive fork
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_commit_worker, args=(url, template_keys, w, barrier, results))
             for w in range(WORKERS)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=240) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert all(isinstance(v, list) for v in got.values()), got
    assert [p.exitcode for p in procs] == [0] * WORKERS
    n = WORKERS * COMMITS_PER_WORKER
    for worker, committed in got.items():
        versions = [v for _, v in committed]
        assert versions == sorted(versions) and len(set(versions)) == COMMITS_PER_WORKER, (worker, versions)
    # Every commit got its own version, 1..n: no version was given to two committers.
    assert sorted(v for committed in got.values() for _, v in committed) == list(range(1, n + 1))
    store = ReplayStore.open(url)
    state = store.state()
    expected = {f"w{w}-s{i:02d}" for w in range(WORKERS) for i in range(COMMITS_PER_WORKER)}
    assert state.version == n and set(state.live) == expected and state.rows == n * template.rows
    by_version = {v: sid for committed in got.values() for sid, v in committed}
    entries = [store.log.entry(v) for v in range(1, n + 1)]
    assert [(e["version"], [s["id"] for s in e["shards"]]) for e in entries] == [
        (v, [by_version[v]]) for v in range(1, n + 1)]
    assert len({e["writer"] for e in entries}) == WORKERS
    assert _keys(s3_bucket, "replay/log/") == [f"replay/log/{entry_name(v)}" for v in range(1, n + 1)]
    # Each entry was created by exactly one successful conditional PUT; the rest got 412 (HEAD or PUT).
    requests = s3_server.log_entry_requests(s3_bucket)
    puts = [(key, status) for method, key, inm, status in requests if method == "PUT"]
    assert all(inm == "*" for method, _, inm, _ in requests if method == "PUT")
    assert sorted(key for key, status in puts if status == 200) == _keys(s3_bucket, "replay/log/")
    assert {status for *_, status in requests} <= {200, 404, 412}
    # The processes did race: creates were refused (typically ~60 a run), ~20 of them by S3's 412 to
    # the PUT itself (both committers' HEADs had found the entry missing).
    assert any(status == 412 for *_, status in requests), "no commit conflicted: the test did not race"
    assert any(status == 412 for _, status in puts), "no conditional PUT was refused: the test did not race"


def test_environment_credentials_skip_the_sdk_chains_file_lookups(monkeypatch):
    """Keys in the environment: tensorstore is told to use them alone (no ~/.aws/config lookups, whose
    absence the AWS SDK logs as errors); without them, its default chain (profiles, roles) stays."""
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    assert "aws_credentials" not in urls.kvstore_spec("s3://bucket/run")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    assert "aws_credentials" not in urls.kvstore_spec("s3://bucket/run")     # half a key pair: the chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    assert urls.kvstore_spec("s3://bucket/run")["aws_credentials"] == {"type": "environment"}
    assert "aws_credentials" not in urls.kvstore_spec("gs://bucket/run")



def test_a_log_reopened_with_entries_sees_its_own_later_commits_on_s3(s3_bucket):
    """A resumed trainer opens a log that already has entries: its first read lists the log folder, and
    s3fs kept that listing (its directory cache), so every later entry looked absent to this process (a
    size probe before each read answers from the cache): its commits after the first all "conflicted"
    with the entry it had just made ("could not commit ... after 10000 conflicting attempts")."""
    from core.replay.commit_log import CommitLog
    url = f"s3://{s3_bucket}/run/replay"
    first = CommitLog(url)
    for i in range(2):
        first.append(lambda state, i=i: {"op": "remove", "shards": [f"s{i}"], "reason": "test"})
    resumed = CommitLog(url)                     # as in a new process: the folder is listed once, with 1..2
    assert resumed.state().version == 2
    assert resumed.append(lambda s: {"op": "remove", "shards": ["s2"], "reason": "test"}, max_attempts=3) == 3
    assert resumed.state().version == 3
    assert resumed.append(lambda s: {"op": "remove", "shards": ["s3"], "reason": "test"}, max_attempts=3) == 4
    assert CommitLog(url).state().version == 4
