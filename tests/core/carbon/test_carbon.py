"""Tests for core.carbon: the CPU-time energy model, attribution, fallbacks, carbon.json.

Budget: the whole file runs in well under 30 s (the codecarbon test ~3 s, the
attribution tests ~1-2 s each, the rest milliseconds).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from core.carbon import tracker
from core.carbon import (CarbonReport, EnergyTracker, available_backends, carbon_ratio,
                         co2e_kg, grid_intensity, process_time_energy_kwh)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _no_codecarbon(monkeypatch):
    def missing():
        raise ImportError("No module named 'codecarbon'")
    monkeypatch.setattr(tracker, "_import_codecarbon", missing)


def _no_eit_hardware(monkeypatch, tmp_path):
    monkeypatch.setattr(tracker, "RAPL_ROOT", str(tmp_path / "no-powercap"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi


def _burn(seconds: float) -> None:
    t = time.process_time()
    while time.process_time() - t < seconds:
        pass


# ----------------------------------------------------------------- exact math

# (cpu_s, wall_s, W/thread, ram W, pue, expected kWh)
ENERGY_CASES = [
    (3600.0, 0.0, 4.0, 0.0, 1.0, 0.004),      # 1 CPU-hour at 4 W = 4 Wh
    (3600.0, 1800.0, 4.0, 2.0, 1.0, 0.005),   # + 2 W RAM for half an hour = 1 Wh
    (3600.0, 1800.0, 4.0, 2.0, 1.58, 0.0079),  # eit/ActorQ PUE
    (0.0, 3600.0, 4.0, 10.0, 2.0, 0.02),
    (7200.0, 0.0, 10.0, 0.0, 1.0, 0.02),
]


@pytest.mark.parametrize("cpu_s,wall_s,w,ram,pue,expected", ENERGY_CASES)
def test_process_time_energy_exact(cpu_s, wall_s, w, ram, pue, expected):
    got = process_time_energy_kwh(cpu_s, wall_s, watts_per_thread=w, ram_watts=ram, pue=pue)
    assert got == pytest.approx(expected, rel=1e-12)


def test_pue_scales_energy_exactly():
    base = process_time_energy_kwh(1234.5, 678.9, ram_watts=3.3)
    assert process_time_energy_kwh(1234.5, 678.9, ram_watts=3.3, pue=1.58) == pytest.approx(
        1.58 * base, rel=1e-15)


def test_co2e_and_intensity_table():
    assert co2e_kg(0.005, 400.0) == pytest.approx(0.002, rel=1e-12)
    assert grid_intensity("USA") == (369.473, pytest.approx(grid_intensity("USA")[1]))
    assert grid_intensity("FRA")[0] == 56.039
    value, note = grid_intensity("XYZ")
    assert value == 475.0 and "world average" in note


# ------------------------------------------------------- tracker, process-time

def test_process_time_tracker_exact_given_cpu_seconds(tmp_path, monkeypatch):
    _no_codecarbon(monkeypatch)
    tr = EnergyTracker(str(tmp_path), backend="process-time", watts_per_thread=4.0,
                       ram_watts=2.0, intensity_g_per_kwh=400.0)
    with tr:
        tr.add_process_cpu_seconds("beam worker a", 3600.0, host="other-host")
        tr.add_process_cpu_seconds("beam worker a", 1800.0, host="other-host")  # a retry replaces
        tr.add_process_cpu_seconds("dask worker b", 1800.0, host="other-host", pid=1)
    r = tr.report
    assert r.backend == "process-time" and r.requested_backend == "process-time"
    assert r.cpu_seconds["beam worker a"] == 1800.0 and r.cpu_seconds["dask worker b"] == 1800.0
    local = r.counted_cpu_seconds - 3600.0
    assert 0.0 <= local < 5.0  # the driver, idle
    # The report is its own proof: energy recomputes exactly from its recorded inputs.
    expected = process_time_energy_kwh(r.counted_cpu_seconds, r.duration_s,
                                       watts_per_thread=4.0, ram_watts=2.0)
    assert r.energy_kwh == pytest.approx(expected, rel=1e-12)
    assert r.energy_kwh == pytest.approx(r.process_time_kwh, rel=1e-12)
    assert r.breakdown_kwh["cpu_time_model"] >= 0.004  # the 3600 reported CPU-s = 4 Wh
    assert r.co2e_kg == pytest.approx(r.energy_kwh * 0.4, rel=1e-12)
    assert r.intensity_g_per_kwh == 400.0
    for part in ("process-time model", "4 W/thread", "PUE=1;", "country=USA", "set by caller"):
        assert part in r.source


def test_pue_158_in_tracker_is_exact_and_named(tmp_path):
    tr = EnergyTracker(str(tmp_path), backend="process-time", pue=1.58, ram_watts=0.0)
    with tr:
        tr.add_process_cpu_seconds("w", 900.0, host="h2")
    r = tr.report
    assert r.pue == 1.58
    raw = process_time_energy_kwh(r.counted_cpu_seconds, r.duration_s, ram_watts=0.0)
    assert r.energy_kwh == pytest.approx(1.58 * raw, rel=1e-12)
    assert "PUE=1.58 (experiment-impact-tracker/ActorQ accounting)" in r.source


def test_default_intensity_from_embedded_table(tmp_path):
    with EnergyTracker(str(tmp_path), backend="process-time", country="fra") as tr:
        tr.add_process_cpu_seconds("w", 3600.0, host="h2")
    r = tr.report
    assert r.country == "FRA" and r.intensity_g_per_kwh == 56.039
    assert r.co2e_kg == pytest.approx(r.energy_kwh * 0.056039, rel=1e-12)
    assert "codecarbon 3.3.2 energy-mix table" in r.source


# ------------------------------------------------------------------ attribution

def test_reaped_child_counted_through_driver(tmp_path):
    code = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.4: pass"
    with EnergyTracker(str(tmp_path), backend="process-time", sample_interval_s=0.1) as tr:
        subprocess.run([sys.executable, "-c", code], check=True)  # exits and is reaped
    r = tr.report
    reaped = [v for k, v in r.cpu_seconds.items() if k.endswith("reaped children")]
    assert len(reaped) == 1 and reaped[0] >= 0.35
    # the child was sampled alive too, but it is not counted twice
    assert r.counted_cpu_seconds == pytest.approx(sum(r.cpu_seconds.values()), abs=1e-9)
    assert r.counted_cpu_seconds < 0.4 + reaped[0] + 1.0


def test_worker_pids_fn_counts_a_process_outside_the_driver_tree(tmp_path):
    """An orphaned worker (parent exited) is not a descendant: only worker_pids_fn finds it."""
    flag, done = tmp_path / "go", tmp_path / "done"
    grand = textwrap.dedent(f"""
        import os, time
        end = time.time() + 30
        while not os.path.exists({str(flag)!r}) and time.time() < end: time.sleep(0.01)
        t = time.process_time()
        while time.process_time() - t < 0.5: pass
        open({str(done)!r}, "w").close()
        time.sleep(20)
    """)
    middle = ("import subprocess, sys\n"
              f"p = subprocess.Popen([sys.executable, '-c', {grand!r}], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
              "print(p.pid, flush=True)")
    out = subprocess.run([sys.executable, "-c", middle], capture_output=True, text=True, check=True)
    gpid = int(out.stdout.strip())
    try:
        tr = EnergyTracker(str(tmp_path / "run"), backend="process-time",
                           worker_pids_fn=lambda: [gpid], sample_interval_s=0.1)
        with tr:
            flag.touch()
            deadline = time.time() + 15
            while not done.exists() and time.time() < deadline:
                time.sleep(0.02)
            assert done.exists()
            tr.add_process_cpu_seconds("same worker, reported", 0.5, pid=gpid)  # deduplicated
    finally:
        os.kill(gpid, signal.SIGTERM)
    r = tr.report
    worker = [v for k, v in r.cpu_seconds.items() if k.endswith(f"pid={gpid}")]
    assert len(worker) == 1 and worker[0] >= 0.45
    assert r.counted_cpu_seconds >= worker[0]
    assert r.counted_cpu_seconds < worker[0] + 1.0  # the 0.5 s report was not added
    assert any("already measured" in n for n in r.notes)


def test_machine_backend_does_not_add_local_cpu_seconds(tmp_path, monkeypatch):
    """Machine-level meters already contain this host: only other hosts' reports are added."""

    class FakeMachineMeter:
        covers = "machine"

        def start(self):
            pass

        def stop(self):
            return 0.001, 500.0, "fake machine meter", {"host_cpu": 0.001}

    monkeypatch.setattr(EnergyTracker, "_select_meter", lambda self: (FakeMachineMeter(), "codecarbon"))
    monkeypatch.setattr(tracker, "with_head", lambda measured, head_s, window_s: measured)  # test_tracker_start
    with EnergyTracker(str(tmp_path), backend="codecarbon", watts_per_thread=4.0) as tr:
        tr.add_process_cpu_seconds("local worker", 3600.0)                 # same host: inside 0.001
        tr.add_process_cpu_seconds("remote worker", 3600.0, host="gcp-vm")  # + 0.004
    r = tr.report
    assert r.energy_kwh == pytest.approx(0.005, rel=1e-12)
    assert r.breakdown_kwh == pytest.approx({"host_cpu": 0.001, "cpu_time_model": 0.004}, rel=1e-12)
    assert r.co2e_kg == pytest.approx(0.0025, rel=1e-12)
    assert r.cpu_seconds["local worker"] == 3600.0


# ------------------------------------------------------------------- fallbacks

def test_eit_unavailable_one_warning_line_and_fallback(tmp_path, monkeypatch, caplog):
    _no_eit_hardware(monkeypatch, tmp_path)
    _no_codecarbon(monkeypatch)
    caplog.set_level(logging.WARNING)
    with EnergyTracker(str(tmp_path / "run"), backend="eit") as tr:
        pass
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "core.carbon.tracker"]
    assert len(warnings) == 1
    msg = warnings[0].getMessage()
    assert "\n" not in msg
    assert msg.startswith("experiment-impact-tracker unavailable: no RAPL")
    assert msg.endswith("falling back to process-time")
    assert tr.report.backend == "process-time" and tr.report.requested_backend == "eit"
    assert tr.report.notes[0] == msg
    assert "eit" not in available_backends()
    assert available_backends()[-1] == "process-time"


def test_explicit_codecarbon_missing_warns_auto_does_not(tmp_path, monkeypatch, caplog):
    _no_codecarbon(monkeypatch)
    caplog.set_level(logging.WARNING)
    with EnergyTracker(str(tmp_path / "a"), backend="auto") as auto:
        pass
    ours = lambda: [r for r in caplog.records if r.name == "core.carbon.tracker"]  # noqa: E731
    assert not ours() and auto.report.backend == "process-time"
    with EnergyTracker(str(tmp_path / "b"), backend="codecarbon") as explicit:
        pass
    assert len(ours()) == 1 and "codecarbon is not installed" in ours()[0].getMessage()
    assert explicit.report.backend == "process-time"


def test_core_works_without_codecarbon_or_psutil(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["codecarbon"] = None
        sys.modules["psutil"] = None
        from core.carbon import EnergyTracker, available_backends
        assert available_backends() == ["process-time"], available_backends()
        with EnergyTracker({str(tmp_path)!r}, backend="auto") as tr:
            sum(range(10**6))
        r = tr.report
        assert r.backend == "process-time" and r.energy_kwh > 0, r
        assert any("psutil missing" in n for n in r.notes), r.notes
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# --------------------------------------------------------------- carbon.json

@pytest.mark.parametrize("url", ["local", "memory://carbon-test/run"])
def test_carbon_json_round_trips(tmp_path, url):
    run_dir = str(tmp_path / "run") if url == "local" else url
    with EnergyTracker(run_dir, backend="process-time") as tr:
        tr.add_process_cpu_seconds("w", 12.5, host="h2")
    assert CarbonReport.load(run_dir) == tr.report
    if url == "local":
        assert os.listdir(run_dir) == ["carbon.json"]  # JSON only: no pickle, no CSV
        with open(os.path.join(run_dir, "carbon.json")) as f:
            assert json.load(f)["energy_kwh"] == tr.report.energy_kwh


def test_schema_too_new_is_a_clear_error():
    d = json.loads(CarbonReport(1.0, 1.0, 1.0, "s", 1.0, {}, []).to_json())
    d["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99 is not supported"):
        CarbonReport.from_dict(d)


def test_carbon_ratio():
    def rep(kg, backend="codecarbon", pue=1.0):
        return CarbonReport(1.0, kg, 1.0, "s", pue, {}, [], backend=backend)
    assert carbon_ratio(rep(3.8), rep(1.0)) == pytest.approx(3.8)
    with pytest.raises(ValueError, match="same backend and PUE"):
        carbon_ratio(rep(1.0), rep(1.0, backend="process-time"))
    with pytest.raises(ValueError, match="same backend and PUE"):
        carbon_ratio(rep(1.0), rep(1.0, pue=1.58))
    with pytest.raises(ValueError, match="denominator"):
        carbon_ratio(rep(1.0), rep(0.0))


# ------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,match", [
    ({"backend": "rapl"}, "unknown carbon backend 'rapl'; valid: auto, codecarbon, eit, process-time"),
    ({"country": "US"}, "not an ISO-3166 alpha-3 code"),
    ({"pue": 0.9}, "must be >= 1.0"),
])
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        EnergyTracker(str(tmp_path), **kwargs)


def test_misuse(tmp_path):
    tr = EnergyTracker(str(tmp_path), backend="process-time")
    with pytest.raises(RuntimeError, match="before start"):
        tr.stop()
    tr.start()
    with pytest.raises(ValueError, match="finite and >= 0"):
        tr.add_process_cpu_seconds("w", -1.0)
    first = tr.stop()
    assert tr.stop() is first
    with pytest.raises(RuntimeError, match="after stop"):
        tr.add_process_cpu_seconds("late", 1.0)


# ------------------------------------------------------------------ codecarbon

def test_codecarbon_backend_offline_records_energy(tmp_path):
    pytest.importorskip("codecarbon")
    tr = EnergyTracker(str(tmp_path), backend="auto", country="USA")
    with tr:
        _burn(1.2)
    r = tr.report
    assert r.backend == "codecarbon"
    assert r.energy_kwh > 0 and r.co2e_kg > 0
    assert r.breakdown_kwh["host_cpu"] > 0 and r.breakdown_kwh["host_ram"] > 0
    assert r.intensity_g_per_kwh == pytest.approx(369.473, rel=1e-6)  # codecarbon offline data
    assert r.source.startswith("codecarbon 3.") and "offline" in r.source
    assert "country=USA" in r.source
    assert r.counted_cpu_seconds >= 1.0 and r.process_time_kwh > 0
    assert os.listdir(tmp_path) == ["carbon.json"]  # codecarbon's CSV output is off
