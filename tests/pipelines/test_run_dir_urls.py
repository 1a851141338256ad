"""Run directories, stores and datasets named by URL (core.urls.parse / probe, pipelines.cli.check_locations).

Every entry point refuses a malformed location with one ``error:`` line and exit 2 within seconds, and
an object store that cannot be used (no bucket, no or refused credentials, an endpoint that does not
answer) within ``core.urls.PROBE_TIMEOUT_S``; in every case nothing is written in the current or the
home directory. The S3 cases run against moto's server on 127.0.0.1 (no network).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from core import urls

VALID = urls.VALID_FORMS
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


# -- the parser: exact normal forms and refusals ---------------------------------------------------
@pytest.mark.parametrize("given, normal", [
    ("s3://my-bucket/runs/a/", "s3://my-bucket/runs/a"),
    ("S3://my-bucket/runs/a", "s3://my-bucket/runs/a"),
    ("gs://my_bucket.eu/runs", "gs://my_bucket.eu/runs"),
    ("gcs://my-bucket", "gcs://my-bucket"),
    ("memory://x/y/", "memory://x/y"),
    ("file:///tmp/a/../b", "/tmp/b"),
    ("file:///tmp/a:/b", "/tmp/a:/b"),          # the escape for a local folder named with ':/'
    ("/tmp/a:/b", "/tmp/a:/b"),
    ("/tmp//a/", "/tmp/a"),
    ("run:1", os.path.abspath("run:1")),         # a colon alone does not make a URL
])
def test_accepted_locations_and_their_normal_form(given, normal):
    assert urls.parse(given) == normal
    assert urls.parse(normal) == normal          # normal forms parse to themselves
    assert urls.normalize(given) == normal


@pytest.mark.parametrize("given, problem", [
    ("", "is empty"),
    (" runs/a", "has leading or trailing whitespace or a NUL character"),
    ("gs://", "has no bucket"),
    ("s3://", "has no bucket"),
    ("s3:///x", "has no bucket (an empty name before the path)"),
    ("memory://", "is only a scheme"),
    ("gs:", "looks like a URL without '//' (did you mean gs://?)"),
    ("s3:bucket/x", "looks like a URL without '//' (did you mean s3://bucket/x?)"),
    ("s3:/bucket/x", "has one slash after 's3:'; a URL needs two (s3://...)"),
    ("hdfs://nn/x", "has the unsupported URL scheme 'hdfs' (supported: file://, memory://, gs://, gcs://, s3://)"),
    ("file://relative/x", "is not file:// followed by an absolute path"),
    ("s3://Bucket/x", "has an invalid bucket name 'Bucket' (3-63 lower-case letters, digits, '.', '-')"),
    ("gs://a/x", "has an invalid bucket name 'a' (3-63 lower-case letters, digits, '.', '-', '_')"),
    ("s3://bucket//x", "has an empty, '.' or '..' path segment"),
    ("gs://bucket/a/../b", "has an empty, '.' or '..' path segment"),
    ("s3://bucket/x?versionId=1", "has a query or fragment ('?' or '#')"),
    ("runs/gs://bucket/x", "is a relative path that contains ':/' (a URL pasted into a path?); a folder "
                           "really named so is given by its absolute path"),
])
def test_refused_locations_name_the_problem_and_the_valid_forms(given, problem):
    with pytest.raises(urls.LocationError) as err:
        urls.parse(given)
    assert str(err.value) == f"{given!r} {problem}; valid: {VALID}"


def test_local_and_memory_locations_are_not_probed():
    urls.probe("memory://nowhere/x", timeout_s=0.001)
    urls.probe("/nonexistent/run", timeout_s=0.001)


# -- the entry points: one line, exit 2, quickly, nothing written -------------------------------------
def _snapshot(*dirs):
    return {d: sorted(os.listdir(d)) for d in dirs}


def _run_cli(args, tmp_path, env_extra=None, timeout=120):
    """``python -m ARGS`` from an empty cwd with an empty HOME: (rc, stderr lines, seconds, written?)."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(home), PYTHONPATH=ROOT, AWS_EC2_METADATA_DISABLED="true",
               AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"), **(env_extra or {}))
    before = _snapshot(cwd, home)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    seconds = time.monotonic() - t0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return proc.returncode, lines, seconds, _snapshot(cwd, home) != before


ENTRY_POINTS = {   # tool -> arguments with {} where the location goes
    "train --run-dir": ["pipelines.train", "--executor", "local", "--no-progress", "--run-dir", "{}"],
    "train --resume": ["pipelines.train", "--resume", "{}"],
    "train --offline-dataset": ["pipelines.train", "--offline-dataset", "{}", "--run-dir", "r"],
    "process STORE": ["pipelines.process", "stats", "{}"],
    "process --out": ["pipelines.process", "filter", "store", "--min-return", "0", "--out", "{}"],
    "collect RUN_DIR": ["pipelines.collect", "{}", "--episodes", "1", "--out", "o"],
    "collect --out": ["pipelines.collect", "run", "--episodes", "1", "--out", "{}"],
    "evaluate RUN_DIR": ["pipelines.evaluate", "{}"],
    "report RUN_DIR": ["pipelines.report", "{}", "--out", "report"],
}
FLAG = {"train --run-dir": "--run-dir", "train --resume": "--resume", "train --offline-dataset": "--offline-dataset",
        "process STORE": "STORE", "process --out": "--out", "collect RUN_DIR": "RUN_DIR", "collect --out": "--out",
        "evaluate RUN_DIR": "RUN_DIR", "report RUN_DIR": "RUN_DIR"}
MALFORMED = ["gs://", "s3:/bucket/x", "hdfs://nn/x", "runs/s3://bucket/x"]


def _args(tool, location):
    return [location if a == "{}" else a for a in ENTRY_POINTS[tool]]


@pytest.mark.slow
@pytest.mark.parametrize("tool", sorted(ENTRY_POINTS))
def test_every_entry_point_refuses_malformed_locations_at_once(tool, tmp_path):
    for location in MALFORMED:
        rc, lines, seconds, written = _run_cli(_args(tool, location), tmp_path)
        with pytest.raises(urls.LocationError) as err:
            urls.parse(location)
        assert (rc, lines) == (2, [f"error: {FLAG[tool]} {err.value}"]), (tool, location)
        assert seconds < 15, (tool, location, seconds)   # before TensorFlow or an engine is imported
        assert not written, (tool, location)


def test_report_out_must_be_a_local_directory(tmp_path):
    rc, lines, _, written = _run_cli(["pipelines.report", "run", "--out", "s3://my-bucket/report"], tmp_path)
    assert (rc, lines, written) == (2, ["error: --out 's3://my-bucket/report' is a URL; valid: a local directory"],
                                    False)


# -- object stores that cannot be used: one line within the probe's deadline --------------------------
@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on 127.0.0.1 with one bucket, ``runs``; its endpoint URL."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="runs")
    yield endpoint
    server.stop()


@pytest.fixture(scope="module")
def s3_endpoint_with_auth():
    """A second moto server that checks credentials (none are known to it): every request is refused."""
    pytest.importorskip("moto.server")
    port = _free_port()
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="0")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _credentials(endpoint):
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint}


def _store_case(case, s3_endpoint, s3_endpoint_with_auth):
    """(location, environment, the line's problem) for one way an object store cannot be used."""
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    if case == "no bucket":
        return (f"s3://{missing}/r", _credentials(s3_endpoint),
                f"bucket '{missing}' does not exist at the S3 endpoint {s3_endpoint}; valid: an existing bucket")
    if case == "no credentials":
        return ("s3://runs/r", {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_REGION": "us-east-1"},
                "no credentials were found (Unable to locate credentials); valid: AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role")
    if case == "refused credentials":
        return ("s3://runs/r", _credentials(s3_endpoint_with_auth),
                "the store refused these credentials for bucket 'runs' (The AWS Access Key Id you provided does "
                "not exist in our records.); valid: credentials allowed to list it")
    endpoint = f"http://127.0.0.1:{_free_port()}"   # nothing listens there
    return ("s3://runs/r", _credentials(endpoint),
            f"cannot reach the S3 endpoint {endpoint} (EndpointConnectionError); valid: a reachable store")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["no bucket", "no credentials", "refused credentials", "unreachable"])
def test_train_refuses_an_unusable_object_store_within_the_deadline(case, tmp_path, s3_endpoint,
                                                                    s3_endpoint_with_auth):
    location, env, problem = _store_case(case, s3_endpoint, s3_endpoint_with_auth)
    rc, lines, seconds, written = _run_cli(_args("train --run-dir", location), tmp_path, env)
    assert (rc, lines) == (2, [f"error: --run-dir {location}: {problem}"])
    assert seconds < 30
    assert not written


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["train --resume", "process STORE", "collect --out", "evaluate RUN_DIR",
                                  "report RUN_DIR"])
def test_every_entry_point_probes_its_object_store(tool, tmp_path, s3_endpoint, s3_endpoint_with_auth):
    location, env, problem = _store_case("unreachable", s3_endpoint, s3_endpoint_with_auth)
    rc, lines, seconds, written = _run_cli(_args(tool, location), tmp_path, env)
    assert (rc, lines) == (2, [f"error: {FLAG[tool]} {location}: {problem}"])
    assert seconds < 30
    assert not written


def test_a_store_that_never_answers_is_refused_at_the_deadline(monkeypatch):
    """A listener that accepts and never replies: the probe gives up at its deadline, whatever the SDK does."""
    pytest.importorskip("s3fs")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        for name, value in _credentials(endpoint).items():
            monkeypatch.setenv(name, value)
        t0 = time.monotonic()
        with pytest.raises(urls.LocationError) as err:
            urls.probe("s3://runs/r", timeout_s=2.0)
        seconds = time.monotonic() - t0
    assert str(err.value) == (f"s3://runs/r: no answer from the S3 endpoint {endpoint} within 2 s; valid: a "
                              "reachable store (check the network, or AWS_ENDPOINT_URL for an S3-compatible server)")
    assert 2.0 <= seconds < 5.0


def test_a_reachable_bucket_passes_the_probe(monkeypatch, s3_endpoint):
    for name, value in _credentials(s3_endpoint).items():
        monkeypatch.setenv(name, value)
    urls.probe("s3://runs/a/new/run")            # an empty prefix is fine: a new run directory
