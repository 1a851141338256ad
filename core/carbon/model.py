"""The process-time energy model and the grid carbon-intensity table (no dependencies).

This is the ``process-time`` backend of :mod:`core.carbon` (and its fallback),
and the part every other backend uses for CPU seconds outside its scope::

    E_kWh = PUE * (sum_p cpu_s_p * W_thread + W_ram * T_wall) / 3.6e6
    CO2e_kg = E_kWh * I_country / 1000

with ``W_thread`` = 4 W (codecarbon's rule for a CPU missing from its TDP
table: 4 W per hardware thread, i.e. 4 J per busy CPU-second; this is also
exactly what codecarbon's own ``process`` mode charges per CPU-second),
``W_ram`` = 3 W per 8 GB of the run's mean resident memory (codecarbon's
pre-v3 rule, after crucial.com), and ``I_country`` from
``GRID_INTENSITY_G_PER_KWH`` below.

Example::

    kwh = process_time_energy_kwh(3600.0, 0.0)        # one busy CPU-hour at 4 W: 0.004 kWh
    g, source = grid_intensity("FRA")                  # 56.039 gCO2e/kWh, "codecarbon 3.3.2 ..."
    co2e_kg(kwh, g)                                    # 0.000224 kg
"""
from __future__ import annotations

from typing import Dict, Tuple

#: codecarbon's power for a hardware thread of a CPU missing from its TDP table.
DEFAULT_WATTS_PER_THREAD = 4.0
#: codecarbon's pre-v3 RAM rule: 3 W per 8 GB.
RAM_WATTS_PER_GB = 3.0 / 8.0

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
