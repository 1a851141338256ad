"""``EnergyTracker``: one run's energy meter, its lifecycle and the backend choice.

Usage, the backends and the accounting rules: :mod:`core.carbon` (the package's
public surface, which re-exports :class:`EnergyTracker`)::

    EnergyTracker --start--> backend meter (codecarbon | eit | none)
         |                   Ledger thread (psutil samples, this host)
         +----stop---------> stage records + reports --> Attribution --> CarbonReport --> carbon.json

Start-up. ``start()`` costs the caller milliseconds: the ledger (its first
sample at ``start()``) and ``stage_cpu_sink`` are ready at once, and the
backend meter is chosen and started on a background thread
(``carbon-meter-start``; ``backend="eit"`` still starts in the caller, first): codecarbon's import and one-off hardware probe
(py-cpuinfo runs a subprocess) take ~1.6 s on a 2-core machine. ``stop()``
waits for that thread. The meter's window then begins ``head`` seconds after
the tracker's; :func:`with_head` charges the head at the meter's mean power
over its own window, so the energy covers the tracker's whole duration
(carbon.json's ``source`` says how long the head was).

``RAPL_ROOT`` and ``_import_codecarbon`` are read from this module at call
time, so tests that replace them here (``monkeypatch.setattr(tracker, ...)``)
steer backend selection.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from core import stage_cpu, urls
from core.carbon.attribution import Attribution
from core.carbon.codecarbon_meter import CodecarbonMeter, import_codecarbon
from core.carbon.ledger import Ledger
from core.carbon.model import DEFAULT_WATTS_PER_THREAD
from core.carbon.report import CarbonReport

log = logging.getLogger(__name__)

BACKENDS = ("codecarbon", "eit", "process-time")
#: Where RAPL counters live; experiment-impact-tracker is pointed here (core.carbon.eit), tests move it.
RAPL_ROOT = "/sys/class/powercap"
#: codecarbon importer; tests replace it here to simulate codecarbon's absence.
_import_codecarbon = import_codecarbon


def _eit_unavailable_reason() -> Optional[str]:
    """None when experiment-impact-tracker can measure here, else why not (one line)."""
    from core.carbon import eit
    return eit.unavailable_reason(RAPL_ROOT)


def available_backends() -> List[str]:
    """Backends that work on this machine, best first (``process-time`` always works)."""
    out = []
    if _eit_unavailable_reason() is None:
        out.append("eit")
    try:
        _import_codecarbon()
        out.append("codecarbon")
    except ImportError:
        pass
    return out + ["process-time"]


def with_head(measured, head_s: float, window_s: float):
    """A meter's ``stop()`` result (IT kWh, intensity, detail, parts kWh) over its ``window_s`` seconds,
    extended over the ``head_s`` seconds before it had started, at its mean power over the window."""
    if head_s <= 0 or window_s <= 0:
        return measured
    kwh, intensity, detail, parts = measured
    k = (head_s + window_s) / window_s
    detail += (f"; it started {head_s:.2f} s after the tracker (probe in the background), that head charged "
               f"at its mean power over its {window_s:.2f} s")
    return k * kwh, intensity, detail, {name: k * v for name, v in parts.items()}


class EnergyTracker(Attribution):
    """Measures one run and writes ``run_dir/carbon.json`` on ``stop()``.

    Args:
      run_dir: local path or fsspec URL of the run directory.
      backend: "auto" (codecarbon if installed, else process-time), "codecarbon",
        "eit" or "process-time". An unusable choice logs one warning line and falls back.
      country: ISO-3166 alpha-3 code of the grid (codecarbon's ``country_iso_code``).
      pue: data-centre overhead multiplied into every backend's energy; 1.58 is
        experiment-impact-tracker's (ActorQ's) value.
      worker_pids_fn: returns PIDs of local worker processes (Dask/Beam); called
        at the ledger's process-table scans (every 10 s, :class:`core.carbon.ledger.Ledger`). Their
        CPU time, children included, is counted.
      watts_per_thread, ram_watts, intensity_g_per_kwh: override the CPU-time
        model's constants and the grid intensity (None = core.carbon.model's defaults).
      sample_interval_s: ledger sampling period (default 5 s, codecarbon's own period); bounds the CPU
        time lost for an untracked-parent process that exits before ``stop()``. CPU times are cumulative,
        so the totals do not depend on it otherwise; the mean RSS (the RAM model) is over its samples. At 1 s
        an idle probe put the ledger at ~1.3 ms of the driver's CPU per second (2-core AMD EPYC, 2026-12-06);
        ``benchmarks/studies/cluster_scale.py`` at one actor: driver 56.1 -> 52.9 ms CPU per 1,000 env
        steps with 5 s (one run each, near its noise).
    """

    def __init__(self, run_dir: str, backend: str = "auto", country: str = "USA",
                 pue: float = 1.0, worker_pids_fn: Optional[Callable[[], Iterable[int]]] = None,
                 *, watts_per_thread: float = DEFAULT_WATTS_PER_THREAD,
                 ram_watts: Optional[float] = None, intensity_g_per_kwh: Optional[float] = None,
                 sample_interval_s: float = 5.0):
        if backend not in ("auto",) + BACKENDS:
            raise ValueError(f"unknown carbon backend {backend!r}; valid: auto, {', '.join(BACKENDS)}")
        country = str(country).upper()
        if len(country) != 3 or not country.isalpha():
            raise ValueError(f"carbon country {country!r} is not an ISO-3166 alpha-3 code; valid e.g. USA, FRA, DEU")
        if not pue >= 1.0:
            raise ValueError(f"pue {pue!r} must be >= 1.0 (1.0 = no overhead, 1.58 = experiment-impact-tracker)")
        self.run_dir = urls.normalize(run_dir)
        self.requested_backend, self.country, self.pue = backend, country, float(pue)
        self._fn, self._w, self._ram_w = worker_pids_fn, float(watts_per_thread), ram_watts
        self._intensity, self._interval = intensity_g_per_kwh, float(sample_interval_s)
        self._reported: Dict[str, Tuple[float, Optional[str], Optional[int]]] = {}
        self._lock = threading.Lock()
        self._meter = self._ledger = self._thread = self._meter_thread = None
        self._meter_t0 = 0.0
        self._notes: List[str] = []
        self._stage_records: List[stage_cpu.ProcessCpu] = []
        self.stage_cpu_sink: Optional[str] = None   # set by start(); stages record their CPU there
        self.backend: Optional[str] = None
        self.report: Optional[CarbonReport] = None

    # -- lifecycle
    def __enter__(self) -> "EnergyTracker":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._notes.append(f"run ended with {exc_type.__name__}")
        self.stop()

    def start(self) -> "EnergyTracker":
        """Start measuring now; returns in milliseconds (see the module docstring's "Start-up")."""
        if self._ledger is not None:
            raise RuntimeError("EnergyTracker.start() called twice")
        early = self.requested_backend == "eit"   # eit's energy must match its own counters' window:
        if early:                                 # it starts here, before the tracker's clock, as before
            self._start_meter()
        self._start_wall, self._t0 = time.time(), time.perf_counter()
        self._meter_t0 = self._t0 if early else 0.0
        self.stage_cpu_sink = stage_cpu.sink_url(self.run_dir, stage_cpu.new_session())
        self._ledger = Ledger(self._fn, self._start_wall)
        self._ledger.sample()
        self._stop_evt = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="carbon-ledger", daemon=True)
        self._thread.start()
        if not early:
            self._meter_thread = threading.Thread(target=self._start_meter, name="carbon-meter-start", daemon=True)
            self._meter_thread.start()
        return self

    def _start_meter(self) -> None:
        """Background: choose and start the backend meter (codecarbon's hardware probe takes ~1.6 s)."""
        try:
            meter, backend = self._select_meter()
        except Exception as e:  # accounting must never end a run
            meter, backend = None, "process-time"
            self._notes.append(f"backend selection failed ({type(e).__name__}: {e}); using process-time")
        self._meter, self.backend = meter, backend
        if meter is not None:
            try:
                meter.start()
            except Exception as e:
                self._fall_back(f"{backend} failed to start ({type(e).__name__}: {e})")
        self._meter_t0 = self._meter_t0 or time.perf_counter()

    def add_process_cpu_seconds(self, label: str, seconds: float, *,
                                host: Optional[str] = None, pid: Optional[int] = None) -> None:
        """Add CPU time a worker process spent on this run (see ``process_cpu_report``).

        Reporting the same label again replaces its value, so retried reports do
        not double count. ``host`` None means this machine.
        """
        seconds = float(seconds)
        if not 0.0 <= seconds < float("inf"):
            raise ValueError(f"cpu seconds for {label!r} must be finite and >= 0, got {seconds}")
        with self._lock:
            if self.report is not None:
                raise RuntimeError(f"add_process_cpu_seconds({label!r}) after stop(); report is written")
            self._reported[str(label)] = (seconds, host, None if pid is None else int(pid))

    def stop(self) -> CarbonReport:
        """Stop measuring, write ``run_dir/carbon.json`` and return the report (idempotent)."""
        if self.report is not None:
            return self.report
        if self._ledger is None:
            raise RuntimeError("EnergyTracker.stop() before start()")
        if self._meter_thread is not None:
            self._meter_thread.join()   # a run shorter than the probe waits for it here
        self._stop_evt.set()
        self._thread.join()
        self._safe_sample(rescan=True)
        end = time.perf_counter()
        duration = end - self._t0
        measured = None
        if self._meter is not None:
            try:
                measured = with_head(self._meter.stop(), self._meter_t0 - self._t0, end - self._meter_t0)
            except Exception as e:
                self._fall_back(f"{self.backend} failed at stop ({type(e).__name__}: {e})")
        try:
            self._stage_records, read_notes = stage_cpu.read_records(self.stage_cpu_sink)
            self._notes += read_notes
        except Exception as e:  # accounting must never fail a finished run
            self._notes.append(f"stage records unreadable ({type(e).__name__}: {e})")
        with self._lock:
            self.report = self._build_report(duration, measured)
        self.report.save(self.run_dir)
        return self.report

    # -- internals
    def _sample_loop(self) -> None:
        while not self._stop_evt.wait(self._interval):
            self._safe_sample()

    def _safe_sample(self, rescan: bool = False) -> None:
        try:
            self._ledger.sample(rescan=rescan)
        except Exception as e:  # accounting must never end a run
            msg = f"ledger sample failed: {type(e).__name__}: {e}"
            if msg not in self._ledger.notes:
                self._ledger.notes.append(msg)

    def _fall_back(self, why: str) -> None:
        log.warning("%s; falling back to the process-time model", why)
        self._notes.append(why + "; fell back to process-time")
        self._meter, self.backend = None, "process-time"

    def _select_meter(self):
        want = self.requested_backend
        if want == "eit":
            reason = _eit_unavailable_reason()
            if reason is None:
                try:
                    from core.carbon.eit import EitMeter
                    return EitMeter(self.country, RAPL_ROOT), "eit"
                except Exception as e:
                    reason = f"it failed to start ({type(e).__name__}: {e})"
            meter, name = self._codecarbon_or_none(quiet=True, note=False)
            msg = f"experiment-impact-tracker unavailable: {reason}; falling back to {name}"
            log.warning("%s", msg)
            self._notes.append(msg)
            return meter, name
        if want in ("auto", "codecarbon"):
            return self._codecarbon_or_none(quiet=want == "auto")
        return None, "process-time"

    def _codecarbon_or_none(self, quiet: bool, note: bool = True):
        try:
            return CodecarbonMeter(self.country, _import_codecarbon()), "codecarbon"
        except ImportError:
            why = "codecarbon is not installed (pip install 'databloom[carbon]')"
        except Exception as e:
            why, quiet = f"codecarbon failed to initialise ({type(e).__name__}: {e})", False
        if not quiet:
            log.warning("%s; falling back to the process-time model", why)
        if note:
            self._notes.append(why + "; using process-time")
        return None, "process-time"
