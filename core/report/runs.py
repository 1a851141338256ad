"""Run directories as report input: load them, group them by task, and refuse runs that are not comparable.

Input: run directories written by ``pipelines.train`` (``config.json``,
``summary.json``, ``metrics.jsonl`` with ``eval`` and ``workers`` records).
Runs are grouped by task (env id + algorithm); inside a group their configs
may differ only in ``actors.precision`` and ``seed`` (``name`` and
``run_dir`` are labels and ignored), otherwise :class:`ReportError` names the
differing keys.

:func:`save_report_record` copies just those parts of a finished run
(config, summary, carbon, and the ``eval`` records and last ``workers``
record of its metrics) into a small directory that :func:`load_run` reads
like the run itself: small enough to commit, so a study that spans several
sessions (and machines) keeps every finished run's result.

Example::

    runs = load_runs(["runs/a-fp32-s0", "runs/a-int8-s0"])   # ReportError if not comparable
    for task, group in group_by_task(runs).items():
        print(task, [(r.precision, r.config["seed"]) for r in group])
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence

from core import config as config_lib
from core import urls

#: files of a run directory that a report record keeps (carbon.json only where the run wrote one)
RECORD_FILES = ("config.json", "summary.json", "carbon.json")

#: config keys allowed to differ between runs of one task
VARYING_KEYS = ("actors.precision", "seed", "name", "run_dir")


class ReportError(ValueError):
    """Bad report input (one-line message)."""


@dataclasses.dataclass
class Run:
    run_dir: str
    config: Dict[str, Any]
    summary: Dict[str, Any]
    evals: List[Dict[str, Any]]
    workers: Optional[Dict[str, Any]] = None

    @property
    def actor_steps_per_s(self) -> Optional[float]:
        """Env steps per second of actor time (stepping + inference, not waiting), per worker."""
        rows = (self.workers or {}).values()
        steps = sum(r["env_steps"] for r in rows)
        seconds = sum(r["env_steps"] / r["env_steps_per_s"] for r in rows if r.get("env_steps_per_s"))
        return steps / seconds if seconds > 0 else None

    @property
    def task(self) -> str:
        return f"{self.config['env']['id']} {self.config['agent']['algo']}"

    @property
    def precision(self) -> str:
        return self.config["actors"]["precision"]


def _read_json(run_dir: str, name: str) -> Any:
    fs, path = urls.resolve(run_dir)
    if not fs.exists(f"{path}/{name}"):
        raise ReportError(f"{run_dir!r} is not a finished run directory (no {name}); "
                          f"pass directories written by python -m pipelines.train")
    with fs.open(f"{path}/{name}", "r") as f:
        return json.load(f)


def load_run(run_dir: str) -> Run:
    """Config, summary and evaluation records of one run directory."""
    from core.metrics import read_metrics
    config, summary = _read_json(run_dir, "config.json"), _read_json(run_dir, "summary.json")
    evals = sorted(read_metrics(run_dir, kind="eval"), key=lambda r: r["step"])
    workers = read_metrics(run_dir, kind="workers")
    return Run(run_dir, config, summary, evals, workers[-1]["workers"] if workers else None)


def load_runs(run_dirs: Sequence[str]) -> List[Run]:
    if not run_dirs:
        raise ReportError("no run directories given; pass one or more RUN_DIRs")
    runs = [load_run(d) for d in run_dirs]
    check_comparable(runs)
    return runs


def group_by_task(runs: Sequence[Run]) -> Dict[str, List[Run]]:
    groups: Dict[str, List[Run]] = defaultdict(list)
    for r in runs:
        groups[r.task].append(r)
    return dict(groups)


def check_comparable(runs: Sequence[Run]) -> None:
    """Raise ReportError naming the keys in which runs of one task differ (beyond VARYING_KEYS)."""
    for task, group in group_by_task(runs).items():
        flat = [config_lib.flatten(r.config) for r in group]
        keys = sorted(set().union(*flat))
        differing = [k for k in keys if k not in VARYING_KEYS
                     and len({json.dumps(f.get(k), sort_keys=True) for f in flat}) > 1]
        if differing:
            shown = ", ".join(differing[:8]) + (f" (+{len(differing) - 8} more)" if len(differing) > 8 else "")
            raise ReportError(f"runs of task {task!r} differ in {shown}; configs may differ only in "
                              f"actors.precision and seed")


def save_report_record(run_dir: str, dest: str, extra: Optional[Dict[str, Any]] = None) -> str:
    """Write the report's view of the finished local run ``run_dir`` to the directory ``dest``; return ``dest``.

    ``dest`` gets :data:`RECORD_FILES` (those present), a ``metrics.jsonl``
    with every ``eval`` record and the last ``workers`` record, and, if
    given, ``extra`` as ``record.json`` (how the run was made: command,
    seconds, load, commit). The directory appears whole or not at all: it is
    written beside ``dest`` and renamed into place, replacing an older one,
    so an interrupted save never leaves a record that looks finished.
    """
    from core.metrics import read_metrics
    for name in ("config.json", "summary.json"):
        _read_json(run_dir, name)      # ReportError (one line) unless the run finished
    records = read_metrics(run_dir)
    workers = [r for r in records if r["kind"] == "workers"]
    kept = [r for r in records if r["kind"] == "eval"] + workers[-1:]
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".record-", dir=parent)
    try:
        for name in RECORD_FILES:
            if os.path.isfile(os.path.join(run_dir, name)):
                shutil.copyfile(os.path.join(run_dir, name), os.path.join(tmp, name))
        with open(os.path.join(tmp, "metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in kept)
        if extra is not None:
            with open(os.path.join(tmp, "record.json"), "w") as f:
                json.dump(extra, f, indent=2, sort_keys=True)
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
