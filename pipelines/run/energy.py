"""Energy and carbon per run: start a :class:`core.carbon.EnergyTracker` at setup, stop it at the end.

Used by the training driver (and usable by any launcher)::

    tracker = start_run_tracker(cfg, run_dir, executor)      # None when carbon.backend == "off"
    ... train, final evaluation ...
    summary.update(stop_run_tracker(tracker))                 # energy_kwh, co2e_kg, energy_source, ...

Attribution (see core.carbon for the rules), by route:

* ledger: the tracker samples the driver process (learner, local executor's
  actors) and all its descendants, which includes a Dask ``LocalCluster``'s
  and the Beam DirectRunner's worker processes, plus the PIDs the executor
  reports through ``worker_pids()`` (workers on this host started elsewhere,
  e.g. ``dask worker`` processes);
* stage records: every stage an executor with a ``task_wrapper`` hook (Dask)
  runs, and every Beam round stage (``stage_cpu_sink``, passed in the round
  plan), records its process's CPU seconds under ``RUN_DIR/carbon/<session>/``
  (:mod:`core.stage_cpu`), so workers on other hosts and Dataflow workers
  are counted too.

A process seen by two routes (same host and PID) is counted once, by the
ledger. ``carbon.json``'s ``coverage`` lists per host the processes, CPU
seconds and routes, and ``stages_cpu_s`` the CPU per stage function. The backend is ``cfg.carbon.backend`` (``auto`` = codecarbon offline
when installed, else the process-time model), at ``cfg.carbon.pue`` and the
grid intensity of ``cfg.carbon.country``. The report lands in
``RUN_DIR/carbon.json``; ``energy_source`` names how it was measured.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Dict, Optional

from core import stage_cpu

log = logging.getLogger(__name__)


def start_run_tracker(cfg, run_dir: str, executor) -> Optional[Any]:
    """A started EnergyTracker for this run, or None if ``carbon.backend`` is ``off``."""
    if cfg.carbon.backend == "off":
        return None
    from core.carbon import EnergyTracker
    pids = getattr(executor, "worker_pids", None)
    tracker = EnergyTracker(run_dir, backend=cfg.carbon.backend, country=cfg.carbon.country,
                            pue=cfg.carbon.pue, worker_pids_fn=pids).start()
    if hasattr(executor, "task_wrapper"):
        executor.task_wrapper = functools.partial(stage_cpu.counted, sink=tracker.stage_cpu_sink)
    return tracker


def stage_cpu_sink(tracker) -> str:
    """Where stages of this run record their CPU (``""`` when tracking is off): for plans sent to workers."""
    return tracker.stage_cpu_sink if tracker is not None else ""


#: Summary keys every run reports (values None when tracking is off or failed).
ENERGY_KEYS = ("energy_kwh", "co2e_kg", "energy_source", "carbon_backend", "carbon_pue", "energy_process_time_kwh")


def stop_run_tracker(tracker) -> Dict[str, Any]:
    """Stop ``tracker`` (writes carbon.json) and return the summary fields (all None if tracking is off)."""
    if tracker is None:
        return {**dict.fromkeys(ENERGY_KEYS), "energy_source": "off (carbon.backend: off)"}
    try:
        report = tracker.stop()
    except Exception as e:  # accounting must never fail a finished run
        log.warning("energy tracking failed at stop: %s: %s", type(e).__name__, e)
        return {**dict.fromkeys(ENERGY_KEYS), "energy_source": f"failed: {type(e).__name__}: {e}"}
    return {"energy_kwh": report.energy_kwh, "co2e_kg": report.co2e_kg, "energy_source": report.source,
            "carbon_backend": report.backend, "carbon_pue": report.pue,
            "energy_process_time_kwh": report.process_time_kwh}
