"""Run-directory lock (core.run_lock): one trainer per run dir, refused before anything is written.

Local disk uses flock (the kernel frees it when the holder dies, also on kill -9);
memory:// and object stores use a lease with a heartbeat, taken over once stale.
The object-store lease is exercised through tensorstore's ``file`` kvstore, which
implements the same conditional writes (``if_equal`` generations) as gs:// and s3://.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from core import run_lock, urls
from core.run_lock import LOCK_NAME, RunDirInUse, RunLock

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HOLDER = ("import sys, time; from core.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); "
          "print('held', flush=True); time.sleep(600)")


@pytest.fixture
def holder():
    """Start a process that holds the lock on a run dir; yields (start(run_dir) -> Popen)."""
    procs = []

    def start(run_dir: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", HOLDER, run_dir], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait()


def _tree(path):
    """Every file under ``path`` with its size and mtime (to prove nothing was written)."""
    out = {}
    for d, _, files in os.walk(path):
        for name in files:
            st = os.stat(os.path.join(d, name))
            out[os.path.relpath(os.path.join(d, name), path)] = (st.st_size, st.st_mtime_ns)
    return out


# -- local disk -------------------------------------------------------------------------------
def test_local_second_lock_is_refused_and_names_the_holder(tmp_path):
    run_dir = str(tmp_path / "run")
    with RunLock(run_dir):
        with pytest.raises(RunDirInUse) as err:
            RunLock(run_dir).acquire()
        assert f"run directory {run_dir} is in use by another trainer (pid {os.getpid()} on " in str(err.value)
        assert "valid: wait for it to finish, or another --run-dir" in str(err.value)
        info = json.loads((tmp_path / "run" / LOCK_NAME).read_text())
        assert info["pid"] == os.getpid()
    assert not os.path.exists(run_dir)   # released: the lock file and the directory it made are gone
    os.makedirs(os.path.join(run_dir, "replay"))
    RunLock(run_dir).acquire().release()
    assert os.listdir(run_dir) == ["replay"]   # a directory the run wrote in stays


def test_local_lock_is_free_at_once_after_the_holder_is_killed(tmp_path, holder):
    run_dir = str(tmp_path / "run")
    p = holder(run_dir)
    with pytest.raises(RunDirInUse, match=f"pid {p.pid} on "):
        RunLock(run_dir).acquire()
    p.send_signal(signal.SIGKILL)
    p.wait()
    with RunLock(run_dir) as lock:    # no timeout to wait out: the kernel dropped the flock
        assert lock.held


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_of_many_concurrent_acquirers_exactly_one_wins(tmp_path, kind):
    run_dir = str(tmp_path / "run") if kind == "local" else f"memory://lock-race-{uuid.uuid4().hex}"
    barrier, won, refused = threading.Barrier(8), [], []

    def attempt():
        lock = RunLock(run_dir, heartbeat_s=0)
        barrier.wait()
        try:
            won.append(lock.acquire())
        except RunDirInUse:
            refused.append(lock)
    threads = [threading.Thread(target=attempt) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(won), len(refused)) == (1, 7)
    won[0].release()


RACER = ("import sys, time; from core.run_lock import RunLock, RunDirInUse\n"
         "lock = RunLock(sys.argv[1])\n"
         "while time.time() < float(sys.argv[2]): time.sleep(0.001)\n"
         "try:\n    lock.acquire(); print('won', flush=True); time.sleep(2); lock.release()\n"
         "except RunDirInUse:\n    print('refused', flush=True)\n")


@pytest.mark.slow
def test_of_concurrent_processes_on_a_new_run_dir_exactly_one_wins(tmp_path):
    run_dir = str(tmp_path / "new" / "run")
    start = time.time() + 3.0     # every process waits for the same instant, then acquires
    procs = [subprocess.Popen([sys.executable, "-c", RACER, run_dir, str(start)], stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(6)]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["refused"] * 5 + ["won"]
    assert _tree(str(tmp_path)) == {}     # nobody wrote a file (empty dirs may stay: a loser may have made them)


@pytest.mark.parametrize("make, reason", [
    (lambda t: (t / "f").write_text("x") and t / "f", "it is a file"),
    (lambda t: (t / "f").write_text("x") and t / "f" / "run", "Not a directory"),
])
def test_local_unusable_run_dir_is_one_line(tmp_path, make, reason):
    run_dir = str(make(tmp_path))
    with pytest.raises(urls.LocationError) as err:
        RunLock(run_dir).acquire()
    assert str(err.value) == (f"run directory {run_dir} cannot be written: {reason}; "
                              "valid: a writable directory, or a path where one can be created")


# -- leases: memory:// and object stores ------------------------------------------------------
class Clock:
    def __init__(self, t=1_000.0):
        self.t = t

    def __call__(self):
        return self.t


def _kv_lease(tmp_path, clock, timeout_s=10.0):
    store = run_lock._KvLeaseStore({"driver": "file", "path": str(tmp_path / "kv") + "/"})
    return run_lock._Lease("gs://bucket/run", store, timeout_s, 0, clock)


def _memory_lease(url, clock, timeout_s=10.0):
    return RunLock(url, timeout_s=timeout_s, heartbeat_s=0, clock=clock)


@pytest.mark.parametrize("kind", ["memory", "kvstore"])
def test_stale_lease_is_taken_over_and_the_old_holder_cannot_delete_it(tmp_path, kind):
    clock = Clock()
    url = f"memory://lease-{uuid.uuid4().hex}"
    make = (lambda: _memory_lease(url, clock)) if kind == "memory" else (lambda: _kv_lease(tmp_path, clock))
    first = make()
    first.acquire()
    clock.t += 10.0                  # exactly the timeout: still fresh
    with pytest.raises(RunDirInUse):
        make().acquire()
    clock.t += 0.5                   # 10.5 s without a heartbeat: stale
    second = make()
    second.acquire()
    first.release()                  # the crashed-then-woken holder must not delete the new lease
    with pytest.raises(RunDirInUse, match=f"pid {os.getpid()}"):
        make().acquire()
    second.release()
    third = make()
    third.acquire()                  # released for real: free again
    third.release()


def test_memory_lease_heartbeat_keeps_a_live_holder(tmp_path):
    url = f"memory://lease-{uuid.uuid4().hex}"
    with RunLock(url, timeout_s=0.4, heartbeat_s=0.05) as lock:
        time.sleep(1.0)              # 2.5 timeouts: only the heartbeat keeps the lease fresh
        with pytest.raises(RunDirInUse):
            RunLock(url, timeout_s=0.4, heartbeat_s=0).acquire()
        assert not lock.lost
    fs, path = urls.resolve(url)
    assert not fs.exists(f"{path}/{LOCK_NAME}")


def test_a_holder_whose_lease_was_taken_over_notices(capsys):
    url = f"memory://lease-{uuid.uuid4().hex}"
    # The stalled holder's clock is frozen: its heartbeats keep writing time 1000, as a process
    # paused longer than the timeout would have; another trainer, at 1060, sees the lease stale.
    stalled = RunLock(url, timeout_s=10.0, heartbeat_s=0.05, clock=Clock(1_000.0))
    stalled.acquire()
    taker = RunLock(url, timeout_s=10.0, heartbeat_s=0, clock=Clock(1_060.0))
    taker.acquire()
    deadline = time.time() + 5
    while not stalled.lost and time.time() < deadline:
        time.sleep(0.02)
    assert stalled.lost
    assert "was taken over by another trainer" in capsys.readouterr().err
    stalled.release()                  # must not delete the taker's lease
    with pytest.raises(RunDirInUse):
        RunLock(url, heartbeat_s=0, clock=Clock(1_060.0)).acquire()
    taker.release()


def test_unreadable_lease_is_treated_as_stale():
    url = f"memory://lease-{uuid.uuid4().hex}"
    fs, path = urls.resolve(url)
    fs.pipe_file(f"{path}/{LOCK_NAME}", b"not json")
    with RunLock(url, heartbeat_s=0) as lock:
        assert json.loads(fs.cat_file(f"{path}/{LOCK_NAME}"))["owner"] == lock._impl.info["owner"]


def test_the_lease_timeout_comes_from_the_environment(monkeypatch):
    url = f"memory://lease-{uuid.uuid4().hex}"
    monkeypatch.setenv(run_lock.LEASE_ENV, "15")
    clock = Clock()
    with RunLock(url, heartbeat_s=0, clock=clock):
        clock.t += 15.0              # exactly the timeout: still fresh, and the refusal says so
        with pytest.raises(RunDirInUse, match="its lease expires in 0 s"):
            RunLock(url, heartbeat_s=0, clock=clock).acquire()
        clock.t += 0.5               # 15.5 s without a heartbeat: stale under the 15 s timeout
        RunLock(url, heartbeat_s=0, clock=clock).acquire().release()
    monkeypatch.delenv(run_lock.LEASE_ENV)
    assert run_lock.lease_timeout_s() == run_lock.DEFAULT_TIMEOUT_S == 60.0


@pytest.mark.parametrize("value", ["soon", "0", "1.5", "-3", "inf", "nan"])
def test_a_bad_lease_timeout_in_the_environment_is_one_line(monkeypatch, value):
    monkeypatch.setenv(run_lock.LEASE_ENV, value)
    with pytest.raises(urls.LocationError) as err:
        RunLock("memory://anything")
    assert str(err.value) == (f"DATABLOOM_RUN_LEASE_S={value!r} is not a lease timeout; valid: seconds, a number "
                              ">= 2 (default 60)")


# -- trainers -------------------------------------------------------------------------------------
def _fake_run_dir(path, seed=0):
    from core.config import load_config, to_json
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(to_json(load_config(overrides=[f"seed={seed}", "executor=local"])))


def test_second_trainer_on_a_new_run_dir_in_use_is_refused_and_writes_nothing(tmp_path, holder, capsys):
    from pipelines.train import main
    run_dir = str(tmp_path / "run")
    p = holder(run_dir)
    lock_before = (tmp_path / "run" / LOCK_NAME).read_bytes()
    assert main(["--executor", "local", "--run-dir", run_dir, "--seed", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: run directory {run_dir} is in use by another trainer "
                                               f"(pid {p.pid} on "), err
    assert os.listdir(run_dir) == [LOCK_NAME]                       # no config.json, no replay/
    assert (tmp_path / "run" / LOCK_NAME).read_bytes() == lock_before


def test_two_resumes_at_once_the_second_is_refused_and_touches_nothing(tmp_path, holder, capsys):
    from pipelines.train import main
    run_dir = str(tmp_path / "run")
    _fake_run_dir(run_dir, seed=3)
    holder(run_dir)                                                  # the first --resume
    before = _tree(run_dir)
    assert main(["--resume", run_dir, "--no-progress"]) == 2
    assert "is in use by another trainer" in capsys.readouterr().err
    assert _tree(run_dir) == before


@pytest.mark.timeout(300)
def test_two_real_trainers_on_one_new_run_dir(tmp_path, capsys):
    """The review's repro: trainer A (seed 0) runs; trainer B (seed 1) on the same dir is refused."""
    from pipelines.train import main
    run_dir = str(tmp_path / "run")
    a = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--executor", "local", "--run-dir", run_dir,
                          "--seed", "0", "--no-progress", "--set", "total_env_steps=1000000"],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        config = os.path.join(run_dir, "config.json")
        deadline = time.time() + 240
        while not os.path.exists(config) and a.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert os.path.exists(config), a.stderr.read() if a.poll() is not None else "A wrote no config.json"
        time.sleep(0.5)   # the config file is written in one go; let A's open/write finish
        before = open(config).read()
        assert main(["--executor", "local", "--run-dir", run_dir, "--seed", "1", "--no-progress"]) == 2
        assert f"error: run directory {run_dir} is in use by another trainer (pid {a.pid} on " \
            in capsys.readouterr().err
        assert open(config).read() == before and json.loads(before)["seed"] == 0
        assert a.poll() is None       # A runs on
    finally:
        a.kill()
        a.wait()


@pytest.fixture
def s3_url(monkeypatch):
    """``s3://<fresh bucket>/run`` on a local moto server (tensorstore and s3fs find it via AWS_*)."""
    import logging
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_ENDPOINT_URL", endpoint), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    bucket = f"lease-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/run"
    server.stop()


def test_s3_lease_refuses_takes_over_when_stale_and_never_deletes_a_successor(s3_url):
    clock = Clock()
    first = RunLock(s3_url, timeout_s=10.0, heartbeat_s=0, clock=clock).acquire()
    clock.t += 4.0
    with pytest.raises(RunDirInUse, match=f"run directory {s3_url} is in use by another trainer") as err:
        RunLock(s3_url, heartbeat_s=0, clock=clock).acquire()
    # a crashed holder's lease: when it lapses (10 s timeout, 4 s since its heartbeat) and how to take it sooner
    assert "its lease expires in 6 s" in str(err.value), str(err.value)
    assert f"delete {s3_url}/run.lock if that trainer is certainly dead" in str(err.value)
    assert "\n" not in str(err.value)
    clock.t += 11.0
    second = RunLock(s3_url, timeout_s=10.0, heartbeat_s=0, clock=clock).acquire()
    assert first._impl.store.replace(b"late heartbeat", first._impl.generation) is None   # If-Match refused
    first.release()
    with pytest.raises(RunDirInUse):
        RunLock(s3_url, heartbeat_s=0, clock=clock).acquire()
    second.release()
    RunLock(s3_url, heartbeat_s=0, clock=clock).acquire().release()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_real_resumes_at_once(tmp_path, capsys):
    """The review's second repro: two ``--resume`` of one run; the second is refused and changes nothing."""
    from pipelines.train import main
    run_dir = str(tmp_path / "run")
    small = ["--set", "replay.min_size=256", "--set", "checkpoint.every_steps=50",
             "--set", "eval.every_env_steps=100000"]
    assert main(["--executor", "local", "--run-dir", run_dir, "--no-progress", "--set", "total_env_steps=1024",
                 *small]) == 0
    capsys.readouterr()
    a = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--resume", run_dir, "--no-progress",
                          "--set", "total_env_steps=1000000"], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lock_file, deadline = os.path.join(run_dir, LOCK_NAME), time.time() + 120
        while a.poll() is None and time.time() < deadline:
            try:
                if json.load(open(lock_file)).get("pid") == a.pid:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        assert a.poll() is None, a.stderr.read()
        config_before = open(os.path.join(run_dir, "config.json")).read()
        assert main(["--resume", run_dir, "--no-progress", "--set", "total_env_steps=2048"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(
            f"error: run directory {run_dir} is in use by another trainer (pid {a.pid} on "), err
        assert open(os.path.join(run_dir, "config.json")).read() == config_before
        assert a.poll() is None       # A resumes on, undisturbed
    finally:
        a.kill()
        a.wait()


@pytest.mark.parametrize("exc, code", [(FileNotFoundError("--resume: no complete checkpoint"), 2),
                                       (KeyboardInterrupt(), 130)])
def test_the_lock_is_released_when_training_fails_or_is_interrupted(tmp_path, monkeypatch, capsys, exc, code):
    import signal as sig
    from pipelines import train as train_cli
    run_dir = str(tmp_path / "run")
    held = []

    def failing(*args, **kwargs):
        with pytest.raises(RunDirInUse):   # held while training runs
            RunLock(run_dir).acquire()
        held.append(True)
        raise exc
    monkeypatch.setattr(train_cli, "_train_locked", failing)
    previous = sig.getsignal(sig.SIGINT)
    try:
        assert train_cli.main(["--executor", "local", "--run-dir", run_dir, "--no-progress"]) == code
    finally:
        sig.signal(sig.SIGINT, previous)
    assert held == [True]
    capsys.readouterr()
    RunLock(run_dir).acquire().release()  # released on the way out
