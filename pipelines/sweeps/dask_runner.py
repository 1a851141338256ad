"""The Dask backend of a sweep: each run is one task, and the task runs the run's ``pipelines.train`` process.

On an embedded ``LocalCluster`` (``n_workers=--workers`` worker threads in the sweep's own process,
``threads_per_worker=1``, so one run per worker at a time: a task only starts a process and waits on
it, so worker processes would add only their start-up, 1.5-6 s, and their nannies' environment) or on an
existing cluster (``--dask-address``; each worker needs DataBloom installed and the sweep directory on a
shared filesystem, since the run writes its directory and log there). The task (:func:`run_in_worker`)
starts the process with the worker's own Python, in a session of its own, waits for it, and returns its
exit status. A stop is a ``distributed.Event`` the tasks watch: once it is set, each task sends its run
SIGTERM (again every 2 s until the run exits, for workers that start their children with SIGTERM
ignored, as :mod:`pipelines.executors.dask`'s do) and returns the run's status (130 after a planned
stop; a run stopped before its handler is installed ends by the signal and is recorded ``stopped`` too).
Tasks have no retries: a run whose worker was lost is recorded as failed with that one line, and
``--resume`` continues it from its checkpoint.

Example::

    backend = DaskBackend(address=None, workers=2)       # an embedded LocalCluster of 2 workers
    backend.start(run.name, run.train_args(run_dir), log_path)
    ended = backend.wait(1.0)                            # [(name, returncode)]
    backend.close()
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

from pipelines.executors.dask_config import QUIET_CLUSTER
from pipelines.sweeps.launch import open_log, run_env, train_command

#: the embedded cluster's settings: its tasks only wait on a run's process, so Dask's dashboard machinery
#: (:data:`~pipelines.executors.dask_config.QUIET_CLUSTER`) and the 100 ms memory monitor only spent the
#: sweep's CPU: 2 idle tasks cost 0.55-0.62 s of CPU per 10 s with Dask's defaults and 0.29-0.37 s without
#: the profiler, monitors, stealing and memory manager (2026-12-06, loaded 2-core EPYC; the 20 ms tick was
#: still on then)
EMBEDDED_CLUSTER_CONFIG = {**QUIET_CLUSTER, "distributed.worker.memory.monitor-interval": "10s"}


def nanny_spawn_variables() -> List[str]:
    """The variables this worker's nanny set for the worker process alone, which its runs must not inherit.

    A Dask nanny puts ``distributed.nanny.pre-spawn-environ`` into ``os.environ`` before it spawns its worker:
    by default ``MALLOC_TRIM_THRESHOLD_=65536``, and OMP/MKL/OpenBLAS at 1 thread (which
    :data:`pipelines.sweeps.launch.THREAD_ENV` sets anyway). Inherited by ``pipelines.train``, that malloc
    threshold makes glibc return freed memory to the kernel and fault it in again: 7x the minor page faults
    (140k -> 975k) and +2.2 s of system time in a 16 s run. A variable whose value differs from the
    configured one was the user's own and stays.
    """
    import dask
    import distributed  # noqa: F401 - its import registers the nanny's defaults in dask.config
    configured = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    return [k for k, v in configured.items() if v is not None and os.environ.get(k) == str(v)]


def run_in_worker(args: Sequence[str], log_path: str, stop_event: str, program: Optional[Sequence[str]] = None) -> int:
    """Run ``python -m pipelines.train ARGS`` here, appending to ``log_path``; SIGTERM it once the stop is set."""
    from distributed import Event
    stop = Event(stop_event)
    with open_log(log_path, args) as log:
        proc = subprocess.Popen(train_command(args, program), stdout=log, stderr=subprocess.STDOUT,
                                env=run_env(drop=nanny_spawn_variables()), stdin=subprocess.DEVNULL,
                                start_new_session=True)     # a terminal's Ctrl-C reaches the sweep, not the run
        last_term = None
        while proc.poll() is None:
            try:
                stopping = last_term is not None or stop.is_set()
            except Exception:  # noqa: BLE001 - scheduler unreachable: keep the run going
                stopping = False
            if stopping and (last_term is None or time.monotonic() - last_term > 2.0):
                proc.send_signal(signal.SIGTERM)
                last_term = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)      # returns as soon as the run exits: no polling delay per run
        return proc.returncode


class DaskBackend:
    """Runs as tasks on an embedded LocalCluster or the cluster at ``address``."""

    def __init__(self, address: Optional[str], workers: int, program: Optional[Sequence[str]] = None):
        from distributed import Client, Event, LocalCluster
        self._cluster = None
        self.program = list(program) if program else None     # tests put a stand-in trainer here
        if address:
            self.client = Client(address, timeout="20s")
        else:
            # workers in this process: a task only starts its run's process and waits on it, so worker
            # processes and their nannies bought nothing and cost 1.5-6 s at start and 0.4-0.9 s at close
            import dask
            with dask.config.set(EMBEDDED_CLUSTER_CONFIG):
                self._cluster = LocalCluster(n_workers=max(1, int(workers)), threads_per_worker=1, processes=False,
                                             dashboard_address=None, silence_logs=logging.ERROR)
            self.client = Client(self._cluster)
        self.client.wait_for_workers(1, timeout=60)
        self._event_name = f"databloom-sweep-stop-{uuid.uuid4().hex}"
        self._stop = Event(self._event_name, client=self.client)
        self._futures: Dict[str, object] = {}

    def capacity(self) -> int:
        """Worker threads of the cluster now (one run per thread)."""
        return max(1, sum(self.client.nthreads().values()))

    def start(self, name: str, args: Sequence[str], log_path: str) -> None:
        self._futures[name] = self.client.submit(run_in_worker, list(args), log_path, self._event_name, self.program,
                                                 key=f"sweep-run-{name}-{uuid.uuid4().hex[:8]}", pure=False,
                                                 retries=0)

    def wait(self, timeout_s: float) -> List[Tuple[str, int]]:
        from distributed import wait as dask_wait
        if not self._futures:
            return []
        try:
            dask_wait(list(self._futures.values()), timeout=timeout_s, return_when="FIRST_COMPLETED")
        except TimeoutError:
            return []
        ended = []
        for name, fut in list(self._futures.items()):
            if fut.done():
                del self._futures[name]
                try:
                    ended.append((name, int(fut.result())))
                except Exception as e:  # noqa: BLE001 - a lost worker or a task error: the run failed
                    ended.append((name, _TaskError(f"{type(e).__name__}: {e}".splitlines()[0])))
        return ended

    def stop(self) -> None:
        self._stop.set()

    def kill(self) -> None:
        self._stop.set()
        for fut in self._futures.values():
            fut.cancel()

    def running(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close()


class _TaskError(int):
    """A task that raised instead of returning a status: exit status 1 that carries its one-line message."""

    def __new__(cls, message: str):
        obj = super().__new__(cls, 1)
        obj.message = message
        return obj
