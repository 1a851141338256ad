"""Energy and carbon accounting for one training run, written to ``RUN_DIR/carbon.json``.

Usage (the training loop)::

    tracker = EnergyTracker(run_dir, backend="auto", country="USA", pue=1.0,
                            worker_pids_fn=lambda: client.run(os.getpid).values())
    with tracker:                       # or tracker.start() ... tracker.stop()
        client.submit(CountStageCpu(stage_fn, tracker.stage_cpu_sink), ...)   # stages on any host
        train()
        for label, cpu_s in worker_reports:   # Dask/Beam workers report their own CPU time
            tracker.add_process_cpu_seconds(label, cpu_s, host=..., pid=...)
    report = tracker.report             # CarbonReport; also in run_dir/carbon.json
    carbon_ratio(fp32_report, int8_report)   # 1.9 -> int8 emitted 1.9x less

Backends (``available_backends()`` lists the usable ones, best first):

* ``codecarbon`` (default; extra ``databloom[carbon]``): codecarbon's
  ``OfflineEmissionsTracker`` in ``tracking_mode="machine"``. Without RAPL it
  estimates CPU power from whole-machine load (unknown CPU: TDP = 4 W per
  thread, power = TDP x (0.1 + 0.9 load^3)) plus a fixed RAM estimate (5 W per
  assumed DIMM); grid intensity from its offline per-country data. Nothing
  goes to the network and its CSV output is off: carbon.json is the record.
* ``eit`` (experiment-impact-tracker 0.1.8, what ActorQ used; extra
  ``databloom[eit]``): used only where RAPL (``RAPL_ROOT/intel-rapl``) or
  ``nvidia-smi`` exists *and* the package imports behind the compatibility
  layer in :mod:`core.carbon_eit` (pandas 3, offline region from ``country``).
  Otherwise one warning line names why and the tracker falls back to
  ``auto``. eit writes pickles, so it logs to a temporary directory that is
  deleted after its totals are read; only JSON lands in the run dir.
* ``process-time`` (no dependency; also the fallback): the CPU-time model

      E_kWh = PUE * (sum_p cpu_s_p * W_thread + W_ram * T_wall) / 3.6e6
      CO2e_kg = E_kWh * I_country / 1000

  with ``W_thread`` = 4 W (codecarbon's rule for a CPU missing from its TDP
  table: 4 W per hardware thread, i.e. 4 J per busy CPU-second; this is also
  exactly what codecarbon's own ``process`` mode charges per CPU-second),
  ``W_ram`` = 3 W per 8 GB of the run's mean resident memory (codecarbon's
  pre-v3 rule, after crucial.com), and ``I_country`` from
  ``GRID_INTENSITY_G_PER_KWH`` below.

``pue`` multiplies every backend's IT energy the same way (codecarbon is run at
PUE 1 and eit's built-in 1.58 is divided out first). ``pue=1.58`` reproduces
experiment-impact-tracker's (and so ActorQ's) accounting.

Attribution: what counts as "the run", and the no-double-count rule
--------------------------------------------------------------------
A ledger samples, with psutil, every ``sample_interval_s`` and at start/stop:
the driver (learner) process, all its descendants, and every PID returned by
``worker_pids_fn`` plus their descendants. A process's CPU time is
``user + system + children_user + children_system`` minus its value at start
(zero baseline for processes created during the run). ``children_*`` counts
descendants the process has already reaped, so a Dask ``LocalCluster`` closed
before ``stop()`` is still counted, through the driver. A process that has
gone is skipped when a tracked ancestor is still alive (its time is in that
ancestor's ``children_*``); otherwise its last sample counts (a lower bound:
at most ``sample_interval_s`` of its CPU time is lost).

The ledger only sees this host. Two more routes reach every other process
that ran a stage:

* stage records: a stage wrapped in :class:`core.stage_cpu.CountStageCpu`
  (Dask executor's ``task_wrapper`` hook, Beam round stages) writes its
  process's CPU (union of its stage spans on the process CPU clock) to
  ``stage_cpu_sink`` = ``RUN_DIR/carbon/<session>/``; ``stop()`` reads them.
* reports: ``add_process_cpu_seconds`` (e.g. ``process_cpu_report()`` run
  inside a worker).

One process counts once, by the first route that saw it (host, pid): the
ledger, then a stage record, then a report; the others are listed in
``cpu_seconds`` with a note, not added. ``coverage`` in carbon.json says,
per host, how many processes and CPU seconds were counted by which route,
and ``stages_cpu_s`` splits stage CPU by stage function.

The backend measures one part of the run; the CPU-time model adds the rest:

* ``codecarbon`` measures **this whole machine**: every process on this host
  (ledger entries and reports with ``host`` None or this host) is already in
  its number, so none of their CPU seconds are added. Only reports from other
  hosts are added with the CPU-time model. On a shared machine this counts
  other users' load too (an overestimate); ``process_time_kwh`` gives the
  attributed figure for the same run next to it.
* ``eit`` measures **the driver and its descendants** (RAPL x the process
  tree's CPU share). Ledger entries outside that tree and all reports are added.
* ``process-time`` measures nothing itself: every counted CPU-second is
  charged ``W_thread``, plus local RAM over the wall time.

Reported CPU seconds are charged CPU power only (a remote host's RAM and idle
power are unknown) at this run's ``country`` intensity.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from core import stage_cpu, urls
from core.carbon_eit import EIT_PUE  # experiment-impact-tracker's built-in PUE, used by ActorQ

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
REPORT_NAME = "carbon.json"
BACKENDS = ("codecarbon", "eit", "process-time")

#: codecarbon's power for a hardware thread of a CPU missing from its TDP table.
DEFAULT_WATTS_PER_THREAD = 4.0
#: codecarbon's pre-v3 RAM rule: 3 W per 8 GB.
RAM_WATTS_PER_GB = 3.0 / 8.0
#: Where RAPL counters live; experiment-impact-tracker is pointed here (core.carbon_eit), tests move it.
RAPL_ROOT = "/sys/class/powercap"
#: How a process's CPU seconds reached the report (carbon.json ``coverage.routes``).
ROUTES = {
    "ledger": "psutil samples on the driver's host every sample_interval_s: the driver, its "
              "descendants (reaped ones through children_* times) and worker_pids_fn's processes",
    "stage record": "each stage's process CPU (getrusage, own + reaped children), union of stage spans "
                    "per process, written by core.stage_cpu.CountStageCpu under RUN_DIR/carbon/<session>/",
    "report": "add_process_cpu_seconds (e.g. process_cpu_report run inside a worker)",
}

#: Grid carbon intensity, gCO2e/kWh, for the process-time model. Source: the
#: ``carbon_intensity`` field of codecarbon 3.3.2
#: ``data/private_infra/global_energy_mix.json`` (Our World in Data / Ember,
#: year 2023; ISR 2022). Other countries: the world average below.
GRID_INTENSITY_G_PER_KWH: Dict[str, float] = {
    "USA": 369.473, "CAN": 170.043, "MEX": 507.245, "BRA": 98.348,
    "GBR": 237.589, "IRL": 290.805, "FRA": 56.039, "DEU": 380.95,
    "NLD": 267.622, "BEL": 138.107, "ESP": 174.05, "ITA": 330.718,
    "CHE": 34.843, "SWE": 40.695, "NOR": 30.08, "FIN": 79.158,
    "POL": 661.926, "CHN": 582.317, "IND": 713.441, "JPN": 485.392,
    "KOR": 430.567, "TWN": 642.378, "SGP": 470.783, "AUS": 548.692,
    "ZAF": 707.686, "ISR": 582.927,
}
#: World average, gCO2e/kWh (IEA Global Energy & CO2 Status Report 2019, as in codecarbon).
WORLD_INTENSITY_G_PER_KWH = 475.0


# ----------------------------------------------------------------------------- math

def process_time_energy_kwh(cpu_seconds: float, wall_s: float, *,
                            watts_per_thread: float = DEFAULT_WATTS_PER_THREAD,
                            ram_watts: float = 0.0, pue: float = 1.0) -> float:
    """``E_kWh = PUE * (cpu_seconds * watts_per_thread + ram_watts * wall_s) / 3.6e6``."""
    return pue * (cpu_seconds * watts_per_thread + ram_watts * wall_s) / 3.6e6


def co2e_kg(energy_kwh: float, intensity_g_per_kwh: float) -> float:
    """``CO2e_kg = E_kWh * I / 1000`` with ``I`` in gCO2e/kWh."""
    return energy_kwh * intensity_g_per_kwh / 1000.0


def grid_intensity(country: str) -> Tuple[float, str]:
    """Embedded intensity for an ISO-3166 alpha-3 code and a note naming its source."""
    if country in GRID_INTENSITY_G_PER_KWH:
        return GRID_INTENSITY_G_PER_KWH[country], "codecarbon 3.3.2 energy-mix table (OWID/Ember 2023)"
    return WORLD_INTENSITY_G_PER_KWH, f"no embedded value for {country}: world average (IEA 2019)"


# --------------------------------------------------------------------------- report

@dataclasses.dataclass
class CarbonReport:
    """Energy and CO2e of one run. ``source`` names how it was measured; quote it with the numbers.

    ``cpu_seconds`` lists every process seen or reported (label -> CPU seconds in
    the run); ``counted_cpu_seconds`` is their sum without duplicates (a report
    for a process the ledger measured is listed, not counted).
    ``breakdown_kwh`` splits ``energy_kwh`` (after PUE). ``process_time_kwh``
    is the process-time model over the same processes, for cross-checking.
    ``coverage`` states what was measured and how: the backend's scope (for
    eit its samples, host-level RAPL kWh and process ids), and per host the
    processes seen (``processes_seen``: a reaped worker's CPU is inside its
    parent's), those counted with their own CPU seconds (``processes``,
    ``cpu_s``) and by which route (ledger, stage records, reports).
    """

    energy_kwh: float
    co2e_kg: float
    duration_s: float
    source: str
    pue: float
    cpu_seconds: Dict[str, float]
    notes: List[str]
    backend: str = "process-time"
    requested_backend: str = "auto"
    country: str = "USA"
    intensity_g_per_kwh: float = 0.0
    breakdown_kwh: Dict[str, float] = dataclasses.field(default_factory=dict)
    counted_cpu_seconds: float = 0.0
    process_time_kwh: float = 0.0
    watts_per_thread: float = DEFAULT_WATTS_PER_THREAD
    ram_watts: float = 0.0
    host: str = ""
    started_at: str = ""
    coverage: Dict[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "CarbonReport":
        version = d.get("schema_version")
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise ValueError(f"carbon.json schema_version {version!r} is not supported; "
                             f"valid: 1..{SCHEMA_VERSION} (upgrade databloom)")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def load(cls, run_dir: str) -> "CarbonReport":
        """Read ``run_dir/carbon.json`` (local path or fsspec URL)."""
        fs, path = urls.resolve(urls.join(run_dir, REPORT_NAME))
        with fs.open(path, "r") as f:
            return cls.from_dict(json.load(f))

    def save(self, run_dir: str) -> str:
        """Write ``run_dir/carbon.json`` via a temporary name and a rename."""
        url = urls.join(run_dir, REPORT_NAME)
        fs, path = urls.resolve(url)
        fs.makedirs(urls.resolve(run_dir)[1], exist_ok=True)
        with fs.open(path + ".tmp", "w") as f:
            f.write(self.to_json())
        fs.mv(path + ".tmp", path)
        return url


def carbon_ratio(a: CarbonReport, b: CarbonReport) -> float:
    """``a.co2e_kg / b.co2e_kg``: carbon_ratio(fp32, int8) = 1.9 means int8 emitted 1.9x less.

    Raises ValueError if the two were measured differently (backend or PUE), since
    a ratio across energy sources compares the sources, not the runs.
    """
    if (a.backend, a.pue) != (b.backend, b.pue):
        raise ValueError(f"carbon_ratio needs reports from the same backend and PUE; got "
                         f"{a.backend} PUE {a.pue} vs {b.backend} PUE {b.pue}")
    if b.co2e_kg <= 0:
        raise ValueError(f"carbon_ratio: denominator has co2e_kg={b.co2e_kg}; need > 0")
    return a.co2e_kg / b.co2e_kg


# ----------------------------------------------------------------------- backends

def _import_codecarbon():
    """codecarbon module, or ImportError. Tests replace this to simulate its absence."""
    import codecarbon  # noqa: PLC0415 (optional dependency)
    return codecarbon


def _eit_unavailable_reason() -> Optional[str]:
    """None when experiment-impact-tracker can measure here, else why not (one line)."""
    from core import carbon_eit
    return carbon_eit.unavailable_reason(RAPL_ROOT)


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


class _CodecarbonMeter:
    """codecarbon OfflineEmissionsTracker, machine mode, PUE 1, no files written."""
    covers = "machine"

    def __init__(self, country: str):
        cc = _import_codecarbon()
        # log_level="error" sets codecarbon's logger after its first INFO line; set it
        # first too. Its per-interval chatter would drown the training progress, and
        # what it found (no RAPL, unknown CPU -> 4 W/thread) goes into `source`.
        logging.getLogger("codecarbon").setLevel(logging.ERROR)
        self.version = cc.__version__
        self._t = cc.OfflineEmissionsTracker(
            country_iso_code=country, tracking_mode="machine", measure_power_secs=5,
            save_to_file=False, log_level="error", pue=1.0, project_name="databloom")

    def start(self) -> None:
        self._t.start()

    def stop(self) -> Tuple[float, Optional[float], str, Dict[str, float]]:
        """(IT kWh, intensity g/kWh or None, source detail, breakdown kWh)."""
        if self._t.stop() is None:
            raise RuntimeError("codecarbon stop() returned no data")
        d = self._t.final_emissions_data
        conf = getattr(self._t, "_conf", {})
        hw = ", ".join(conf.get("hardware", [])) or "unknown hardware"
        rapl = "RAPL" in hw.replace(" ", "").upper()
        how = ("CPU power from RAPL" if rapl else
               f"CPU power estimated from machine load (no RAPL), {d.cpu_model} x{d.cpu_count} "
               f"threads, mean {d.cpu_power:.2f} W")
        detail = (f"codecarbon {self.version} offline, tracking_mode=machine, {how}; "
                  f"RAM {d.ram_power:.1f} W fixed estimate")
        energy = float(d.energy_consumed)
        intensity = 1000.0 * d.emissions / energy if energy > 0 else None
        parts = {"host_cpu": float(d.cpu_energy), "host_ram": float(d.ram_energy),
                 "host_gpu": float(d.gpu_energy)}
        return energy, intensity, detail, parts


# ------------------------------------------------------------------------- ledger

@dataclasses.dataclass
class _Proc:
    label: str
    pid: int
    ppid: int
    in_tree: bool
    base: float
    last: float
    own_base: float
    own_last: float
    alive: bool = True


def _cpu_total(p) -> Tuple[float, float]:
    """(user+system, user+system+children_user+children_system) of a psutil.Process."""
    t = p.cpu_times()
    own = t.user + t.system
    return own, own + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)


class _Ledger:
    """Per-process CPU seconds of the driver tree and worker PIDs (see module docstring)."""

    def __init__(self, worker_pids_fn: Optional[Callable[[], Iterable[int]]], start_wall: float):
        self._fn = worker_pids_fn
        self._start_wall = start_wall
        self.procs: Dict[Tuple[int, float], _Proc] = {}
        self.notes: List[str] = []
        self.rss_samples: List[float] = []
        try:
            import psutil
            self._ps = psutil
            self._root = psutil.Process()
        except ImportError:
            self._ps = None
            self._t0 = os.times()
            self.notes.append("psutil missing: only the driver and its reaped children are counted")

    def _candidates(self):
        ps, seen = self._ps, set()
        tree = [self._root] + self._root.children(recursive=True)
        for p in tree:
            seen.add(p.pid)
            yield p, True
        if self._fn is None:
            return
        try:
            pids = [int(x) for x in self._fn()]
        except Exception as e:  # a failing callback must not end the run
            msg = f"worker_pids_fn failed: {type(e).__name__}: {e}"
            if msg not in self.notes:
                self.notes.append(msg)
            return
        for pid in pids:
            try:
                w = ps.Process(pid)
                for p in [w] + w.children(recursive=True):
                    if p.pid not in seen:
                        seen.add(p.pid)
                        yield p, False
            except (ps.NoSuchProcess, ps.AccessDenied):
                continue

    def sample(self) -> None:
        if self._ps is None:
            return
        ps, rss = self._ps, 0.0
        for proc in self.procs.values():
            proc.alive = False
        for p, in_tree in self._candidates():
            try:
                with p.oneshot():
                    key = (p.pid, p.create_time())
                    own, total = _cpu_total(p)
                    rss += p.memory_info().rss
                    ppid, name = p.ppid(), p.name()
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
            rec = self.procs.get(key)
            if rec is None:
                new = key[1] >= self._start_wall - 0.05  # created during the run: all its time counts
                label = ("driver" if p.pid == self._root.pid else name) + f" pid={p.pid}"
                rec = self.procs[key] = _Proc(label, p.pid, ppid, in_tree,
                                              0.0 if new else total, total,
                                              0.0 if new else own, own)
            rec.last, rec.own_last, rec.alive = total, own, True
        self.rss_samples.append(rss / 2**30)

    def counted(self) -> List[Tuple[_Proc, float]]:
        """(process, CPU seconds it adds) after the gone-process rule."""
        if self._ps is None:
            t = os.times()
            s = sum(t[:4]) - sum(self._t0[:4])
            return [(_Proc(f"driver pid={os.getpid()}", os.getpid(), 0, True, 0, s, 0, s), s)]
        by_pid = {p.pid: p for p in self.procs.values()}
        out = []
        for rec in self.procs.values():
            if not rec.alive and self._covered_by_ancestor(rec, by_pid):
                continue
            out.append((rec, max(0.0, rec.last - rec.base)))
        return out

    @staticmethod
    def _covered_by_ancestor(rec: _Proc, by_pid: Dict[int, _Proc]) -> bool:
        """True when a tracked ancestor accounts for ``rec``: a live one through its
        ``children_*`` counters, else the topmost gone one through its last sample."""
        parent, hops = by_pid.get(rec.ppid), 0
        while parent is not None and hops < 64:
            if parent.alive:
                return True
            parent, hops = by_pid.get(parent.ppid), hops + 1
        return rec.ppid in by_pid

    def mean_rss_gb(self) -> float:
        return sum(self.rss_samples) / len(self.rss_samples) if self.rss_samples else 0.0


# ------------------------------------------------------------------------ tracker

def _sum_by_stage(records: List[stage_cpu.ProcessCpu]) -> Dict[str, float]:
    """CPU seconds per stage function over all stage records (a breakdown; see core.stage_cpu)."""
    out: Dict[str, float] = {}
    for r in records:
        for name, sec in r.by_stage.items():
            out[name] = out.get(name, 0.0) + sec
    return out


def process_cpu_seconds() -> float:
    """This process's CPU seconds: user + system, own and reaped children's (``getrusage``)."""
    return stage_cpu.process_cpu_seconds()


def process_cpu_report(label: Optional[str] = None) -> dict:
    """Run *inside a worker*: its CPU seconds (own + reaped children) as kwargs for
    ``EnergyTracker.add_process_cpu_seconds``. Host and pid let the driver avoid double counting."""
    host, pid = socket.gethostname(), os.getpid()
    return {"label": label or f"worker {host} pid={pid}", "seconds": process_cpu_seconds(),
            "host": host, "pid": pid}


class EnergyTracker:
    """Measures one run and writes ``run_dir/carbon.json`` on ``stop()``.

    Args:
      run_dir: local path or fsspec URL of the run directory.
      backend: "auto" (codecarbon if installed, else process-time), "codecarbon",
        "eit" or "process-time". An unusable choice logs one warning line and falls back.
      country: ISO-3166 alpha-3 code of the grid (codecarbon's ``country_iso_code``).
      pue: data-centre overhead multiplied into every backend's energy; 1.58 is
        experiment-impact-tracker's (ActorQ's) value.
      worker_pids_fn: returns PIDs of local worker processes (Dask/Beam); called
        every ``sample_interval_s``. Their CPU time, children included, is counted.
      watts_per_thread, ram_watts, intensity_g_per_kwh: override the CPU-time
        model's constants and the grid intensity (None = defaults above).
      sample_interval_s: ledger sampling period; bounds the CPU time lost for
        an untracked-parent process that exits before ``stop()``.
    """

    def __init__(self, run_dir: str, backend: str = "auto", country: str = "USA",
                 pue: float = 1.0, worker_pids_fn: Optional[Callable[[], Iterable[int]]] = None,
                 *, watts_per_thread: float = DEFAULT_WATTS_PER_THREAD,
                 ram_watts: Optional[float] = None, intensity_g_per_kwh: Optional[float] = None,
                 sample_interval_s: float = 1.0):
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
        self._meter = self._ledger = self._thread = None
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
        if self._ledger is not None:
            raise RuntimeError("EnergyTracker.start() called twice")
        self._meter, self.backend = self._select_meter()
        if self._meter is not None:
            try:
                self._meter.start()  # first: codecarbon's one-off hardware probe takes ~1.5 s
            except Exception as e:
                self._fall_back(f"{self.backend} failed to start ({type(e).__name__}: {e})")
        self._start_wall, self._t0 = time.time(), time.perf_counter()
        self.stage_cpu_sink = stage_cpu.sink_url(self.run_dir, stage_cpu.new_session())
        self._ledger = _Ledger(self._fn, self._start_wall)
        self._ledger.sample()
        self._stop_evt = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, name="carbon-ledger", daemon=True)
        self._thread.start()
        return self

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
        self._stop_evt.set()
        self._thread.join()
        self._safe_sample()
        duration = time.perf_counter() - self._t0
        measured = None
        if self._meter is not None:
            try:
                measured = self._meter.stop()
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

    def _safe_sample(self) -> None:
        try:
            self._ledger.sample()
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
                    from core.carbon_eit import EitMeter
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
            return _CodecarbonMeter(self.country), "codecarbon"
        except ImportError:
            why = "codecarbon is not installed (pip install 'databloom[carbon]')"
        except Exception as e:
            why, quiet = f"codecarbon failed to initialise ({type(e).__name__}: {e})", False
        if not quiet:
            log.warning("%s; falling back to the process-time model", why)
        if note:
            self._notes.append(why + "; using process-time")
        return None, "process-time"

    def _entries(self) -> List[Tuple[str, float, str, Optional[int], str, bool]]:
        """(label, CPU s, host, pid, route, in driver tree) of every process seen or reported."""
        me = socket.gethostname()
        out = []
        for rec, sec in self._ledger.counted():
            if rec.pid == os.getpid():
                own = max(0.0, rec.own_last - rec.own_base)
                out.append((rec.label, own, me, rec.pid, "ledger", True))
                out.append((rec.label + " reaped children", max(0.0, sec - own), me, None, "ledger", True))
            else:
                out.append((rec.label, sec, me, rec.pid, "ledger", rec.in_tree))
        for p in self._stage_records:
            out.append((p.label, p.covered_s, p.host, p.pid, "stage record", False))
        for label, (sec, host, pid) in self._reported.items():
            out.append((label, sec, host or me, pid, "report", False))
        return out

    def _cpu_accounts(self, covers: str):
        """(cpu_seconds by label, seconds the CPU-time model charges, all counted seconds, notes, hosts).

        One process counts once, by the first route that saw it: the ledger
        (this host), then a stage record, then a report (same host and pid).
        """
        by_label: Dict[str, float] = {}
        model_s = all_s = 0.0
        me = socket.gethostname()
        notes = []
        seen = {(me, os.getpid())} | {(me, p.pid) for p in self._ledger.procs.values()}
        hosts: Dict[str, Dict[str, Any]] = {}
        for label, sec, host, pid, route, in_tree in self._entries():
            key = label if label not in by_label else f"{label} ({route})"
            by_label[key] = sec
            h = hosts.setdefault(host, {"processes": 0, "cpu_s": 0.0, "routes": {}})
            if route != "ledger" and pid is not None and (host, pid) in seen:
                notes.append(f"{label!r}: pid {pid} already measured on {host}; {route} listed, not added")
                continue
            if pid is not None:
                seen.add((host, pid))
            all_s += sec
            h["processes"] += pid is not None
            h["cpu_s"] += sec
            h["routes"][route] = h["routes"].get(route, 0.0) + sec
            if not (covers == "machine" and host == me) and not (covers == "process-tree" and in_tree):
                model_s += sec
        for (host, _pid) in seen:   # processes whose CPU is inside another's (reaped) or a duplicate
            hosts.setdefault(host, {"processes": 0, "cpu_s": 0.0, "routes": {}})
        for host, h in hosts.items():
            h["processes_seen"] = len({pid for hh, pid in seen if hh == host})
        return by_label, model_s, all_s, notes, hosts

    def _build_report(self, duration: float, measured) -> CarbonReport:
        covers = self._meter.covers if self._meter is not None else "none"
        by_label, model_s, all_s, notes, hosts = self._cpu_accounts(covers)
        ram_w = self._ram_w if self._ram_w is not None else RAM_WATTS_PER_GB * self._ledger.mean_rss_gb()
        model_kwh = process_time_energy_kwh(model_s, 0.0, watts_per_thread=self._w)
        if measured is None:
            detail = (f"process-time model: {model_s:.2f} CPU-s x {self._w:g} W/thread "
                      f"(codecarbon's rule for an unknown CPU) + RAM {ram_w:.3f} W "
                      f"(3 W per 8 GB of mean RSS) x {duration:.2f} s wall; no power counter read")
            parts = {"cpu_time_model": model_kwh,
                     "ram_model": process_time_energy_kwh(0.0, duration, ram_watts=ram_w)}
            meter_intensity = None
        else:
            host_kwh, meter_intensity, detail, parts = measured
            if model_s > 0:
                parts["cpu_time_model"] = model_kwh
                detail += (f"; + {model_s:.2f} CPU-s outside its scope x {self._w:g} W/thread")
        intensity, isrc = ((self._intensity, "set by caller") if self._intensity is not None else
                           (meter_intensity, f"{self.backend} offline data") if meter_intensity else
                           grid_intensity(self.country))
        pue_txt = f"PUE={self.pue:g}" + (" (experiment-impact-tracker/ActorQ accounting)"
                                         if self.pue == EIT_PUE else "")
        source = f"{detail}; {pue_txt}; country={self.country} ({intensity:.1f} gCO2e/kWh, {isrc})"
        breakdown = {k: self.pue * v for k, v in parts.items()}
        energy = sum(breakdown.values())
        return CarbonReport(
            energy_kwh=energy, co2e_kg=co2e_kg(energy, intensity), duration_s=duration,
            source=source, pue=self.pue, cpu_seconds=by_label,
            notes=self._notes + self._ledger.notes + notes, backend=self.backend,
            requested_backend=self.requested_backend, country=self.country,
            intensity_g_per_kwh=float(intensity), breakdown_kwh=breakdown,
            counted_cpu_seconds=all_s,
            process_time_kwh=process_time_energy_kwh(all_s, duration, watts_per_thread=self._w,
                                                     ram_watts=ram_w, pue=self.pue),
            watts_per_thread=self._w, ram_watts=ram_w, host=socket.gethostname(),
            started_at=_dt.datetime.fromtimestamp(self._start_wall, _dt.timezone.utc).isoformat(),
            coverage=self._coverage(covers, hosts))

    def _coverage(self, covers: str, hosts: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
        """What the backend measured itself (``scope``) and, per host, which processes were counted how."""
        scope = {"machine": "every process on this host (whole-machine counters)",
                 "process-tree": "the driver process and all its descendants",
                 "none": "nothing: CPU-time model only"}[covers]
        backend = {"name": self.backend, "scope": scope}
        backend.update(getattr(self._meter, "coverage", None) or {})
        return {"backend": backend, "hosts": hosts, "routes": dict(ROUTES),
                "stage_records": self.stage_cpu_sink,
                "stages_cpu_s": _sum_by_stage(self._stage_records)}
