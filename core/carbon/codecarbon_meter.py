"""codecarbon's offline tracker as a ``core.carbon`` backend (``backend="codecarbon"``, the default).

``OfflineEmissionsTracker`` in ``tracking_mode="machine"`` (extra
``databloom[carbon]``). Without RAPL it estimates CPU power from
whole-machine load (unknown CPU: TDP = 4 W per thread, power = TDP x (0.1 +
0.9 load^3)) plus a fixed RAM estimate (5 W per assumed DIMM); grid
intensity from its offline per-country data. Nothing goes to the network and
its CSV output is off: carbon.json is the record. It runs at PUE 1;
``core.carbon`` applies the run's PUE. Its CPU name comes from
``/proc/cpuinfo`` where Linux has one (:func:`prime_cpu_model`), not from
py-cpuinfo's subprocess.

Usage (``core.carbon.EnergyTracker`` does this)::

    meter = CodecarbonMeter("FRA", import_codecarbon())   # ImportError without codecarbon
    meter.start()
    ...
    it_kwh, intensity, detail, parts = meter.stop()
"""
from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple


def proc_cpu_model(path: str = "/proc/cpuinfo") -> Optional[str]:
    """The CPU's brand string from Linux's ``/proc/cpuinfo`` ("model name": the CPUID brand string that
    py-cpuinfo reads too), or None where there is none (other OSes, most ARM kernels)."""
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return None


def prime_cpu_model(model: Optional[str]) -> bool:
    """Fill codecarbon's cached ``detect_cpu_model()`` with ``model``; True if it took.

    codecarbon's hardware probe asks py-cpuinfo for the CPU's name, and py-cpuinfo runs a Python
    subprocess for it (~0.4 s of CPU on another core, ~1 s wall, while a run starts up). The answer is
    cached per process (``functools.lru_cache``), so it is asked once here with ``cpuinfo.get_cpu_info``
    answering ``model``, then restored. Any surprise (another codecarbon layout): nothing is changed
    and codecarbon probes as before.
    """
    if not model:
        return False
    try:
        import cpuinfo
        from codecarbon.core import util
        if util.detect_cpu_model.cache_info().currsize:
            return False
        real = cpuinfo.get_cpu_info
        cpuinfo.get_cpu_info = lambda: {"brand_raw": model}
        try:
            return util.detect_cpu_model() == model
        finally:
            cpuinfo.get_cpu_info = real
    except Exception:  # noqa: BLE001 (an optimisation only)
        return False


def import_codecarbon():
    """codecarbon module, or ImportError. ``core.carbon.tracker`` calls it as ``_import_codecarbon``, which tests replace."""
    import codecarbon  # noqa: PLC0415 (optional dependency)
    return codecarbon


class CodecarbonMeter:
    """codecarbon OfflineEmissionsTracker, machine mode, PUE 1, no files written.

    ``cc`` is the codecarbon module (``import_codecarbon()``); the caller
    imports it so that a missing package surfaces as ImportError there.
    """
    covers = "machine"

    def __init__(self, country: str, cc):
        # log_level="error" sets codecarbon's logger after its first INFO line; set it
        # first too. Its per-interval chatter would drown the training progress, and
        # what it found (no RAPL, unknown CPU -> 4 W/thread) goes into `source`.
        logging.getLogger("codecarbon").setLevel(logging.ERROR)
        prime_cpu_model(proc_cpu_model())   # its probe then runs no py-cpuinfo subprocess
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
