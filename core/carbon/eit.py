"""experiment-impact-tracker (eit) 0.1.8, ActorQ's carbon tracker, as a ``core.carbon`` backend.

Usage (``core.carbon.EnergyTracker(backend="eit")`` does this)::

    why = unavailable_reason("/sys/class/powercap")   # None when eit can measure here
    meter = EitMeter(country="FRA")                     # imports eit behind the compat layer
    meter.start()
    ...                                                  # the run
    kwh, g_per_kwh, detail, parts = meter.stop()         # IT energy (eit's PUE divided out)
    meter.coverage                                       # what eit saw: samples, host RAPL kWh, share

The compatibility layer that lets eit 0.1.8 import and run offline here
(pandas 3, Python 3.9+, region from ``country``, a movable RAPL root, its exit
hook) is :mod:`core.carbon.eit_compat`.

What eit measures (0.1.8, ``cpu/intel.py`` and ``utils.py``): every sample
``i`` reads the RAPL counters twice, 2 s apart, and the CPU times of the
driver and all its descendants in between:

    P_i = sum_packages dE/dt                         (rollover: dE += max_energy_range_uj)
    s_i = sum_p (dcpu_p/dt) / (dcpu_system/dt)       (the process tree's CPU share)
    A_i = P_core*s_i + P_dram*m_i + (P_pkg - P_core - P_dram)*s_i   (m_i: memory share)
    E   = PUE_eit * sum_i A_i * dt_i                 (dt_i: time since the previous sample
                                                      or the start; the last A holds to the end)

``stop()`` returns ``E / PUE_eit`` (``core.carbon`` applies its own PUE).
``coverage`` adds ``host_rapl_kwh = sum_i P_i * dt_i`` over the same
intervals (the machine, not the process tree) read from eit's JSON-lines
samples, so a reader can see the attributed share.

eit's monitor is a ``multiprocessing`` child started by fork; the patches
reach it because it inherits this process's modules. A spawn/forkserver
start method would re-import eit unpatched, so ``unavailable_reason`` refuses it.
eit writes pickles (``info.pkl``): its log dir is a private temp dir, deleted
at ``stop()``; only JSON reaches the run dir.
"""
from __future__ import annotations

import atexit
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from typing import Dict, Optional, Tuple

from core.carbon.eit_compat import DEFAULT_RAPL_ROOT, _State, configure, install

#: eit's built-in PUE (``emissions/constants.py``), used by ActorQ.
EIT_PUE = 1.58
_LOGGER_NAME = "experiment_impact_tracker.compute_tracker.ImpactTracker"
#: eit stops when its monitor reads "Stop" between samples; one sample takes ~3.5 s.
_STOP_TIMEOUT_S = 15.0
#: eit logs nothing until its first sample completes (2 s RAPL window + 0.5 s disk probe).
_FIRST_SAMPLE_TIMEOUT_S = 15.0


def unavailable_reason(rapl_root: str = DEFAULT_RAPL_ROOT) -> Optional[str]:
    """None when eit can measure here, else why not (one line)."""
    rapl_dir = os.path.join(rapl_root, "intel-rapl")
    if not os.path.isdir(rapl_dir) and shutil.which("nvidia-smi") is None:
        return f"no RAPL under {rapl_root} and no nvidia-smi, so it would record no energy"
    # allow_none: asking must not fix the start method for the rest of the process; unset
    # means the platform default, which get_all_start_methods lists first.
    method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    if method != "fork":
        return (f"its monitor needs the fork start method (this process uses {method!r}), "
                f"or it would run unpatched")
    try:
        install()
    except Exception as e:  # broken installs raise more than ImportError
        first = str(e).splitlines()[0] if str(e) else ""
        return f"it does not import ({type(e).__name__}: {first})"
    return None


# ------------------------------------------------------------------------ meter

class EitMeter:
    """One eit ``ImpactTracker`` in a private temp dir; ``stop()`` returns its integrated energy."""
    covers = "process-tree"

    def __init__(self, country: str = "USA", rapl_root: str = DEFAULT_RAPL_ROOT):
        m = install()
        configure(country, rapl_root)
        import experiment_impact_tracker as eit
        self.version = eit.__version__
        self._m, self.coverage = m, {}
        self._logger = logging.getLogger(_LOGGER_NAME)
        self._handlers_before = list(self._logger.handlers)
        self._logger.setLevel(logging.ERROR)  # it warns once per data point per sample
        self._dir = tempfile.mkdtemp(prefix="databloom-eit-")
        self._hooks_before = len(_State.exit_hooks)
        try:
            self._t = m["compute_tracker"].ImpactTracker(self._dir)
        except BaseException:
            self._cleanup()
            raise

    def start(self) -> None:
        try:
            self._t.launch_impact_monitor()
        except BaseException:
            self._cleanup()
            raise

    def _logged_any(self) -> bool:
        try:   # size, not content: the monitor may be half-way through writing a line
            return os.path.getsize(self._data_path()) > 0
        except OSError:
            return False

    def _data_path(self) -> str:
        return os.path.join(self._dir, self._m["utils"].DATAPATH)

    def _samples(self):
        try:
            with open(self._data_path()) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def _stop_monitor(self) -> None:
        deadline = time.monotonic() + _FIRST_SAMPLE_TIMEOUT_S
        while not self._logged_any() and self._t.p.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self._t.queue.put("Stop")
        self._t.p.join(timeout=_STOP_TIMEOUT_S)
        if self._t.p.is_alive():
            self._t.p.terminate()
            self._t.p.join()
        if self._t.p.exitcode not in (0, None):
            raise RuntimeError(f"eit's monitor exited with status {self._t.p.exitcode}")

    def stop(self) -> Tuple[float, Optional[float], str, Dict[str, float]]:
        """(IT kWh, intensity g/kWh, source detail, breakdown kWh); see the module docstring."""
        try:
            self._stop_monitor()
            samples = self._samples()
            if not samples:
                raise RuntimeError("eit logged no sample")
            utils = self._m["utils"]
            utils.log_final_info(self._dir)
            info = utils.load_initial_info(self._dir)  # eit's own pickle in our temp dir
            info.setdefault("gpu_info", [])
            totals = utils.gather_additional_info(info, self._dir)
            self.coverage = _coverage(samples, info, totals)
        finally:
            self._cleanup()
        energy = float(totals["total_power"]) / EIT_PUE
        parts = {"tree_cpu_rapl": float(totals["kw_hr_cpu"]), "tree_gpu_nvidia": float(totals["kw_hr_gpu"])}
        energy, parts = _at_most_host(energy, parts, self.coverage)
        intensity = float(info["region_carbon_intensity_estimate"]["carbonIntensity"])
        zone_src = info["region_carbon_intensity_estimate"].get("databloom_source", "eit zone data")
        detail = (f"experiment-impact-tracker {self.version} ({self.coverage['measured_by']} x the "
                  f"process tree's share, {len(samples)} samples; region {info['region']['id']}, "
                  f"{zone_src})")
        return energy, intensity, detail, parts

    def _cleanup(self) -> None:
        for fn in _State.exit_hooks[self._hooks_before:]:
            atexit.unregister(fn)
        del _State.exit_hooks[self._hooks_before:]
        for h in self._logger.handlers[:]:
            if h not in self._handlers_before:
                self._logger.removeHandler(h)
                h.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _at_most_host(energy: float, parts: Dict[str, float], coverage: Dict[str, object]):
    """The process tree's energy, capped at the host's over the same intervals.

    eit's share ``s_i`` divides the tree's CPU-time rate by the system's, sampled
    a moment apart, so under load it can exceed 1 by a little (seen: +0.002% and
    +0.7% on the shared 2-core CI machine). A process tree cannot draw more than
    the machine, so the run's energy is ``min(tree, host)``, the breakdown is
    scaled to match, and ``coverage["capped_at_host"]`` says when that happened.
    """
    host = float(coverage["host_rapl_kwh"]) + float(coverage["host_nvidia_kwh"])
    coverage["capped_at_host"] = bool(0 < host < energy)
    if not coverage["capped_at_host"]:
        return energy, parts
    scale = host / energy
    capped = {k: v * scale for k, v in parts.items()}
    # The largest part takes the rounding remainder, so the parts sum to the host's energy exactly.
    top = max(capped, key=capped.get)
    capped[top] = host - sum(v for k, v in capped.items() if k != top)
    return host, capped


def _coverage(samples, info, totals) -> Dict[str, object]:
    """What eit saw, for carbon.json: sample count, intervals, host-level RAPL energy, process ids."""
    start = info["experiment_start"].timestamp()
    end = info["experiment_end"].timestamp()
    stamps = [s["timestamp"] for s in samples]
    # eit's rule: sample i's power holds from the previous sample (or the start); the last to the end.
    dts = [stamps[0] - start] + [b - a for a, b in zip(stamps, stamps[1:])]
    dts[-1] += end - stamps[-1]
    host_w = [float(s.get("rapl_power_draw_absolute", 0.0)) for s in samples]
    gpu_w = [float(s.get("nvidia_draw_absolute", 0.0)) for s in samples]
    pids = sorted({int(p) for s in samples for p in s.get("process_ids", [])})
    measured = [n for n, w in (("RAPL", host_w), ("nvidia-smi", gpu_w)) if any(x > 0 for x in w)]
    return {"measured_by": " + ".join(measured) or "no power counter",
            "samples": len(samples), "interval_s": end - start,
            "host_rapl_kwh": sum(w * dt for w, dt in zip(host_w, dts)) / 3.6e6,
            "host_nvidia_kwh": sum(w * dt for w, dt in zip(gpu_w, dts)) / 3.6e6,
            "tree_kwh": float(totals["total_power"]) / EIT_PUE, "process_ids": pids}
