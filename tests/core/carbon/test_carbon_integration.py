"""Energy/carbon per run, per-broadcast quality metrics and policy-lag records, end to end."""
import json
import os

import pytest

TINY = ["executor=local", "total_env_steps=1536", "replay.min_size=500", "eval.every_env_steps=1024",
        "eval.episodes=2", "eval.confirm_episodes=0", "agent.hidden=[32]", "actors.broadcast_period=40",
        "actors.num_actors=2", "env.num_envs=4", "checkpoint.every_steps=100000"]


def _records(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["kind"] == kind]


@pytest.mark.slow
def test_run_records_energy_quality_and_lag(tmp_path):
    from core.config import load_config
    from pipelines.train import train
    run_dir = str(tmp_path / "run")
    cfg = load_config(None, TINY + ["carbon.backend=process-time", "carbon.country=FRA"])
    summary = train(cfg, run_dir, progress=False)
    with open(os.path.join(run_dir, "carbon.json")) as f:
        carbon = json.load(f)
    assert carbon["backend"] == "process-time" and carbon["country"] == "FRA"
    assert summary["energy_kwh"] == pytest.approx(carbon["energy_kwh"]) and summary["energy_kwh"] > 0
    assert summary["co2e_kg"] == pytest.approx(carbon["energy_kwh"] * carbon["intensity_g_per_kwh"] / 1000)
    assert summary["energy_source"].startswith("process-time model") and "country=FRA" in summary["energy_source"]
    assert any(k.startswith("driver pid=") for k in carbon["cpu_seconds"])
    with open(os.path.join(run_dir, "summary.json")) as f:
        assert json.load(f)["energy_kwh"] == summary["energy_kwh"]
    quality = _records(run_dir, "broadcast_quality")
    assert quality, "no broadcast_quality records"
    for q in quality:
        assert 0.0 <= q["action_agreement"] <= 1.0 and q["agreement_kind"] == "argmax_match"
        assert set(q["weight_quant_error"]) == {"dense_0", "dense_1"} and q["probe_size"] == 256
        assert 0.0 < q["weight_quant_error_max"] < 0.05
    assert len({q["version"] for q in quality}) == len(quality)
    lags = _records(run_dir, "policy_lag")
    assert lags and all(r["versions_mean"] >= 0 and r["seconds_mean"] >= 0 for r in lags)


@pytest.mark.slow
def test_backend_off_writes_no_carbon(tmp_path):
    from core.config import load_config
    from pipelines.train import train
    run_dir = str(tmp_path / "run")
    summary = train(load_config(None, TINY + ["carbon.backend='off'", "total_env_steps=600"]), run_dir,
                    progress=False)
    assert not os.path.exists(os.path.join(run_dir, "carbon.json"))
    assert summary["energy_kwh"] is None and summary["energy_source"].startswith("off")


def test_executors_report_worker_pids():
    import psutil
    from pipelines.executors.dask import DaskExecutor
    from pipelines.executors.local import LocalExecutor
    assert LocalExecutor().worker_pids() == []
    ex = DaskExecutor(n_workers=1)
    try:
        pids = ex.worker_pids()
        assert len(pids) == 1 and pids[0] != os.getpid() and psutil.pid_exists(pids[0])
        assert ex.worker_pids() == pids      # cached
    finally:
        ex.close()


@pytest.mark.slow
def test_eit_backend_in_a_training_run(tmp_path, monkeypatch):
    """``carbon.backend=eit`` on a host with (fake) RAPL: carbon.json names experiment-impact-tracker."""
    pytest.importorskip("experiment_impact_tracker")
    from test_carbon_eit import FakeRapl
    from core.carbon import tracker
    from core.config import load_config
    from pipelines.train import train
    rapl = FakeRapl(str(tmp_path / "powercap"))
    monkeypatch.setattr(tracker, "RAPL_ROOT", rapl.root)
    run_dir = str(tmp_path / "run")
    try:
        summary = train(load_config(None, TINY + ["carbon.backend=eit", "carbon.country=FRA"]), run_dir,
                        progress=False)
    finally:
        rapl.close()
    with open(os.path.join(run_dir, "carbon.json")) as f:
        report = json.load(f)
    assert report["backend"] == summary["carbon_backend"] == "eit"
    assert summary["energy_source"].startswith("experiment-impact-tracker 0.1.8 (RAPL x the process tree's share")
    assert report["coverage"]["backend"]["samples"] >= 1 and os.getpid() in report["coverage"]["backend"]["process_ids"]
    assert 0 < summary["energy_kwh"] <= report["coverage"]["backend"]["host_rapl_kwh"]


@pytest.mark.slow
def test_eit_backend_without_rapl_falls_back_with_one_line(tmp_path, monkeypatch):
    from core.carbon import tracker
    from core.config import load_config
    from pipelines.train import train
    monkeypatch.setattr(tracker, "RAPL_ROOT", str(tmp_path / "no-powercap"))
    monkeypatch.setenv("PATH", os.path.dirname(os.path.realpath(os.sys.executable)))   # no nvidia-smi
    run_dir = str(tmp_path / "run")
    summary = train(load_config(None, TINY + ["carbon.backend=eit", "total_env_steps=600"]), run_dir, progress=False)
    with open(os.path.join(run_dir, "carbon.json")) as f:
        report = json.load(f)
    assert report["requested_backend"] == "eit" and report["backend"] == summary["carbon_backend"] != "eit"
    assert report["notes"][0].startswith("experiment-impact-tracker unavailable: no RAPL under ")
    assert report["notes"][0].endswith(f"falling back to {report['backend']}")


@pytest.mark.slow
def test_dask_run_records_the_cpu_of_every_stage_process(tmp_path):
    """Every stage the driver submits to Dask leaves its worker's CPU record; carbon.json says what was covered."""
    pytest.importorskip("distributed")
    from core import stage_cpu
    from core.config import load_config
    from pipelines.train import train
    run_dir = str(tmp_path / "run")
    tiny = [a for a in TINY if not a.startswith("executor=")]
    train(load_config(None, tiny + ["executor=dask", "dask.n_workers=1", "carbon.backend=process-time"]),
          run_dir, progress=False)
    with open(os.path.join(run_dir, "carbon.json")) as f:
        carbon = json.load(f)
    cov = carbon["coverage"]
    records, notes = stage_cpu.read_records(cov["stage_records"])
    assert notes == [] and records and all(r.pid != os.getpid() for r in records)
    assert {"run_rollout_group", "write_shard_stage"} <= set(cov["stages_cpu_s"])   # a block's actors: one task a worker
    assert all(v > 0 for v in cov["stages_cpu_s"].values())
    for r in records:   # LocalCluster workers are this host's: the ledger measured them, listed once
        assert carbon["cpu_seconds"][r.label] == pytest.approx(r.covered_s)
        assert any(f"pid {r.pid} already measured" in n for n in carbon["notes"])
    me = carbon["host"]
    assert set(cov["hosts"]) == {me} and cov["hosts"][me]["routes"].keys() == {"ledger"}
    assert cov["hosts"][me]["processes_seen"] >= 1 + len(records)     # driver + every stage worker
    assert cov["hosts"][me]["cpu_s"] == pytest.approx(carbon["counted_cpu_seconds"])
