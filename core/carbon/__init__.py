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

This package's ``__init__`` is the public surface: it re-exports the names of
the modules it is built from, one concept each::

    EnergyTracker --start--> backend meter (codecarbon | eit | none)
         |                   Ledger thread (psutil samples, this host)
         +----stop---------> stage records + reports --> Attribution --> CarbonReport --> carbon.json

* :mod:`core.carbon.tracker`: ``EnergyTracker``'s lifecycle and the backend choice;
* :mod:`core.carbon.model`: the process-time model and grid intensity table;
* :mod:`core.carbon.report`: ``CarbonReport`` (carbon.json) and ``carbon_ratio``;
* :mod:`core.carbon.ledger`: per-process CPU seconds (psutil) and ``process_cpu_report``;
* :mod:`core.carbon.attribution`: the no-double-count rule and the report's numbers;
* :mod:`core.carbon.codecarbon_meter`, :mod:`core.carbon.eit`: the measuring backends
  (:mod:`core.carbon.eit_compat`: what lets experiment-impact-tracker 0.1.8 import and run here).

Backends (``available_backends()`` lists the usable ones, best first):

* ``codecarbon`` (default; extra ``databloom[carbon]``): codecarbon's
  ``OfflineEmissionsTracker`` in ``tracking_mode="machine"``, offline, no
  files (:mod:`core.carbon.codecarbon_meter`).
* ``eit`` (experiment-impact-tracker 0.1.8, what ActorQ used; extra
  ``databloom[eit]``): used only where RAPL (``RAPL_ROOT/intel-rapl``) or
  ``nvidia-smi`` exists *and* the package imports behind the compatibility
  layer in :mod:`core.carbon.eit_compat` (pandas 3, offline region from ``country``).
  Otherwise one warning line names why and the tracker falls back to
  ``auto``. eit writes pickles, so it logs to a temporary directory that is
  deleted after its totals are read; only JSON lands in the run dir.
* ``process-time`` (no dependency; also the fallback): the CPU-time model of
  :mod:`core.carbon.model`, ``E_kWh = PUE * (sum_p cpu_s_p * W_thread + W_ram * T_wall) / 3.6e6``.

``pue`` multiplies every backend's IT energy the same way (codecarbon is run at
PUE 1 and eit's built-in 1.58 is divided out first). ``pue=1.58`` reproduces
experiment-impact-tracker's (and so ActorQ's) accounting.

``RAPL_ROOT`` and ``_import_codecarbon`` are read from :mod:`core.carbon.tracker`
at call time, so tests that replace them there
(``monkeypatch.setattr(core.carbon.tracker, ...)``) steer backend selection.
"""
from core.carbon.attribution import ROUTES
from core.carbon.eit import EIT_PUE  # experiment-impact-tracker's built-in PUE, used by ActorQ
from core.carbon.ledger import process_cpu_report, process_cpu_seconds
from core.carbon.model import (DEFAULT_WATTS_PER_THREAD, GRID_INTENSITY_G_PER_KWH, RAM_WATTS_PER_GB,
                               WORLD_INTENSITY_G_PER_KWH, co2e_kg, grid_intensity, process_time_energy_kwh)
from core.carbon.report import REPORT_NAME, SCHEMA_VERSION, CarbonReport, carbon_ratio
from core.carbon.tracker import BACKENDS, RAPL_ROOT, EnergyTracker, available_backends

__all__ = [
    "BACKENDS", "DEFAULT_WATTS_PER_THREAD", "EIT_PUE", "GRID_INTENSITY_G_PER_KWH", "RAM_WATTS_PER_GB",
    "RAPL_ROOT", "REPORT_NAME", "ROUTES", "SCHEMA_VERSION", "WORLD_INTENSITY_G_PER_KWH", "CarbonReport",
    "EnergyTracker", "available_backends", "carbon_ratio", "co2e_kg", "grid_intensity", "process_cpu_report",
    "process_cpu_seconds", "process_time_energy_kwh",
]
