"""Warm worker processes for the DirectRunner's rounds (pipelines.beam.warm_workers): one process serves
round after round, each round's learner is dropped before the next, a dead process is replaced, a
failing round leaves the pool working, and the pool's service listens on the loopback interface only."""
import json
import os
import signal
import types

import pytest

pytest.importorskip("apache_beam")

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from beam_probes import is_loopback, listening_probe  # noqa: E402
from pipelines.beam import warm_workers  # noqa: E402
from pipelines.executors import beam as beam_executor  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def pool():
    p = warm_workers.WarmWorkers(1)
    yield p
    p.close()


def _round(pool, tmp_path, name, fn):
    """One pipeline on ``pool``: ``fn`` on one element in the worker; its JSON result."""
    out = tmp_path / f"{name}.json"
    options = pool.options(beam_executor.pipeline_options([], str(tmp_path), num_workers=1))
    beam_executor.run_pipeline(lambda p: p | beam.Create([0]) | beam.Map(fn)
                               | beam.Map(lambda r: out.write_text(json.dumps(r))), options)
    return json.loads(out.read_text())


def _probes():
    """``(plant, look)`` for a worker, nested so that Beam pickles them by value (this test module is not
    importable there). plant: a stand-in learner put in the process's learner table; both return the
    worker's pid and the table's size."""
    def plant(_):
        from pipelines.beam import learner
        learner._LEARNERS["planted"] = types.SimpleNamespace(stage=types.SimpleNamespace(close=lambda: None))
        return {"pid": os.getpid(), "learners": len(learner._LEARNERS)}

    def look(_):
        from pipelines.beam import learner
        return {"pid": os.getpid(), "learners": len(learner._LEARNERS)}
    return plant, look


def test_rounds_run_in_one_warm_process_and_each_starts_without_the_last_rounds_learner(pool, tmp_path):
    plant, look = _probes()
    first = _round(pool, tmp_path, "r0", plant)
    second = _round(pool, tmp_path, "r1", look)
    assert first == {"pid": pool.pids()[0], "learners": 1}
    assert second == {"pid": first["pid"], "learners": 0}      # forget_learners ran before the harness
    assert first["pid"] != os.getpid() and pool.address.startswith("127.0.0.1:")


def test_a_killed_process_is_replaced_and_a_failing_round_leaves_the_pool_working(pool, tmp_path):
    _, look = _probes()
    pid = _round(pool, tmp_path, "r0", look)["pid"]
    os.kill(pid, signal.SIGKILL)
    again = _round(pool, tmp_path, "r1", look)["pid"]
    assert again != pid and pool.pids() == [again]

    def fail(_):
        raise ValueError("a stage failed")
    with pytest.raises(Exception, match="a stage failed"):
        _round(pool, tmp_path, "r2", fail)
    assert _round(pool, tmp_path, "r3", look)["pid"] == again


def test_closing_the_pool_ends_its_processes(tmp_path):
    pool = warm_workers.WarmWorkers(2)
    procs = [p.proc for p in pool.processes]
    _round(pool, tmp_path, "r0", _probes()[1])
    pool.close()
    assert [p.poll() for p in procs] == [0, 0]


def test_only_the_direct_runners_multi_processing_rounds_get_warm_workers(tmp_path):
    local = beam_executor.pipeline_options([], str(tmp_path))
    assert warm_workers.wanted(local)
    for args, run_dir in ((["--direct_running_mode=in_memory"], str(tmp_path)),
                          (["--environment_type=EXTERNAL", "--environment_config=localhost:5000"], str(tmp_path)),
                          (["--runner", "DataflowRunner", "--project", "p", "--region", "r", "--temp_location",
                            "gs://b/tmp"], "gs://b/run")):
        opts = beam_executor.pipeline_options(args, run_dir)
        assert not warm_workers.wanted(opts)
        with warm_workers.warm_options(opts) as got:
            assert got is opts


def test_the_runner_uses_the_pool_named_by_the_options(pool, tmp_path):
    from apache_beam.transforms.environments import ExternalEnvironment
    runner, opts = beam_executor.runner_for(pool.options(beam_executor.pipeline_options([], str(tmp_path))))
    env = runner._default_environment
    assert isinstance(env, ExternalEnvironment) and env.url == pool.address
    assert isinstance(opts, PipelineOptions)


def test_every_server_of_a_round_on_the_pool_listens_on_loopback_only(pool, tmp_path):
    seen = _round(pool, tmp_path, "listening", listening_probe(os.getpid()))
    assert len(seen) >= 5, seen      # the pool's service and the runner's control, data, state and logging
    assert all(is_loopback(ip) for ip, _ in seen), seen


def test_the_processes_end_when_their_launcher_is_killed():
    import subprocess
    import sys
    import time
    code = ("import time; from pipelines.beam.warm_workers import WarmWorkers; p = WarmWorkers(2); "
            "print(*p.pids(), flush=True); time.sleep(600)")
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in launcher.stdout.readline().split()]
    assert len(pids) == 2
    launcher.kill()
    launcher.wait()
    deadline = time.time() + 60                   # a process still importing Beam reads its stdin's end after
    while time.time() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid):
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_process_that_dies_during_a_round_ends_the_round_with_worker_lost(tmp_path):
    # Beam's runner would wait for the dead worker's bundle forever: the pool raises in the main thread.
    opts = beam_executor.pipeline_options([], str(tmp_path), num_workers=1)
    with warm_workers.warm_options(opts) as opts:
        with pytest.raises(warm_workers.WorkerLost, match=r"died during a round \(exit status -9\)"):
            beam_executor.run_pipeline(
                lambda p: p | beam.Create([0]) | beam.Map(lambda _: os.kill(os.getpid(), signal.SIGKILL)), opts)


def test_the_grpc_server_shutdown_race_is_dropped_for_good_and_other_thread_errors_still_print(monkeypatch):
    """gRPC's server thread can raise "server must be started and not shutting down" after the runner stopped
    that server following a lost worker, after the round's scope closed (seen in test_beam_stop's lost worker):
    the hook that drops it stays for the process, is installed once, and passes every other error on."""
    import threading
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append((args.thread.name, str(args.exc_value))))

    def raise_in(name, error):
        def target():
            raise error
        t = threading.Thread(target=target, name=name)
        t.start()
        t.join()

    warm_workers._ignore_the_server_shutdown_race()
    warm_workers._ignore_the_server_shutdown_race()                    # idempotent: one hook, not two
    assert getattr(threading.excepthook, "drops_the_server_shutdown_race", False)
    raise_in("Thread-1 (_serve)", ValueError("server must be started and not shutting down"))
    assert seen == []
    raise_in("Thread-2 (_serve)", ValueError("another error"))
    raise_in("Thread-3 (work)", ValueError("server must be started and not shutting down"))
    assert seen == [("Thread-2 (_serve)", "another error"),
                    ("Thread-3 (work)", "server must be started and not shutting down")]
