"""The Beam backend of a sweep: one pipeline whose elements are runs, so 100 runs are one job on 100 workers.

The pipeline reads top to bottom::

    beam.Create([(name, args, log_path), ...])
      | "Spread" >> beam.Reshuffle()          # to prevent fusion: each run may go to a worker of its own
      | "TrainRuns" >> beam.Map(train_run)    # python -m pipelines.train ARGS; returns (name, exit status)

The backend takes every run the sweep starts (its capacity is unbounded: Beam, not the sweep, decides
how many run at once; ``--workers`` becomes the DirectRunner's ``direct_num_workers``), launches the
pipeline at the first :meth:`BeamBackend.wait`, and reports every run's exit status when the pipeline
ends: a run's ``status/NAME.json`` says ``running`` from the launch on, and ``summary.json`` in its run
directory shows it finished before that. Nothing is decided here: the sweep's driver
(:mod:`pipelines.sweeps.runner`) records outcomes and resumes, exactly as for the local and Dask backends.

A stop is a flag file the elements watch (:func:`train_run`): once it exists each running run gets SIGTERM
(checkpoint at its next learner block end, exit 130) and runs not yet begun return 130 at once. The flag
lies on this machine, so it reaches the DirectRunner's workers; on Dataflow, cancel the job instead and
``--resume`` the sweep.

Example::

    backend = BeamBackend(workers=2)                      # DirectRunner, 2 worker processes
    backend.start(run.name, run.train_args(run_dir), log_path)
    ended = backend.wait(1.0)                             # [] until the pipeline ends, then every run
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import List, Optional, Sequence, Tuple

from pipelines.sweeps.launch import open_log, run_env, train_command

STOPPED = 130


def train_run(item: Tuple[str, Sequence[str], str], stop_flag: str,
              program: Optional[Sequence[str]] = None) -> Tuple[str, int]:
    """Run one element, ``(name, args, log_path)``: ``python -m pipelines.train ARGS``; returns (name, status)."""
    name, args, log_path = item
    if os.path.exists(stop_flag):
        return name, STOPPED
    with open_log(log_path, args) as log:
        proc = subprocess.Popen(train_command(args, program), stdout=log, stderr=subprocess.STDOUT, env=run_env(),
                                stdin=subprocess.DEVNULL, start_new_session=True)
        last_term = None
        while proc.poll() is None:
            if os.path.exists(stop_flag) and (last_term is None or time.monotonic() - last_term > 2.0):
                proc.send_signal(signal.SIGTERM)
                last_term = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.5)      # returns as soon as the run exits
        return name, proc.returncode


def build_pipeline(pipeline, items: Sequence[Tuple[str, List[str], str]], stop_flag: str,
                   program: Optional[Sequence[str]] = None):
    """Add the sweep's stages to ``pipeline``; returns the PCollection of ``(name, exit status)``."""
    import apache_beam as beam
    return (pipeline
            | "Runs" >> beam.Create([(n, list(a), lp) for n, a, lp in items], reshuffle=False)
            | "Spread" >> beam.Reshuffle()
            | "TrainRuns" >> beam.Map(train_run, stop_flag, list(program) if program else None))


class BeamBackend:
    """Runs the sweep's runs as the elements of one Beam pipeline (DirectRunner unless ``options`` say otherwise)."""

    def __init__(self, workers: int, program: Optional[Sequence[str]] = None, options: Sequence[str] = ()):
        self.workers = max(1, int(workers))
        self.program = list(program) if program else None
        self.options = list(options)
        self._tmp = tempfile.mkdtemp(prefix="databloom-sweep-beam-")
        self.stop_flag = os.path.join(self._tmp, "stop")
        self._items: List[Tuple[str, List[str], str]] = []
        self._thread: Optional[threading.Thread] = None
        self._results: List[Tuple[str, int]] = []
        self._error: Optional[str] = None
        self._pending: List[str] = []

    def capacity(self) -> int:
        return 1 << 30          # Beam decides how many run at once

    def start(self, name: str, args: Sequence[str], log_path: str) -> None:
        if self._thread is not None:
            raise RuntimeError("the Beam sweep's pipeline already runs; a sweep starts every run before it")
        self._items.append((name, list(args), log_path))
        self._pending.append(name)

    def _run(self) -> None:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions
        from pipelines.executors.beam import runner_for
        results: List[Tuple[str, int]] = []
        out_dir = os.path.join(self._tmp, "results")
        os.makedirs(out_dir, exist_ok=True)
        opts = PipelineOptions(["--runner=DirectRunner", f"--direct_num_workers={self.workers}",
                                "--direct_running_mode=multi_processing", *self.options])
        try:
            runner, opts = runner_for(opts)
            with beam.Pipeline(runner=runner, options=opts) as p:
                ended = build_pipeline(p, self._items, self.stop_flag, self.program)
                _ = ended | "Record" >> beam.Map(_write_result, out_dir)
            for fname in os.listdir(out_dir):
                with open(os.path.join(out_dir, fname)) as f:
                    results.append((bytes.fromhex(fname).decode(), int(f.read().strip())))
        except Exception as e:  # noqa: BLE001 - the job failed: every run not reported failed with its line
            self._error = f"the Beam job failed: {type(e).__name__}: {e}".splitlines()[0]
        self._results = results

    def wait(self, timeout_s: float) -> List[Tuple[str, int]]:
        if not self._pending:
            return []
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sweep-beam", daemon=True)
            self._thread.start()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            return []
        done = dict(self._results)
        ended = [(n, done[n]) if n in done else (n, _JobError(self._error or "the Beam job returned no status"))
                 for n in self._pending]
        self._pending = []
        return ended

    def stop(self) -> None:
        open(self.stop_flag, "w").close()

    def kill(self) -> None:
        self.stop()

    def running(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join()
        shutil.rmtree(self._tmp, ignore_errors=True)


def _write_result(item: Tuple[str, int], out_dir: str) -> None:
    """Each run's exit status as a file named by its name (hex): the DirectRunner's workers are processes."""
    name, code = item
    with open(os.path.join(out_dir, name.encode().hex()), "w") as f:
        f.write(f"{int(code)}\n")


class _JobError(int):
    """A run the job reported no status for: exit status 1 with the job's one-line error."""

    def __new__(cls, message: str):
        obj = super().__new__(cls, 1)
        obj.message = message
        return obj
