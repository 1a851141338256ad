"""experiment-impact-tracker (eit) 0.1.8 made importable and offline here: the patches :mod:`core.carbon.eit` needs.

Usage (``core.carbon.eit.EitMeter`` does this)::

    m = install()                     # import eit and patch it, once per process; its modules by short name
    configure("FRA", "/sys/class/powercap")   # the grid and the powercap tree the patches read
    m["compute_tracker"].ImpactTracker(log_dir)

Compatibility layer (``install``): eit 0.1.8 is used as released; each
patch replaces one name eit looks up at call time, once per process, and
none copies its code:

1. ``pandas.io.json.json_normalize``: pandas 2 moved it to
   ``pandas.json_normalize``; eit imports the old name at import time.
2. Region, offline: eit geolocates by IP (``geocoder.ip('me')``) inside
   ``emissions.get_region_metrics.get_current_region_info``. It is replaced
   by the configured ``carbon.country``: region ``{"id": <zone>}`` and eit's
   own zone intensity (``ZONE_INFO``, electricityMap 2019) where eit has
   that zone, else ``core.carbon.model``'s embedded table (said in ``detail``).
   A region given as a dict also keeps eit's realtime California fetch off.
3. RAPL root: eit hard-codes ``/sys/class/powercap/intel-rapl`` in
   ``cpu.rapl._is_rapl_compatible`` and ``RAPLSample.take_sample``. The walk
   (``cpu.rapl._walk_rapl_dir``) is re-rooted under ``core.carbon.tracker.RAPL_ROOT``
   and the compatibility check (module and ``DATA_HEADERS`` entries) looks
   there. On real hardware the root is the default, so nothing changes; in
   tests it points at a fake powercap tree and eit's own sampling, rollover
   and attribution code runs on it.
4. Hosts with only one kind of counter: eit's integrator
   (``utils.gather_additional_info``) indexes both the RAPL and the nvidia
   columns, and ``info["gpu_info"]``, even when it logged one kind; the
   missing ones are supplied as zeros / ``[]``.
5. nvidia-smi hosts: ``Element.getiterator`` (gone in Python 3.9) and
   ``read_csv(delim_whitespace=True)`` / ``groupby().mean()`` over text
   columns (gone in pandas 3) are provided through an XML element factory
   and a pandas proxy whose ``read_csv`` keeps numeric columns only (what
   pandas < 2 did silently); newer drivers' power tags are mapped to the
   names eit reads.
6. Its exit hook is captured so ``EitMeter.stop()`` can unregister it (it would
   otherwise re-open the deleted log dir at interpreter exit), its
   per-sample WARNING chatter is silenced, and its import-time progress
   prints are swallowed.

eit's monitor is a ``multiprocessing`` child started by fork; the patches
above reach it because it inherits this process's modules (a spawn/forkserver
start method would re-import eit unpatched: ``core.carbon.eit.unavailable_reason``
refuses it).
"""
from __future__ import annotations

import atexit
import contextlib
import io
import os
from typing import Dict, Tuple

DEFAULT_RAPL_ROOT = "/sys/class/powercap"
#: eit 0.1.8's hard-coded RAPL tree.
_EIT_RAPL_DIR = DEFAULT_RAPL_ROOT + "/intel-rapl"
#: Columns eit's integrator indexes whether or not that device was sampled (0 = not measured).
_MEASURED_COLUMNS = ("rapl_estimated_attributable_power_draw", "nvidia_estimated_attributable_power_draw",
                     "average_gpu_estimated_utilization_absolute")
#: ISO-3166 alpha-3 -> alpha-2 for core.carbon.model's embedded countries (eit's zones are alpha-2 based).
ALPHA2 = {"USA": "US", "CAN": "CA", "MEX": "MX", "BRA": "BR", "GBR": "GB", "IRL": "IE", "FRA": "FR",
          "DEU": "DE", "NLD": "NL", "BEL": "BE", "ESP": "ES", "ITA": "IT", "CHE": "CH", "SWE": "SE",
          "NOR": "NO", "FIN": "FI", "POL": "PL", "CHN": "CN", "IND": "IN", "JPN": "JP", "KOR": "KR",
          "TWN": "TW", "SGP": "SG", "AUS": "AU", "ZAF": "ZA", "ISR": "IL"}


class _State:
    """What the patched names read: set by ``configure`` (one eit configuration per process)."""
    rapl_root = DEFAULT_RAPL_ROOT
    region: Dict = {}
    zone_info: Dict = {}
    exit_hooks: list = []


_installed: Dict[str, object] = {}


# ------------------------------------------------------------------ compat layer

def _reroot(path: str) -> str:
    if path == DEFAULT_RAPL_ROOT or path.startswith(DEFAULT_RAPL_ROOT + "/"):
        return _State.rapl_root + path[len(DEFAULT_RAPL_ROOT):]
    return path


def _is_rapl_compatible(*args, **kwargs) -> bool:
    return os.path.exists(_reroot(_EIT_RAPL_DIR))


def _region_info(*args, **kwargs):
    return _State.region, _State.zone_info


class _AtexitRecorder:
    """Stands in for the ``atexit`` module inside eit's compute_tracker: registers for real, remembers."""

    @staticmethod
    def register(fn, *args, **kwargs):
        _State.exit_hooks.append(fn)
        return atexit.register(fn, *args, **kwargs)


def _xml_fromstring(text):
    """``nvidia-smi -q -x`` parsed as eit 0.1.8 expects it.

    Elements get ``getiterator`` back (removed in Python 3.9). Newer drivers
    name the block ``gpu_power_readings`` and may report ``instant_power_draw``
    / ``average_power_draw`` instead of ``power_draw``; eit reads
    ``power_readings/power_draw``, so those are mapped (not checked against a
    real driver in this project yet: no GPU on the CI machine).
    """
    import xml.etree.ElementTree as ET

    class _Element(ET.Element):
        getiterator = ET.Element.iter

    root = ET.fromstring(text, parser=ET.XMLParser(target=ET.TreeBuilder(element_factory=_Element)))
    for gpu in root.iter("gpu"):
        readings = gpu.find("power_readings")
        if readings is None and gpu.find("gpu_power_readings") is not None:
            readings = gpu.find("gpu_power_readings")
            readings.tag = "power_readings"
        if readings is not None and readings.find("power_draw") is None:
            for alt in ("instant_power_draw", "average_power_draw"):
                if readings.find(alt) is not None:
                    draw = ET.SubElement(readings, "power_draw")
                    draw.text = readings.find(alt).text
                    break
    return root


class _PandasCompat:
    """pandas for eit's nvidia module: ``read_csv`` with pandas < 2 semantics for what eit passes."""

    def __getattr__(self, name):
        import pandas
        return getattr(pandas, name)

    @staticmethod
    def read_csv(*args, delim_whitespace=False, **kwargs):
        import pandas
        if delim_whitespace:
            kwargs["sep"] = r"\s+"
        df = pandas.read_csv(*args, **kwargs)
        # eit then takes groupby(...).mean(); pandas < 2 dropped text columns there silently.
        return df.select_dtypes(include="number")


def _with_measured_columns(load):
    def load_data_into_frame(*args, **kwargs):
        df, rows = load(*args, **kwargs)
        for col in _MEASURED_COLUMNS:
            if col not in df:
                df[col] = 0.0
        for row in rows:   # logged by its RAPL reader only; its cpu-hours sum indexes every row
            row.setdefault("cpu_time_seconds", {})
        return df, rows
    return load_data_into_frame


def _import_eit():
    """Import eit's modules behind the pandas shim, with its import-time prints swallowed."""
    import pandas
    import pandas.io.json as pj
    if not hasattr(pj, "json_normalize"):
        pj.json_normalize = pandas.json_normalize
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from experiment_impact_tracker import compute_tracker, data_info_and_router, utils
        from experiment_impact_tracker.cpu import rapl
        from experiment_impact_tracker.emissions import constants, get_region_metrics
        from experiment_impact_tracker.gpu import nvidia
    return dict(compute_tracker=compute_tracker, router=data_info_and_router, utils=utils, rapl=rapl,
                constants=constants, region=get_region_metrics, nvidia=nvidia)


def install() -> Dict[str, object]:
    """Import eit and patch it for this process (idempotent); its modules by short name.

    Raises whatever eit's import raises.
    """
    if not _installed:
        m = _import_eit()
        rapl, router = m["rapl"], m["router"]
        original_walk, original_check = rapl._walk_rapl_dir, rapl._is_rapl_compatible
        rapl._walk_rapl_dir = lambda path: original_walk(_reroot(path))
        rapl._is_rapl_compatible = _is_rapl_compatible
        for header in router.DATA_HEADERS + router.INITIAL_INFO:
            header["compatability"] = [_is_rapl_compatible if f is original_check else f
                                       for f in header["compatability"]]
        m["region"].get_current_region_info = _region_info
        m["compute_tracker"].atexit = _AtexitRecorder
        m["utils"].load_data_into_frame = _with_measured_columns(m["utils"].load_data_into_frame)
        m["nvidia"].fromstring = _xml_fromstring
        m["nvidia"].pd = _PandasCompat()
        _installed.update(m)
    return _installed


def configure(country: str, rapl_root: str = DEFAULT_RAPL_ROOT) -> None:
    """Point the patched eit at ``country``'s grid and the powercap tree under ``rapl_root``."""
    _State.rapl_root = rapl_root
    _State.region, _State.zone_info = region_for(country, install()["constants"].ZONE_INFO)


def region_for(country: str, zone_info: Dict) -> Tuple[Dict, Dict]:
    """(eit region, zone info with ``carbonIntensity`` g/kWh) for an alpha-3 country code."""
    zone = ALPHA2.get(country, country)
    if zone in zone_info:
        return ({"id": zone, "source": f"carbon.country={country}"},
                dict(zone_info[zone], databloom_source=f"eit ZONE_INFO[{zone!r}]"))
    from core.carbon.model import grid_intensity
    g, src = grid_intensity(country)
    return ({"id": zone, "source": f"carbon.country={country}"},
            {"carbonIntensity": g, "databloom_source": f"eit has no zone {zone!r}: {src}"})
