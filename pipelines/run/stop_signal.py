"""SIGTERM as a planned stop: the run checkpoints at its next learner block end, then exits as Ctrl-C does.

Batch schedulers (Slurm, Kubernetes, spot and preemptible VMs) send SIGTERM
and kill the job a grace period later. Python's default for SIGTERM ends the
process at once, which loses every learner step since the last periodic
checkpoint (hours, for a long pixel run). While :func:`stop_on_sigterm` is
active (the driver's loop: local and Dask executors, local and central
inference), SIGTERM only sets the request; the loop sees it once no learner
block is in flight, writes a checkpoint there (a block end, as the periodic
ones) and stops with the one-line resume message (exit 130). ``--resume``
then continues bit-identically. The embedded Dask cluster's workers ignore
SIGTERM (:mod:`pipelines.executors.dask`), so one sent to the whole process
group, as Slurm's ``scancel`` does, is the same planned stop. Beam runs are
stopped between rounds by their runner and resume from their round records
instead.

Example::

    with stop_on_sigterm() as request:
        while working:
            ...
            if request:               # truthy once SIGTERM arrived
                checkpoint_and_stop(request.signal_name)
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator, Optional


class StopRequest:
    """Set by the signal handler; truthy once a stop was asked for."""

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None

    def __bool__(self) -> bool:
        return self.signal_name is not None


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[StopRequest]:
    """SIGTERM sets the yielded request instead of ending the process (main thread only: signal handlers
    can be installed nowhere else, so elsewhere the request is never set)."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame) -> None:
        request.signal_name = signal.Signals(signum).name

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield request
    finally:
        signal.signal(signal.SIGTERM, previous)
