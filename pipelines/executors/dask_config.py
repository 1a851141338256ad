"""Dask settings for DataBloom's clusters: few, long tasks, and no dashboard anyone reads.

Dask's defaults serve an interactive cluster: every scheduler, worker and client wakes 50 times a
second for its event-loop health tick, every worker samples its threads' stacks every 10 ms for the
dashboard's profile and polls the system (and the GIL) every 0.5 s, the scheduler steals tasks between
workers and its active memory manager moves replicas. A training run's tasks are pinned to their
actor's worker (a stolen rollout would leave its warm env and interpreter), and nobody reads the
profile, so these only spend the cores the run needs. Measured idle (a ``dask scheduler``, one
``dask worker``, a client, 10 s, 2026-12-06, 2-core Intel Xeon, loaded ~3 by other jobs): scheduler 15
-> 2 ms of CPU per second, worker 23 -> 4 ms/s with :data:`QUIET_CLUSTER` (of that, the tick alone took
the scheduler 15 -> 5 ms/s). At the driver's low throughputs these time-proportional costs are most of
the central cost per env step (``benchmarks/studies/cluster_scale.py``).

Apply it in-process with ``dask.config.set(QUIET_CLUSTER)`` (an embedded ``LocalCluster`` and the
client), and to processes started apart (``dask scheduler``, ``dask worker``) with the environment
variables :func:`env_vars` gives::

    env = {**os.environ, **env_vars(QUIET_CLUSTER)}
    subprocess.Popen(["dask", "worker", address], env=env)
"""
from __future__ import annotations

from typing import Any, Dict

QUIET_CLUSTER: Dict[str, Any] = {
    "distributed.admin.tick.interval": "1s",              # event-loop health tick (default 20 ms)
    "distributed.worker.profile.enabled": False,          # stack samples every 10 ms, for a dashboard
    "distributed.admin.system-monitor.interval": "10s",   # CPU/memory/network polls (default 0.5 s)
    "distributed.admin.system-monitor.gil.enabled": False,
    "distributed.scheduler.work-stealing": False,         # tasks stay on their actor's worker
    "distributed.scheduler.active-memory-manager.start": False,
}


def env_vars(config: Dict[str, Any]) -> Dict[str, str]:
    """``config`` as Dask's ``DASK_*`` environment variables (``a.b-c`` -> ``DASK_A__B_C``), which a Dask
    process started with them reads back into the same settings (``dask.config.collect_env``)."""
    return {"DASK_" + "__".join(part.replace("-", "_").upper() for part in key.split(".")): str(value)
            for key, value in config.items()}
