"""EnergyTracker.start() returns before the backend meter has started (its probe runs on a thread),
and nothing between the two is lost: ledger samples, stage records and the meter's head energy."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from core import stage_cpu
from core.carbon import EnergyTracker
from core.carbon.tracker import with_head

WATTS = 3600.0   # 1 W-hour per hour: kWh = WATTS * s / 3.6e6 = s / 1000


class SlowMeter:
    """A machine-wide meter whose start() blocks until ``go`` is set (a hardware probe that takes a while);
    its stop() returns WATTS x the seconds since its start() returned, as a real power meter would."""
    covers = "machine"

    def __init__(self, go: threading.Event, clock):
        self.go, self.clock, self.t = go, clock, None

    def start(self):
        assert self.go.wait(30)
        self.t = self.clock()

    def stop(self):
        kwh = WATTS * (self.clock() - self.t) / 3.6e6
        return kwh, 500.0, "slow meter", {"host_cpu": kwh}


def test_start_returns_before_the_meter_and_nothing_before_it_is_lost(tmp_path, monkeypatch):
    go = threading.Event()
    meter = SlowMeter(go, time.perf_counter)
    monkeypatch.setattr(EnergyTracker, "_select_meter", lambda self: (meter, "codecarbon"))
    tr = EnergyTracker(str(tmp_path / "run"), backend="codecarbon", sample_interval_s=0.05).start()
    assert meter.t is None                      # start() did not wait for the probe
    assert tr.stage_cpu_sink                    # stages can record from the first task on
    stage_cpu.counted(lambda: sum(range(10**5)), sink=tr.stage_cpu_sink)()   # a stage's record
    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)   # runs and is reaped before the meter starts
    assert meter.t is None
    go.set()
    r = tr.stop()
    reaped = [v for k, v in r.cpu_seconds.items() if k.endswith("reaped children")]
    assert len(reaped) == 1 and reaped[0] >= 0.25           # the ledger sampled before the meter started
    assert len(tr._stage_records) == 1                      # the stage record written before it too
    # the meter's energy covers the tracker's whole duration (>= 0.3 s longer than the meter's window), up to
    # the thread switches between the meter's clock reads and the tracker's (ms; exact math: test_with_head_exact)
    assert r.breakdown_kwh["host_cpu"] == pytest.approx(WATTS * r.duration_s / 3.6e6, abs=WATTS * 0.03 / 3.6e6)
    assert r.energy_kwh == pytest.approx(r.breakdown_kwh["host_cpu"], rel=1e-12)
    assert "after the tracker (probe in the background)" in r.source
    assert r.backend == "codecarbon"


def test_with_head_exact():
    kwh, intensity, detail, parts = with_head((2.0, 400.0, "m", {"cpu": 1.5, "ram": 0.5}), 1.0, 4.0)
    assert (kwh, intensity, parts) == (2.5, 400.0, {"cpu": 1.875, "ram": 0.625})
    assert detail.startswith("m; it started 1.00 s after the tracker")
    same = (2.0, None, "m", {"cpu": 2.0})
    assert with_head(same, 0.0, 4.0) is same and with_head(same, 1.0, 0.0) is same


def test_meter_failing_to_start_in_the_background_falls_back(tmp_path, monkeypatch):
    class Broken:
        covers = "machine"

        def start(self):
            raise OSError("no such sensor")

    monkeypatch.setattr(EnergyTracker, "_select_meter", lambda self: (Broken(), "codecarbon"))
    with EnergyTracker(str(tmp_path / "run"), backend="codecarbon") as tr:
        pass
    r = tr.report
    assert r.backend == "process-time" and r.requested_backend == "codecarbon"
    assert r.notes[0] == "codecarbon failed to start (OSError: no such sensor); fell back to process-time"
