"""One learning-suite run: a fresh ``pipelines.train`` process, watched, turned into a record.

:class:`PlannedRun` is a config + overrides + seed with its resolved budget.
:func:`run_one` starts ``python -m pipelines.train --config C --seed S
--run-dir DIR --no-progress [--set ...]`` in its own process group (so a
timeout or Ctrl-C stops its Dask workers too), follows the env-step count in
the run's ``metrics.jsonl`` with a progress bar (:class:`MetricsTail`), and
returns the run's record (:func:`benchmarks.studies.suite_report.suite_record` plus commit,
date, machine, load and command). :class:`EtaModel` estimates the time left
for the runs still to come.

Example::

    run = PlannedRun.resolve("configs/default.yaml", ("total_env_steps=2048",), seed=0)
    rec = run_one(run, run.run_dir("runs/learning-suite", commit), commit, dirty=False)
    rec["reached"], rec["final_return"]
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from benchmarks.common import REPO, machine_info, slug

#: metrics.jsonl record kinds whose ``step`` counts env steps (learner/broadcast records count learner steps)
ENV_STEP_KINDS = frozenset({"commit", "eval", "policy_lag", "workers", "round", "inference", "summary"})
#: seconds a run spends before its first env step (imports, cluster start-up), for estimates before any run ended
STARTUP_GUESS_S = 10.0
#: seconds between plain progress lines (no progress bar)
PLAIN_EVERY_S = 60.0


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of the suite: ``config`` (repo-relative) with ``overrides`` applied in order, at ``seed``."""
    config: str
    overrides: tuple
    seed: int
    budget: int            # total_env_steps after the overrides
    executor: str
    target_return: float

    @classmethod
    def resolve(cls, config: str, overrides: Sequence[str], seed: int) -> "PlannedRun":
        """Load ``config`` with ``overrides`` (ConfigError on a bad path or override) and plan it."""
        from core import config as config_lib
        cfg = config_lib.load_config(os.path.join(REPO, config), list(overrides))
        return cls(config, tuple(overrides), seed, int(cfg.total_env_steps), cfg.executor,
                   float(cfg.eval.target_return))

    @property
    def label(self) -> str:
        """The config path plus its overrides: the table row this run belongs to."""
        return " ".join((self.config,) + self.overrides)

    def run_dir(self, runs_dir: str, commit: str) -> str:
        return os.path.abspath(os.path.join(runs_dir, commit[:12], slug(self.label), f"seed-{self.seed}"))

    def command(self, run_dir: str) -> List[str]:
        cmd = [sys.executable, "-m", "pipelines.train", "--config", self.config, "--seed", str(self.seed),
               "--run-dir", run_dir, "--no-progress"]
        for item in self.overrides:
            cmd += ["--set", item]
        return cmd


class MetricsTail:
    """Follows a growing ``metrics.jsonl``: latest env-step count and latest evaluation mean.

    Reads only the bytes appended since the last poll and keeps a partial last
    line for the next one, so polling a long run stays cheap.
    """

    def __init__(self, path: str):
        self.path, self._offset, self._partial = path, 0, b""
        self.env_steps, self.last_eval = 0, None

    def poll(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.env_steps
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") in ENV_STEP_KINDS and "step" in rec:
                self.env_steps = max(self.env_steps, int(rec["step"]))
            if rec.get("kind") == "eval":
                self.last_eval = rec.get("confirmed_mean") if rec.get("confirmed_mean") is not None else rec["mean"]
        return self.env_steps


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the run's process group (driver + Dask workers), then kill what is left after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _watch(proc: subprocess.Popen, run: PlannedRun, run_dir: str, timeout: Optional[float], progress: bool,
           on_tick: Optional[Callable[[float], Optional[str]]]) -> Optional[int]:
    """Wait for ``proc``, showing its env steps from metrics.jsonl; the return code, or None after a timeout.

    With ``progress`` a tqdm bar; without, one plain line every
    :data:`PLAIN_EVERY_S` seconds (readable in a log file). ``on_tick(elapsed)``
    runs every poll; the text it returns (the suite's ETA) ends the plain line.
    """
    tail, t0, bar, last_line = MetricsTail(os.path.join(run_dir, "metrics.jsonl")), time.time(), None, time.time()
    if progress:
        from tqdm.auto import tqdm
        short = run.config.removeprefix("configs/").removesuffix(".yaml")
        bar = tqdm(total=run.budget, desc=f"{short} seed {run.seed}", unit="step", position=1, leave=False,
                   dynamic_ncols=True)
    try:
        while proc.poll() is None:
            if timeout is not None and time.time() - t0 > timeout:
                _stop(proc)
                return None
            steps = tail.poll()
            if bar is not None:
                bar.update(steps - bar.n)
                bar.set_postfix_str("eval -" if tail.last_eval is None else f"eval {tail.last_eval:.1f}",
                                    refresh=False)
            extra = on_tick(time.time() - t0) if on_tick is not None else None
            if bar is None and time.time() - last_line >= PLAIN_EVERY_S:
                last_line = time.time()
                shown = "-" if tail.last_eval is None else f"{tail.last_eval:.1f}"
                print(f"  {run.label} seed {run.seed}: {steps:,}/{run.budget:,} env steps, eval {shown}, "
                      f"{last_line - t0:.0f} s" + (f"; {extra}" if extra else ""), flush=True)
            time.sleep(0.5)
        return proc.returncode
    finally:
        if bar is not None:
            bar.close()


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith(("error:", "Error", "Traceback")) or "Error:" in line]
    return (errors or lines or [""])[-1][:500]


def run_one(run: PlannedRun, run_dir: str, commit: str, dirty: bool, timeout: Optional[float] = None,
            progress: bool = True, on_tick: Optional[Callable[[float], Optional[str]]] = None,
            harvest: bool = False) -> Dict[str, Any]:
    """Train ``run`` in a fresh process into ``run_dir`` (replacing what is there) and return its record.

    With ``harvest``, a finished run directory (``summary.json``) is not
    trained again: its record is read as it is (``--resume`` uses this for a
    run whose record was not yet saved when the suite stopped).
    """
    import shlex
    import shutil
    log_path = run_dir + ".log"
    cmd = run.command(run_dir)
    load_before, t0 = os.getloadavg()[0], time.time()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if harvest and os.path.exists(os.path.join(run_dir, "summary.json")):
        rc, wall = 0, None
    else:
        shutil.rmtree(run_dir, ignore_errors=True)   # an earlier attempt of this same run: start fresh
        os.makedirs(os.path.dirname(run_dir), exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = _watch(proc, run, run_dir, timeout, progress, on_tick)
            except BaseException:   # Ctrl-C or a bug here: never leave the run's processes behind
                _stop(proc)
                raise
        wall = time.time() - t0
    rec: Dict[str, Any] = {"config": run.config, "overrides": list(run.overrides), "label": run.label,
                           "seed": run.seed, "executor": run.executor, "target_return": run.target_return}
    if rc == 0 and os.path.exists(os.path.join(run_dir, "summary.json")):
        from benchmarks.studies.suite_report import suite_record
        rec.update(status="ok", **suite_record(run_dir))
    else:
        rec.update(status="timeout" if rc is None else "failed", reached=False, env_steps_to_target=None,
                   time_to_target_s=None, final_return=None, ended_at_target=False, best_confirmed_return=None,
                   curve=[], error=f"timed out after {timeout:g} s" if rc is None else _last_line(log_path))
    rec.update(returncode=rc, process_wall_s=wall, git_commit=commit, git_dirty=dirty,
               date=started,
               machine=machine_info(with_load=False), loadavg_before=load_before, loadavg_after=os.getloadavg()[0],
               command=shlex.join(["python"] + cmd[1:]), run_dir=run_dir, log=log_path)
    return rec


class EtaModel:
    """Expected seconds of the runs still to come, from the runs already recorded.

    A run is expected to take the median process wall time of recorded runs
    with its label; with none, its budget at the env steps per second seen
    over all recorded runs plus :data:`STARTUP_GUESS_S`. Runs stop at their
    target, so budget-based guesses are upper bounds. Unknown until one run
    has finished.
    """

    def __init__(self, records: Sequence[Dict[str, Any]] = ()):
        self._walls: Dict[str, List[float]] = {}
        self._steps, self._seconds = 0, 0.0
        for r in records:
            self.add(r)

    def add(self, rec: Dict[str, Any]) -> None:
        wall = rec.get("process_wall_s")
        if rec.get("status") != "ok" or not wall:
            return
        self._walls.setdefault(rec["label"], []).append(float(wall))
        self._steps += int(rec.get("env_steps") or 0)
        self._seconds += float(wall)

    def expected_s(self, run: PlannedRun) -> Optional[float]:
        if run.label in self._walls:
            return float(np.median(self._walls[run.label]))
        if self._steps > 0:
            return run.budget / (self._steps / self._seconds) + STARTUP_GUESS_S
        return None

    def remaining_s(self, runs: Sequence[PlannedRun], elapsed_in_first: float = 0.0) -> Optional[float]:
        """Seconds left for ``runs``, the first of which has been running for ``elapsed_in_first``."""
        guesses = [self.expected_s(r) for r in runs]
        if any(g is None for g in guesses):
            return None
        return max(0.0, guesses[0] - elapsed_in_first) + sum(guesses[1:]) if guesses else 0.0

    def text(self, runs: Sequence[PlannedRun], elapsed_in_first: float = 0.0) -> str:
        left = self.remaining_s(runs, elapsed_in_first)
        if left is None:
            return "ETA ? (known once a run has finished)"
        return f"ETA {datetime.timedelta(seconds=int(left))}"
