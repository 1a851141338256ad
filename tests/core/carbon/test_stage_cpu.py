"""Stage CPU records (core.stage_cpu) and how EnergyTracker counts them: every process that ran a stage.

Budget: ~15 s (one Dask LocalCluster with one worker, one in-memory Beam round), the rest milliseconds.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

import pytest

from core import stage_cpu
from core.carbon import DEFAULT_WATTS_PER_THREAD, EnergyTracker, ROUTES, process_time_energy_kwh
from core.stage_cpu import CountStageCpu, ProcessCpu, counted, read_records


def _burn(seconds: float) -> float:
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass
    return seconds


# (spans in completion order, union length, union)
UNION_CASES = [
    ([(0, 1), (2, 3)], 2.0, [[0, 1], [2, 3]]),                     # sequential stages
    ([(0, 2), (1, 3)], 3.0, [[0, 3]]),                             # two threads overlapping
    ([(0, 1), (5, 6), (0.5, 7)], 7.0, [[0, 7]]),                   # a long stage spanning two short ones
    ([(0, 1), (2, 3), (2.5, 4), (3.5, 5)], 4.0, [[0, 1], [2, 5]]),
    ([(1, 1), (1, 2)], 1.0, [[1, 2]]),                             # a stage that used no CPU
]


@pytest.mark.parametrize("spans, covered, union", UNION_CASES)
def test_union_of_stage_spans_is_exact(spans, covered, union):
    rec = ProcessCpu("h", 1, 0.0)
    for c0, c1 in spans:
        rec.add("stage", c0, c1)
    assert rec.covered_s == pytest.approx(covered) and rec.spans == union
    assert rec.stages == len(spans) and rec.by_stage["stage"] == pytest.approx(sum(b - a for a, b in spans))


def test_counted_stage_records_its_process_cpu(tmp_path):
    sink = str(tmp_path / "carbon" / "s1")
    task = counted(_burn, sink)
    c0 = stage_cpu.process_cpu_seconds()
    assert task(0.2) == 0.2
    with pytest.raises(ZeroDivisionError):               # exceptions pass through, and count
        counted(lambda: 1 / 0, sink)()
    spent = stage_cpu.process_cpu_seconds() - c0
    (rec,), notes = read_records(sink)
    assert notes == [] and rec.host == socket.gethostname() and rec.pid == os.getpid()
    assert rec.stages == 2 and set(rec.by_stage) == {"_burn", "<lambda>"}
    assert 0.2 - 1e-3 <= rec.covered_s <= spent + 1e-9    # getrusage and process_time: same clock, us apart
    assert counted(_burn, "") is _burn and counted(_burn, None) is _burn
    assert isinstance(task, CountStageCpu) and task.__name__ == "_burn"


def _write_record(sink: str, rec: ProcessCpu) -> None:
    os.makedirs(sink, exist_ok=True)
    with open(os.path.join(sink, rec.record_name()), "w") as f:
        json.dump(dataclasses.asdict(rec), f)


def test_tracker_counts_remote_stage_records_once(tmp_path):
    """A remote host's record is charged W_thread per CPU-second; a report for the same process is not added."""
    tr = EnergyTracker(str(tmp_path / "run"), backend="process-time", ram_watts=0.0).start()
    remote = ProcessCpu("worker-host-1", 4242, 1.0e9, covered_s=90.0, stages=3,
                        by_stage={"run_rollout_task": 80.0, "write_shard_stage": 10.0})
    _write_record(tr.stage_cpu_sink, remote)
    with open(os.path.join(tr.stage_cpu_sink, "broken.json"), "w") as f:
        f.write("{not json")
    tr.add_process_cpu_seconds("same worker, reported", 50.0, host="worker-host-1", pid=4242)
    r = tr.stop()
    assert r.cpu_seconds["stages worker-host-1 pid=4242"] == 90.0
    local = sum(v for k, v in r.cpu_seconds.items() if "worker-host-1" not in k and k != "same worker, reported")
    assert r.counted_cpu_seconds == pytest.approx(local + 90.0)
    assert r.breakdown_kwh["cpu_time_model"] == pytest.approx(
        process_time_energy_kwh(local + 90.0, 0.0, watts_per_thread=DEFAULT_WATTS_PER_THREAD))
    host = r.coverage["hosts"]["worker-host-1"]
    assert host == {"processes": 1, "processes_seen": 1, "cpu_s": 90.0, "routes": {"stage record": 90.0}}
    assert r.coverage["hosts"][socket.gethostname()]["routes"].keys() == {"ledger"}
    assert r.coverage["stages_cpu_s"] == {"run_rollout_task": 80.0, "write_shard_stage": 10.0}
    assert r.coverage["routes"] == ROUTES and r.coverage["stage_records"] == tr.stage_cpu_sink
    assert any("'same worker, reported': pid 4242 already measured on worker-host-1" in n for n in r.notes)
    assert any(n.startswith("stage record broken.json unreadable (JSONDecodeError") for n in r.notes)


def test_each_tracker_session_reads_only_its_own_records(tmp_path):
    run = str(tmp_path / "run")
    first = EnergyTracker(run, backend="process-time").start()
    _write_record(first.stage_cpu_sink, ProcessCpu("other", 1, 1.0, covered_s=5.0))
    assert first.stop().cpu_seconds["stages other pid=1"] == 5.0
    second = EnergyTracker(run, backend="process-time").start()   # e.g. --resume
    assert second.stage_cpu_sink != first.stage_cpu_sink
    assert not any("other" in k for k in second.stop().cpu_seconds)


@pytest.mark.slow
def test_dask_stages_record_worker_cpu_through_the_executor_hook(tmp_path):
    pytest.importorskip("distributed")
    from core.config import load_config
    from pipelines.run.energy import start_run_tracker, stop_run_tracker
    from pipelines.executors.dask import DaskExecutor
    cfg = load_config(None, ["carbon.backend=process-time"])
    ex = DaskExecutor(n_workers=1)
    try:
        tracker = start_run_tracker(cfg, str(tmp_path / "run"), ex)

        def burn(seconds):   # defined here so it is pickled by value for the worker
            t = time.process_time()
            while time.process_time() - t < seconds:
                pass
            return os.getpid()

        wpid = ex.submit(burn, 0.4, key="burn-0").result()
        assert ex.submit(burn, 0.1, key="burn-1").result() == wpid
        summary = stop_run_tracker(tracker)
    finally:
        ex.close()
    r = tracker.report
    assert summary["carbon_backend"] == "process-time"
    (rec,), _ = read_records(tracker.stage_cpu_sink)
    assert rec.pid == wpid != os.getpid() and rec.stages == 2 and rec.covered_s >= 0.5
    assert r.cpu_seconds[f"stages {rec.host} pid={wpid}"] == rec.covered_s
    # The LocalCluster worker is this host's process, measured by the ledger: counted once, there.
    assert any(f"pid {wpid} already measured" in n for n in r.notes)
    assert r.coverage["hosts"][socket.gethostname()]["routes"].keys() == {"ledger"}
    assert r.coverage["stages_cpu_s"]["burn"] >= 0.5


@pytest.mark.slow
def test_beam_round_stages_record_their_cpu(tmp_path):
    pytest.importorskip("apache_beam")
    from apache_beam.options.pipeline_options import PipelineOptions
    from core import config as config_lib
    from core.actor import ActorSpec
    from pipelines.beam.blocks import BlockRun
    from pipelines.beam.graph import build_block_round
    from pipelines.beam.records import read_record
    from pipelines.executors import beam as beam_executor
    run_dir = str(tmp_path / "run")
    sink = stage_cpu.sink_url(run_dir, "beam-test")
    cfg = config_lib.from_dict({"executor": "beam", "seed": 0, "total_env_steps": 256, "env": {"num_envs": 4},
                                "agent": {"hidden": [16]}, "actors": {"num_actors": 2, "steps_per_task": 16},
                                "replay": {"min_size": 64, "shard_max_rows": 128}, "learner": {"replay_ratio": 0.5},
                                "eval": {"every_env_steps": 128, "episodes": 2, "confirm_episodes": 0}})
    specs = tuple(ActorSpec("test-run", "CartPole-v1", 4, 0, a) for a in range(2))
    run = BlockRun(cfg, run_dir, specs, cpu_sink=sink)
    opts = PipelineOptions(["--direct_running_mode", "in_memory", "--direct_num_workers", "1"])
    beam_executor.run_pipeline(lambda p: build_block_round(p, run, 0, 0, 0), opts)
    assert read_record(run_dir, 0, "commit")["commit"]["rows"] == 2 * 4 * 16     # the round still works
    (rec,), _ = read_records(sink)
    assert rec.pid == os.getpid()                                        # in_memory: stages ran here
    assert {"load_actor", "roll_block", "write_block", "load_state", "commit_block", "learn_block",
            "evaluate_block", "end_round"} <= set(rec.by_stage), rec.by_stage
    assert rec.stages >= 2 + 2 + 1 + 1 + 1 + 1 + 1
    assert rec.covered_s > 0
