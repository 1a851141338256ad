"""Durable records of Beam block rounds: per block, per round, the run's close (JSON only).

Every stage of :mod:`pipelines.beam.blocks` writes its record last and
looks for it first, which makes stages idempotent; the launcher
(:mod:`pipelines.beam.launcher`) reads only the round digests and the final
record, a few hundred bytes per round whatever its length::

    blocks/start.json              State(-1): counters before the first block, version 1
    blocks/b<b>-commit.json        the evaluations decided before block b, its commit (log version)
    blocks/b<b>-learn.json         State(b): counters, pending evaluations, the version published
    blocks/b<b>-eval.json          the evaluation after block b (run_evaluation_task's result)
    rounds/r<round>.json           round_digest: totals and counters of the round's blocks
    rounds/final.json              the close: final evaluation, summary counters
    metrics.jsonl                  each block's commit, learner and broadcast records, appended by
                                   the round's worker when the round ends (log_block_metrics)

Example::

    write_record(run_dir, 3, "learn", state); read_record(run_dir, 3, "learn")
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from core import urls
from pipelines.run.task_stats import tasks_of


def record_path(run_dir: str, block: int, kind: str) -> Tuple[Any, str]:
    """``blocks/b<block>-<kind>.json`` (block -1: ``blocks/start.json``)."""
    fs, path = urls.resolve(run_dir)
    name = "start" if block < 0 else f"b{int(block):08d}-{kind}"
    return fs, f"{path}/blocks/{name}.json"


def write_record(run_dir: str, block: int, kind: str, data: Dict[str, Any]) -> Dict[str, Any]:
    fs, path = record_path(run_dir, block, kind)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        json.dump(data, f)
    return data


def read_record(run_dir: str, block: int, kind: str) -> Optional[Dict[str, Any]]:
    fs, path = record_path(run_dir, block, kind)
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)


def final_path(run_dir: str) -> Tuple[Any, str]:
    fs, path = urls.resolve(run_dir)
    return fs, f"{path}/rounds/final.json"


def round_path(run_dir: str, round_index: int) -> Tuple[Any, str]:
    fs, path = urls.resolve(run_dir)
    return fs, f"{path}/rounds/r{int(round_index):06d}.json"


_ROUND_FILE = re.compile(r"^r(\d{6})\.json$")


def round_indices(run_dir: str) -> List[int]:
    """The rounds with a record ``rounds/r<round>.json`` in ``run_dir``, ascending (other names ignored)."""
    fs, path = urls.resolve(run_dir)
    if not fs.exists(f"{path}/rounds"):
        return []
    return sorted(int(m.group(1)) for name in fs.ls(f"{path}/rounds", detail=False)
                  if (m := _ROUND_FILE.match(name.rsplit("/", 1)[-1])))


def write_json(where: Tuple[Any, str], data: Dict[str, Any]) -> Dict[str, Any]:
    """Write ``data`` at ``(fs, path)`` (as ``final_path``/``round_path`` return), making its folder."""
    fs, path = where
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "w") as f:
        json.dump(data, f)
    return data


def read_json(where: Tuple[Any, str]) -> Optional[Dict[str, Any]]:
    fs, path = where
    if not fs.exists(path):
        return None
    with fs.open(path) as f:
        return json.load(f)


def eval_digest(result: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("version", "mean", "std", "min", "confirmed_mean", "env_steps")
    return {k: (round(result[k], 3) if isinstance(result.get(k), float) else result.get(k)) for k in keys}


def round_digest(round_index: int, blocks: List[Dict[str, Any]], done: bool) -> Dict[str, Any]:
    """All the launcher reads of a round: counters and totals, a few hundred bytes whatever its length.

    The blocks' full states stay in ``blocks/b<b>-learn.json`` (durable, for
    resume and inspection); their per-block metrics go to ``metrics.jsonl`` from the
    worker (:func:`log_block_metrics`), so the launcher's bytes per round do not grow with its length.
    """
    last = blocks[-1]
    loop = last["loop"]
    commits = [s["commit"] for s in blocks if s.get("commit")]
    published = [s["published"] for s in blocks if s.get("published")]
    losses = [r[2]["loss"] for s in blocks for r in s.get("records") or [] if r[0] == "learner"]
    lags = [loop_version - t[5] for s in blocks if s.get("commit")
            for loop_version in [s["loop"]["policy_version"]] for t in tasks_of(s["commit"])]
    return {"round": round_index, "first_block": blocks[0]["block"], "last_block": last["block"],
            "done": bool(done), "stop": bool(last["stop"]), "learned_through": loop["block"] - 1,
            "env_steps": loop["env_steps"], "learner_steps": last["learner_steps"], "episodes": loop["episodes"],
            "policy_version": loop["policy_version"], "best_return": loop["best_return"],
            "best_version": loop["best_version"],
            "commit": {"shards": len(commits), "rows": sum(c["rows"] for c in commits),
                       "bytes": sum(c["nbytes"] for c in commits), "raw_bytes": sum(c["raw_bytes"] for c in commits),
                       "log_version": commits[-1]["log_version"] if commits else None,
                       "write_s": round(sum(c.get("write_s") or 0.0 for c in commits), 4),
                       "returns_tail": [r for c in commits for r in c["returns_tail"]][-10:]},
            "lag_versions": [sum(lags), len(lags)],
            "evaluated": [eval_digest(r) for s in blocks for r in s.get("evaluated") or []],
            "published": published[-1] if published else None, "versions_published": len(published),
            "loss": round(losses[-1], 5) if losses else None,
            "learn_s": round(sum(s.get("learn_s") or 0.0 for s in blocks), 3),
            "learner_workers": sorted({s["worker"] for s in blocks if s.get("worker")})}


def block_metrics(state: Dict[str, Any]) -> List[Tuple[str, int, Dict[str, Any]]]:
    """State(b)'s ``metrics.jsonl`` records, as the driver logs a block: ``commit`` (the driver's fields),
    the learner's records, ``broadcast``; ``(kind, step, fields)`` each. Written by the round's worker
    (:func:`log_block_metrics`), never carried through the launcher."""
    out: List[Tuple[str, int, Dict[str, Any]]] = []
    c = state.get("commit")
    if c:
        out.append(("commit", state["loop"]["env_steps"], {
            "log_version": c["log_version"], "shards": 1, "rows": c["rows"], "bytes": c["nbytes"],
            "block": state["block"], "write_s": c.get("write_s"), "episodes": c.get("episodes", 0),
            "return_sum": c.get("return_sum", 0.0)}))
    out += [(kind, step, fields) for kind, step, fields in state.get("records") or []]
    p = state.get("published")
    if p:
        out.append(("broadcast", state["learner_steps"], {
            "version": p["version"], "payload_bytes": p["payload_bytes"], "convert_seconds": p["convert_seconds"],
            "precision": p["precision"]}))
    return out


def log_block_metrics(run_dir: str, blocks: List[Dict[str, Any]]) -> None:
    """Append the blocks' records (:func:`block_metrics`) to ``<run_dir>/metrics.jsonl`` from the worker.

    The launcher holds no handle on the file while a round runs (it closes its logger around each
    pipeline), so the worker is its only writer then, on local disk and on object stores alike.
    """
    from core.metrics import MetricsLogger
    log = MetricsLogger(run_dir, tensorboard=False)
    try:
        for state in blocks:
            for kind, step, fields in block_metrics(state):
                log.write(kind, step=step, **fields)
    finally:
        log.close()
