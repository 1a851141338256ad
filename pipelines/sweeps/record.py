"""A sweep directory and its JSON records: ``sweep.json`` (spec and run list) and one status record per run.

Layout::

    SWEEP_DIR/
      sweep.json            {"format": "databloom-sweep", "version": 1, "spec": ..., "runs": [RunSpec...]}
      status/<run>.json     {"name", "state", "attempts", "returncode", "error", "wall_s", "started", "ended"}
      logs/<run>.log        the run's stdout and stderr, every attempt appended
      runs/<run>/           the run directory pipelines.train writes (summary.json when it finished)
      run.lock              held while a sweep runs here (core.run_lock): a second sweep is refused

``state`` is ``pending`` (not started), ``running``, ``done`` (its ``summary.json`` is whole: a run stopped
in its last seconds, after writing it, is done too),
``failed`` (with ``error``, the run's one-line error) or ``stopped`` (the sweep was stopped while it
ran; ``--resume`` continues it). Every record is written whole to a temporary file and renamed, so a
reader never sees half of one. Every run name read back is checked (:func:`pipelines.sweeps.spec.
check_run_name`) and every run path is confirmed to lie under ``SWEEP_DIR/runs``.

Example::

    sweep = SweepDir("sweeps/a")
    sweep.create(spec, runs)                # refuses a directory that already holds a sweep
    sweep.write_status(Status(runs[0].name, "done", attempts=1, returncode=0))
    spec, runs = SweepDir("sweeps/a").load()
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any, Dict, List, Optional, Tuple

from core.config import ConfigError
from pipelines.sweeps.spec import RunSpec, SweepSpec, check_run_name

FORMAT, VERSION = "databloom-sweep", 1
STATES = ("pending", "running", "done", "failed", "stopped")


@dataclasses.dataclass
class Status:
    name: str
    state: str = "pending"
    attempts: int = 0
    returncode: Optional[int] = None
    error: Optional[str] = None
    wall_s: Optional[float] = None
    started: Optional[float] = None
    ended: Optional[float] = None
    resumed_from: Optional[str] = None   # "checkpoint" when an attempt continued from a checkpoint


def write_json(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file + rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


class SweepDir:
    """Paths and records of one sweep directory (local)."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    @property
    def record_path(self) -> str:
        return os.path.join(self.root, "sweep.json")

    def run_dir(self, name: str) -> str:
        """``SWEEP_DIR/runs/<name>``, after checking that ``name`` is safe and the path stays inside."""
        base = os.path.join(self.root, "runs")
        path = os.path.join(base, check_run_name(name))
        if os.path.commonpath([os.path.realpath(base), os.path.realpath(path)]) != os.path.realpath(base):
            raise ConfigError(f"run {name!r} resolves outside {base}; valid: a run directory under it")
        return path

    def log_path(self, name: str) -> str:
        return os.path.join(self.root, "logs", f"{check_run_name(name)}.log")

    def status_path(self, name: str) -> str:
        return os.path.join(self.root, "status", f"{check_run_name(name)}.json")

    def exists(self) -> bool:
        return os.path.exists(self.record_path)

    def create(self, spec: SweepSpec, runs: List[RunSpec], argv: Optional[List[str]] = None) -> None:
        if self.exists():
            raise ConfigError(f"--out {self.root!r} already holds a sweep (sweep.json); valid: "
                              f"--resume {self.root}, or a new --out")
        for sub in ("runs", "status", "logs"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        write_json(self.record_path, {"format": FORMAT, "version": VERSION, "created": time.time(),
                                      "command": argv, "spec": spec.to_dict(),
                                      "runs": [r.to_dict() for r in runs]})
        for run in runs:
            self.write_status(Status(run.name))

    def load(self) -> Tuple[SweepSpec, List[RunSpec]]:
        """The spec and run list of ``sweep.json``; ConfigError (one line) if missing, malformed or too new."""
        try:
            with open(self.record_path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{self.root!r} is not a sweep directory (no sweep.json); valid: a directory "
                              "written by python -m pipelines.sweep --out") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{self.record_path} is not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{self.record_path} is not a DataBloom sweep record")
        if not isinstance(data.get("version"), int) or data["version"] > VERSION:
            raise ConfigError(f"{self.record_path} has version {data.get('version')!r}; this DataBloom reads "
                              f"versions up to {VERSION}")
        spec = SweepSpec.from_dict(data.get("spec"), where=self.record_path)
        runs = [RunSpec.from_dict(r) for r in data.get("runs") or []]
        if not runs or len({r.name for r in runs}) != len(runs):
            raise ConfigError(f"{self.record_path}: the run list is empty or names a run twice")
        for run in runs:
            self.run_dir(run.name)
        return spec, runs

    def write_status(self, status: Status) -> None:
        if status.state not in STATES:
            raise ValueError(f"unknown run state {status.state!r}")
        os.makedirs(os.path.dirname(self.status_path(status.name)), exist_ok=True)
        write_json(self.status_path(status.name), dataclasses.asdict(status))

    def read_status(self, name: str) -> Status:
        """The run's status record (``pending`` if there is none or it cannot be read)."""
        try:
            with open(self.status_path(name)) as f:
                data = json.load(f)
            fields = {f.name for f in dataclasses.fields(Status)}
            status = Status(**{k: v for k, v in data.items() if k in fields})
            if status.name != name or status.state not in STATES:
                raise ValueError("mismatched record")
            return status
        except (OSError, ValueError, TypeError):
            return Status(name)

    def statuses(self, runs: List[RunSpec]) -> Dict[str, Status]:
        return {r.name: self.read_status(r.name) for r in runs}

    def finished(self, name: str) -> bool:
        """Whether the run finished: its ``summary.json``, the run's last write, exists and is whole JSON."""
        try:
            with open(os.path.join(self.run_dir(name), "summary.json")) as f:
                return isinstance(json.load(f), dict)
        except (OSError, ValueError):
            return False

    def remove_run_dir(self, name: str) -> None:
        """Delete the run's own directory (``SWEEP_DIR/runs/<name>``, which the sweep created), nothing else."""
        path = self.run_dir(name)
        if os.path.islink(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)


def has_checkpoint(run_dir: str) -> bool:
    """Whether ``run_dir`` holds a config and a complete checkpoint that ``pipelines.train --resume`` continues."""
    if not os.path.exists(os.path.join(run_dir, "config.json")):
        return False
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(root):
        return False
    from core.checkpoint import Checkpointer
    try:
        with Checkpointer(root, keep_last=None, max_workers=1) as ckpt:
            return ckpt.latest_step() is not None
    except Exception:  # noqa: BLE001 - an unreadable checkpoint directory: start the run again
        return False


def error_line(log_path: str, returncode: Optional[int]) -> str:
    """A failed run's one-line error: the last ``error:`` line of its log, else its last line, else the code."""
    lines: List[str] = []
    try:
        with open(log_path, errors="replace") as f:
            lines = [l.strip() for l in f.readlines()[-200:] if l.strip()]
    except OSError:
        pass
    errors = [l for l in lines if l.startswith("error:")]
    if errors:
        return errors[-1]
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    return (lines[-1][:500] if lines else f"exit status {returncode}")
