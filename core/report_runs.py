"""Run directories as report input: load them, group them by task, and refuse runs that are not comparable.

Input: run directories written by ``pipelines.train`` (``config.json``,
``summary.json``, ``metrics.jsonl`` with ``eval`` and ``workers`` records).
Runs are grouped by task (env id + algorithm); inside a group their configs
may differ only in ``actors.precision`` and ``seed`` (``name`` and
``run_dir`` are labels and ignored), otherwise :class:`ReportError` names the
differing keys.

Example::

    runs = load_runs(["runs/a-fp32-s0", "runs/a-int8-s0"])   # ReportError if not comparable
    for task, group in group_by_task(runs).items():
        print(task, [(r.precision, r.config["seed"]) for r in group])
"""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence

from core import config as config_lib
from core import urls

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
