"""The record of one run's energy and carbon, ``RUN_DIR/carbon.json``, and the ratio of two runs.

Example::

    report = CarbonReport.load("runs/a-int8-s0")        # local path or fsspec URL
    print(report.co2e_kg, report.source)                # quote the source with the numbers
    carbon_ratio(fp32_report, int8_report)              # 1.9 -> int8 emitted 1.9x less

``EnergyTracker.stop()`` (:mod:`core.carbon`) builds and saves the report;
``schema_version`` guards readers against files from a newer databloom.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, List

from core import urls
from core.carbon.model import DEFAULT_WATTS_PER_THREAD

SCHEMA_VERSION = 1
REPORT_NAME = "carbon.json"


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
