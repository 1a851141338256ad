"""The sweep's driver: decide what each run needs, keep the backend full, record every outcome, stop cleanly.

For each run, at launch (a new sweep and ``--resume`` alike):

* ``summary.json`` present -> finished: skipped, recorded ``done``;
* a ``config.json`` and a complete checkpoint -> continued with ``pipelines.train --resume RUN``;
* otherwise (it died before its first checkpoint, or never started) -> its own directory
  ``SWEEP_DIR/runs/<name>`` (which the sweep created) is deleted and the run starts from scratch.

A run whose ``summary.json`` is whole is ``done``, whatever its exit status (it is the run's last write). One that exits otherwise is ``failed`` with its
one-line error (:func:`pipelines.sweeps.record.error_line`), and the others go on; ``--resume`` tries
failed runs again. SIGTERM or Ctrl-C stops the sweep: nothing new starts, every running run gets
SIGTERM (it checkpoints at its next learner block end and exits 130) and is recorded ``stopped``; a
second signal kills them. Nothing is recorded ``done`` without its ``summary.json``.

Example::

    result = run_sweep(SweepDir("sweeps/a"), runs, LocalBackend(2), progress=True)
    result["done"], result["failed"], result["stopped"]      # run names
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import deque
from typing import Dict, Iterator, List, Optional, Sequence

from pipelines.sweeps.record import Status, SweepDir, error_line, has_checkpoint
from pipelines.sweeps.spec import RunSpec


class _Stop:
    """Signals seen by the sweep: the first asks for a planned stop, the second for an immediate one."""

    def __init__(self) -> None:
        self.count = 0
        self.signal_name: Optional[str] = None

    def __call__(self, signum, frame) -> None:
        self.count += 1
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def _catch_stop_signals() -> Iterator[_Stop]:
    stop = _Stop()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def launch_args(sweep: SweepDir, run: RunSpec, status: Status) -> Optional[List[str]]:
    """``pipelines.train`` arguments for the run's next attempt, or None if it already finished."""
    run_dir = sweep.run_dir(run.name)
    if sweep.finished(run.name):
        return None
    if has_checkpoint(run_dir):
        status.resumed_from = "checkpoint"
        return ["--resume", run_dir, "--no-progress"]
    sweep.remove_run_dir(run.name)      # died before its first checkpoint (or never started): start again
    status.resumed_from = None
    return run.train_args(run_dir)


def _best_return(sweep: SweepDir, name: str) -> Optional[float]:
    try:
        with open(os.path.join(sweep.run_dir(name), "summary.json")) as f:
            value = json.load(f).get("best_eval_return")
        return float(value) if value is not None else None
    except (OSError, ValueError, TypeError):
        return None


class _Progress:
    """A tqdm bar over runs: done/running/failed, ETA from finished runs, best return so far per config."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.bar = None
        self.best: Dict[str, float] = {}
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=done, unit="run", desc="sweep", dynamic_ncols=True)

    def update(self, finished: int, running: int, failed: int, stopping: bool = False) -> None:
        if self.bar is None:
            return
        self.bar.update(finished)
        best = " ".join(f"{c}={v:.0f}" for c, v in sorted(self.best.items()))
        self.bar.set_postfix_str(f"running={running} failed={failed}" + (f" best: {best}" if best else "")
                                 + (" stopping" if stopping else ""), refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sweep(sweep: SweepDir, runs: Sequence[RunSpec], backend, progress: bool = True,
              poll_s: float = 0.5) -> Dict[str, List[str]]:
    """Run every unfinished run of ``runs`` on ``backend``; returns run names by outcome."""
    statuses = sweep.statuses(list(runs))
    todo = deque()
    result: Dict[str, List[str]] = {"done": [], "failed": [], "stopped": [], "pending": []}
    for run in runs:
        if sweep.finished(run.name):
            if statuses[run.name].state != "done":
                statuses[run.name].state = "done"
                sweep.write_status(statuses[run.name])
            result["done"].append(run.name)
        else:
            todo.append(run)
    by_name = {r.name: r for r in runs}
    bar = _Progress(len(runs), len(result["done"]), progress)
    stop_requested_at: Optional[float] = None
    with _catch_stop_signals() as stop:
        try:
            while todo or backend.running():
                if stop.count and stop_requested_at is None:
                    stop_requested_at = time.monotonic()
                    backend.stop()
                if stop.count > 1:
                    backend.kill()
                while todo and not stop.count and backend.running() < backend.capacity():
                    run = todo.popleft()
                    status = statuses[run.name]
                    args = launch_args(sweep, run, status)
                    if args is None:
                        status.state = "done"
                        sweep.write_status(status)
                        result["done"].append(run.name)
                        bar.update(1, backend.running(), len(result["failed"]))
                        continue
                    status.state, status.attempts = "running", status.attempts + 1
                    status.started, status.ended, status.returncode, status.error = time.time(), None, None, None
                    sweep.write_status(status)
                    backend.start(run.name, args, sweep.log_path(run.name))
                if stop.count and not backend.running():
                    break
                for name, code in backend.wait(poll_s):
                    outcome = _record_end(sweep, by_name[name], statuses[name], code, bool(stop.count))
                    result[outcome].append(name)
                    if outcome == "done":
                        best = _best_return(sweep, name)
                        config = by_name[name].label
                        if best is not None:
                            bar.best[config] = max(best, bar.best.get(config, best))
                    bar.update(int(outcome == "done"), backend.running(), len(result["failed"]), bool(stop.count))
                bar.update(0, backend.running(), len(result["failed"]), bool(stop.count))
        finally:
            bar.close()
    result["pending"] = [r.name for r in todo]
    result["signal"] = [stop.signal_name] if stop.count else []
    return result


def _record_end(sweep: SweepDir, run: RunSpec, status: Status, code: int, stopping: bool) -> str:
    """Write the status of an attempt that ended with ``code``; returns done, failed or stopped."""
    status.returncode, status.ended = int(code), time.time()
    status.wall_s = round(status.ended - (status.started or status.ended), 3)
    if sweep.finished(run.name):     # its summary.json is its last write: a stop in its teardown changes nothing
        status.state, status.error = "done", None
    elif stopping and code in (130, -signal.SIGTERM, -signal.SIGKILL, -signal.SIGINT):
        status.state, status.error = "stopped", None
    else:
        status.state = "failed"
        status.error = getattr(code, "message", None) or error_line(sweep.log_path(run.name), int(code))
        if code == 0:
            status.error = "exited 0 without a summary.json"
    sweep.write_status(status)
    return status.state
