"""Attribution of a run's CPU seconds: the no-double-count rule, and carbon.json built from it.

:class:`Attribution` is mixed into :class:`core.carbon.EnergyTracker`; it
holds no state of its own and reads the tracker's (``_ledger``,
``_stage_records``, ``_reported``, ``_meter``, ``backend``, ``pue``, ...)
at ``stop()``::

    report = tracker._build_report(duration_s, meter_result)   # -> CarbonReport

Routes. The ledger (:mod:`core.carbon.ledger`) only sees this host. Two more
routes reach every other process that ran a stage:

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

The backend measures one part of the run; the CPU-time model
(:mod:`core.carbon.model`) adds the rest:

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

import datetime as _dt
import os
import socket
from typing import Any, Dict, List, Optional, Tuple

from core import stage_cpu
from core.carbon.eit import EIT_PUE  # experiment-impact-tracker's built-in PUE, used by ActorQ
from core.carbon.model import RAM_WATTS_PER_GB, co2e_kg, grid_intensity, process_time_energy_kwh
from core.carbon.report import CarbonReport

#: How a process's CPU seconds reached the report (carbon.json ``coverage.routes``).
ROUTES = {
    "ledger": "psutil samples on the driver's host every sample_interval_s: the driver, its "
              "descendants (reaped ones through children_* times) and worker_pids_fn's processes",
    "stage record": "each stage's process CPU (getrusage, own + reaped children), union of stage spans "
                    "per process, written by core.stage_cpu.CountStageCpu under RUN_DIR/carbon/<session>/",
    "report": "add_process_cpu_seconds (e.g. process_cpu_report run inside a worker)",
}


def _sum_by_stage(records: List[stage_cpu.ProcessCpu]) -> Dict[str, float]:
    """CPU seconds per stage function over all stage records (a breakdown; see core.stage_cpu)."""
    out: Dict[str, float] = {}
    for r in records:
        for name, sec in r.by_stage.items():
            out[name] = out.get(name, 0.0) + sec
    return out


class Attribution:
    """The accounting half of ``EnergyTracker``: which CPU seconds count, and the report (see module docstring)."""

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
