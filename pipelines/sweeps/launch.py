"""Launching one run of a sweep: its ``pipelines.train`` command, its environment, and the local backend.

A run is always its own process, ``python -m pipelines.train --config C --seed S --set ... --run-dir RUN
--executor local --no-progress`` (or ``--resume RUN`` to continue from its checkpoint): runs share no
state, a crash takes one run down, and TensorFlow, which fixes its thread pools once per process, gets
one intra-op and one inter-op thread in every run (:data:`pipelines.sweeps.spec.THREAD_OVERRIDES`, and
single-threaded BLAS/OpenMP through :data:`THREAD_ENV`): the sweep's parallelism is across runs.

Backends (the local one here, the Dask one in :mod:`pipelines.sweeps.dask_runner`) share one protocol::

    backend.capacity() -> int                 # runs that may run at once
    backend.start(name, args, log_path)       # args: pipelines.train arguments after "-m pipelines.train"
    backend.wait(timeout_s) -> [(name, returncode)]   # runs that ended since the last call
    backend.stop()                            # ask every running run to stop (SIGTERM: checkpoint, exit 130)
    backend.kill()                            # end every running run now (a second Ctrl-C)
    backend.close()

Example::

    backend = LocalBackend(workers=2)
    backend.start("default__s0", run.train_args(run_dir), "sweeps/a/logs/default__s0.log")
    while not (ended := backend.wait(1.0)):
        pass
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

#: single-threaded numeric libraries in every run (TensorFlow's own pools come from the config's threads.*)
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "TF_CPP_MIN_LOG_LEVEL": "2"}


def train_command(args: Sequence[str], program: Optional[Sequence[str]] = None) -> List[str]:
    """The full command line of a run: ``program`` (default: this process's ``python -m pipelines.train``) + args."""
    return [*(program or (sys.executable, "-m", "pipelines.train")), *args]


def run_env(drop: Sequence[str] = ()) -> Dict[str, str]:
    """The environment of a run: this one less ``drop``, with :data:`THREAD_ENV`, and the repository importable."""
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, **THREAD_ENV}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def open_log(log_path: str, args: Sequence[str]):
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    log = open(log_path, "ab")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} python -m pipelines.train {' '.join(args)}\n".encode())
    log.flush()
    return log


class LocalBackend:
    """Up to ``workers`` runs at once as child processes of the sweep, each in a session of its own.

    Its own session keeps a terminal's Ctrl-C (sent to the foreground process group) away from the runs:
    the sweep alone handles it and forwards one SIGTERM to each run, which ``pipelines.train`` turns into a
    checkpoint at its next learner block end and exit status 130 (:mod:`pipelines.run.stop_signal`).
    """

    def __init__(self, workers: int, program: Optional[Sequence[str]] = None):
        self.workers = max(1, int(workers))
        self.program = list(program) if program else None     # tests put a stand-in trainer here
        self._procs: Dict[str, Tuple[subprocess.Popen, object]] = {}

    def capacity(self) -> int:
        return self.workers

    def start(self, name: str, args: Sequence[str], log_path: str) -> None:
        log = open_log(log_path, args)
        proc = subprocess.Popen(train_command(args, self.program), stdout=log, stderr=subprocess.STDOUT, env=run_env(),
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs[name] = (proc, log)

    def wait(self, timeout_s: float) -> List[Tuple[str, int]]:
        deadline = time.monotonic() + timeout_s
        while True:
            ended = [(name, p.returncode) for name, (p, _) in self._procs.items() if p.poll() is not None]
            if ended or not self._procs or time.monotonic() >= deadline:
                for name, _ in ended:
                    self._procs.pop(name)[1].close()
                return ended
            time.sleep(0.05)

    def _signal(self, sig: int) -> None:
        for proc, _ in self._procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def running(self) -> int:
        return len(self._procs)

    def close(self) -> None:
        self.kill()
        for proc, log in self._procs.values():
            proc.wait()
            log.close()
        self._procs.clear()
