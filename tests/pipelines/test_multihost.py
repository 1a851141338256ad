"""A training run over hosts that share nothing but the network and an object store (issue 30).

Five hosts, each a network namespace with its own address on a private bridge
(``netns_hosts.Hosts``); processes on them share this machine's file system, but
the run directory is ``s3://runs/r`` on the store host, so everything the run
keeps (replay, policies, checkpoints, lock, metrics, summary) goes through S3:

* ``store``: an S3 server (moto, ``multihost_probe.py serve``), bucket ``runs``;
* ``scheduler``: ``dask scheduler`` (and the probe that watches the run's progress);
* ``w0``: ``dask worker --resources GPU=1``, where the learner is placed;
* ``w1``: ``dask worker``, where the actors run while it lives;
* ``client``: ``python -m pipelines.train --executor dask --dask-address tcp://SCHEDULER:8786``.

Two runs of the default config, seed 3, 12,288 env steps (12 blocks), each
compared bit for bit (parameters, every replay shard, the summary's counts) with the
same run by ``--executor local`` on a local directory:

1. every process of ``w1`` SIGKILLed after the second commit, then the store host's
   link down for 15 s: the run says that it waits on the store, and finishes;
2. the client SIGKILLed after a checkpoint: an immediate ``--resume`` is
   refused with one line naming when the dead trainer's lease expires
   (``DATABLOOM_RUN_LEASE_S=10``), and a ``--resume`` after that finishes the run.

No shard is committed twice, the ``placement`` record names ``w0`` for the learner, the
killed attempt's metrics records survive (uploaded every ``core.metrics.PUBLISH_S``),
and no line of the trainer's output is an error that is not one. Needs root (network
namespaces): without it the test fails with one line, in CI too. About 4 minutes.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from netns_hosts import Hosts, require_root
from test_dask_cluster import REPO, THREAD_ENV, _check_replay
from test_determinism import _assert_same_run

pytestmark = pytest.mark.slow

SEED, BUCKET, PORT, SCHEDULER_PORT = 3, "runs", 5000, 8786
SETTINGS = ["total_env_steps=12288", "eval.every_env_steps=6144", "eval.episodes=10", "eval.confirm_episodes=0",
            "checkpoint.every_steps=1000"]
PLACED = 'learner.resources={"GPU": 1}'
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_probe.py")
#: A line that reads as an error: absl's E/F lines (tensorstore's AWS SDK), tracebacks, "error", "failed" ...
ERROR_LINE = re.compile(r"^[EF]\d{4} |traceback|error|exception|failed", re.IGNORECASE)
#: ... but not absl's info lines (TensorFlow's oneDNN notice speaks of "round-off errors").
INFO_LINE = re.compile(r"^I\d{4} ")


def _wait(what, check, timeout, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited ({proc.returncode}) first", pytrace=False)
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout} s", pytrace=False)


class Cluster:
    """The five hosts and their servers; :meth:`train` starts a trainer on the client host."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.hosts = Hosts(["store", "scheduler", "w0", "w1", "client"])
        ip = self.hosts.ip
        self.address = f"tcp://{ip('scheduler')}:{SCHEDULER_PORT}"
        self.env = {**os.environ, **THREAD_ENV, "PYTHONPATH": REPO, "AWS_ENDPOINT_URL": f"http://{ip('store')}:{PORT}",
                    "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
                    "PYTHONUNBUFFERED": "1"}
        for key in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "DATABLOOM_RUN_LEASE_S"):
            self.env.pop(key, None)
        store_log = tmp / "store.log"
        self.hosts.start("store", [sys.executable, PROBE, "serve", ip("store"), str(PORT), BUCKET], store_log, self.env)
        self.hosts.start("scheduler", [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", ip("scheduler"),
                                       "--port", str(SCHEDULER_PORT), "--no-dashboard"], tmp / "scheduler.log", self.env)
        for name, extra in (("w0", ["--resources", "GPU=1"]), ("w1", [])):
            self.hosts.start(name, [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--host", ip(name),
                                    "--nthreads", "1", "--no-nanny", "--no-dashboard", "--name", name,
                                    "--local-directory", str(tmp / name), *extra], tmp / f"{name}.log", self.env)
        _wait("the S3 server", lambda: "ready" in store_log.read_text(), 60)
        ready = self.hosts.start("client", [sys.executable, "-c", "import sys; from distributed import Client; "
                                            f"Client({self.address!r}, timeout=60).wait_for_workers(2, timeout=60)"],
                                 tmp / "client-ready.log", self.env)
        assert ready.wait(timeout=120) == 0, (tmp / "client-ready.log").read_text()[-2000:]

    def train(self, name, run_url, resume=False, env=None):
        """``pipelines.train`` on the client host: a new run of :data:`SETTINGS`, or ``--resume run_url``."""
        log = self.tmp / f"{name}.log"
        cmd = [sys.executable, "-m", "pipelines.train", "--executor", "dask", "--dask-address", self.address,
               "--no-progress"]
        cmd += (["--resume", run_url] if resume else
                ["--run-dir", run_url, "--seed", str(SEED), "--set", PLACED, *[a for s in SETTINGS for a in ("--set", s)]])
        return self.hosts.start("client", cmd, log, {**self.env, **(env or {})}, cwd=REPO), log

    def watch(self, run_url):
        """A probe on the scheduler host printing the run's log version and checkpoint as they change."""
        log = self.tmp / f"watch-{run_url.rsplit('/', 1)[-1]}.log"
        self.hosts.start("scheduler", [sys.executable, PROBE, "watch", run_url], log, self.env)
        return lambda: [json.loads(l) for l in log.read_text().splitlines() if l.startswith("{")]

    def copy(self, run_url, out):
        """The run directory, copied from the store (by a process on the client host) to ``out``."""
        proc = self.hosts.start("client", [sys.executable, PROBE, "copy", run_url, str(out)], self.tmp / "copy.log",
                                self.env)
        assert proc.wait(timeout=120) == 0, (self.tmp / "copy.log").read_text()[-2000:]
        with open(out / "summary.json") as f:
            return json.load(f), str(out)

    def close(self):
        self.hosts.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = require_root()
    if reason:
        pytest.fail(reason, pytrace=False)
    c = Cluster(tmp_path_factory.mktemp("hosts"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The same config and seed with ``--executor local`` on a local directory, in a process of its own."""
    run_dir = tmp_path_factory.mktemp("local") / "run"
    out = subprocess.run([sys.executable, "-m", "pipelines.train", "--executor", "local", "--run-dir", str(run_dir),
                          "--seed", str(SEED), "--no-progress", *[a for s in SETTINGS for a in ("--set", s)]],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, **THREAD_ENV}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(run_dir / "summary.json") as f:
        return json.load(f), str(run_dir)


def _false_errors(log):
    """Lines of a trainer's output that read as errors (the run succeeded, so none may)."""
    return [line for line in log.read_text().splitlines() if ERROR_LINE.search(line) and not INFO_LINE.match(line)]


def _metrics(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


def test_a_lost_worker_host_and_a_store_outage_change_nothing(cluster, local_run, tmp_path):
    proc, log = cluster.train("run1", "s3://runs/r1")
    progress = cluster.watch("s3://runs/r1")
    _wait("the second commit", lambda: any(p["log"] >= 2 for p in progress()), 240, proc)
    assert cluster.hosts.kill("w1"), "w1 had no processes to kill"
    seen = len(progress())
    _wait("a commit after w1 was lost", lambda: any(p["log"] >= 4 for p in progress()[seen - 1:]), 240, proc)
    cluster.hosts.link("store", up=False)
    time.sleep(15)
    cluster.hosts.link("store", up=True)
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "waiting on the store s3://runs/r1" in text and "answers again" in text, text[-3000:]
    run = cluster.copy("s3://runs/r1", tmp_path / "r1")
    _assert_same_run(local_run, run, "local vs hosts sharing only S3, w1 killed, store cut off 15 s")
    _check_replay(run[1])
    (placement,) = _metrics(run[1], "placement")
    assert placement["learner_address"].startswith(f"tcp://{cluster.hosts.ip('w0')}:")
    assert cluster.hosts.ip("w0") not in json.dumps(placement["actors"])
    assert not [l for l in _false_errors(log) if "waiting on the store" not in l]


def test_a_killed_client_resumes_after_its_lease_expires(cluster, local_run, tmp_path):
    lease = {"DATABLOOM_RUN_LEASE_S": "10"}
    proc, log = cluster.train("run2", "s3://runs/r2", env=lease)
    progress = cluster.watch("s3://runs/r2")
    # after a checkpoint, once the attempt's metrics reached the store (uploaded every core.metrics.PUBLISH_S)
    _wait("a checkpoint and uploaded metrics", lambda: any(p["checkpoint"] for p in progress()) and any(
        p["metrics_bytes"] for p in progress()), 240, proc)
    assert cluster.hosts.kill("client"), "the client had no processes to kill"
    refused, refused_log = cluster.train("resume-refused", "s3://runs/r2", resume=True, env=lease)
    assert refused.wait(timeout=120) == 2
    lines = [l for l in refused_log.read_text().splitlines() if l.strip() and "oneDNN" not in l]
    assert len([l for l in lines if "in use by another trainer" in l]) == 1, lines
    (line,) = [l for l in lines if "in use by another trainer" in l]
    assert "its lease expires in" in line and "run.lock if that trainer is certainly dead" in line, line
    time.sleep(11)
    resumed, resumed_log = cluster.train("resume", "s3://runs/r2", resume=True, env=lease)
    assert resumed.wait(timeout=300) == 0, resumed_log.read_text()[-3000:]
    assert not _false_errors(resumed_log), _false_errors(resumed_log)
    run = cluster.copy("s3://runs/r2", tmp_path / "r2")
    _assert_same_run(local_run, run, "local vs hosts sharing only S3, client killed and resumed")
    _check_replay(run[1])
    # the killed attempt's metrics reached the store before the kill: one placement record per attempt
    assert len(_metrics(run[1], "placement")) == 2 and len(_metrics(run[1], "resume")) == 1
