"""Time from process start to a confirmed 475 on CartPole-v1: DataBloom's default vs SB3 DQN and SB3 PPO.

Systems, each run in a fresh process whose clock starts at process start
(imports, cluster start-up and evaluations included):

* ``databloom``: ``python -m pipelines.train --seed S`` (configs/default.yaml:
  double DQN, int8 actors on Dask), read from the run's summary.json;
* ``sb3-dqn`` / ``sb3-ppo``: Stable-Baselines3 with the rl-baselines3-zoo
  CartPole-v1 settings (``benchmarks/studies/sb3_cartpole.py``; PPO on 8 envs), which
  need ``pip install -e ".[bench]"``.

For each seed the systems run back to back, the order rotated by the seed
(seed 0: databloom, dqn, ppo; seed 1: dqn, ppo, databloom; ...), so slow drifts
in machine load hit all alike. Every run uses the same rule for its first
hit: every ``--eval-every`` env steps (default 4,000, the default config's
value) 20 greedy episodes; when their mean reaches 475, ``--confirm-episodes``
(default 100, the default config's value) fresh episodes must agree. DataBloom
gets these as ``--set eval.*`` overrides, equal to what it ships by default.
Every system stops at its first hit.

Per system: solved k/N, median time and env steps to 475 (a run that never
reached it counts as infinitely slow, see ``benchmarks.studies.suite_report.median_to_target``),
median final return. Writes ``--out`` (JSON, every run) and the markdown table
beside it (``.md``).

    python benchmarks/studies/time_to_solve.py               # 5 seeds x 3 systems (est. 15-25 min, quiet 2 cores)
    python benchmarks/studies/time_to_solve.py --systems databloom --seeds 3 --executor local
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from pipelines.cli import cli_errors  # noqa: E402

SYSTEMS = ("databloom", "sb3-dqn", "sb3-ppo")
TARGET = 475.0
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "time_to_solve.json")


def check_sb3(systems: Sequence[str]) -> None:
    """One-line ConfigError when an SB3 system is asked for and stable-baselines3 or torch is missing."""
    from core.config import ConfigError
    missing = [m for m in ("stable_baselines3", "torch") if importlib.util.find_spec(m) is None]
    if missing and any(s.startswith("sb3") for s in systems):
        raise ConfigError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, needed for "
                          f"{', '.join(s for s in systems if s.startswith('sb3'))}: "
                          f'pip install -e ".[bench]" (or run --systems databloom)')


def run_order(seed: int, systems: Sequence[str]) -> List[str]:
    """``systems`` rotated by ``seed``: each system goes first, middle and last equally often."""
    k = seed % len(systems)
    return list(systems[k:]) + list(systems[:k])


def _env(args: argparse.Namespace) -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def databloom_command(seed: int, run_dir: str, args: argparse.Namespace) -> List[str]:
    cmd = [sys.executable, "-m", "pipelines.train", "--no-progress", "--seed", str(seed), "--run-dir", run_dir,
           "--set", f"eval.every_env_steps={args.eval_every}", "--set", "eval.episodes=20",
           "--set", f"eval.confirm_episodes={args.confirm_episodes}", "--set", f"eval.target_return={TARGET:g}"]
    if args.executor:
        cmd += ["--executor", args.executor]
    for item in args.overrides:
        cmd += ["--set", item]
    return cmd


def run_databloom(seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    from benchmarks.studies.suite_report import suite_record
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = databloom_command(seed, run_dir, args)
        proc = subprocess.run(cmd, cwd=ROOT, env=_env(args), capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(os.path.join(run_dir, "summary.json")):
            return _failed(cmd, proc)
        rec = suite_record(run_dir)
    keep = ("reached", "time_to_target_s", "env_steps_to_target", "final_return", "env_steps", "executor", "curve")
    return {"status": "ok", **{k: rec[k] for k in keep}, "command": _shown(cmd)}


def sb3_command(algo: str, seed: int, args: argparse.Namespace) -> List[str]:
    return [sys.executable, os.path.join(ROOT, "benchmarks", "studies", "sb3_cartpole.py"), "--algo", algo,
            "--seed", str(seed), "--eval-every", str(args.eval_every), "--confirm-episodes", str(args.confirm_episodes),
            "--torch-threads", str(args.torch_threads)]


def run_sb3(algo: str, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    cmd = sb3_command(algo, seed, args)
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(args), capture_output=True, text=True)
    if proc.returncode != 0:
        return _failed(cmd, proc)
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"status": "ok", "reached": rec["time_to_target_s"] is not None, **rec, "command": _shown(cmd)}


def _shown(cmd: List[str]) -> str:
    import shlex
    return shlex.join(["python"] + [os.path.relpath(c, ROOT) if c.endswith("sb3_cartpole.py") else c for c in cmd[1:]])


def _failed(cmd: List[str], proc: subprocess.CompletedProcess) -> Dict[str, Any]:
    lines = [line for line in (proc.stderr or "").splitlines() if line.strip()]
    return {"status": "failed", "returncode": proc.returncode, "error": (lines or ["(no output)"])[-1][:500],
            "reached": False, "time_to_target_s": None, "env_steps_to_target": None, "final_return": None,
            "command": _shown(cmd)}


def run_one(system: str, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    rec = run_databloom(seed, args) if system == "databloom" else run_sb3(system.split("-")[1], seed, args)
    return {"system": system, "seed": seed, **rec}


def summarize(runs: Sequence[Dict[str, Any]], systems: Sequence[str]) -> List[Dict[str, Any]]:
    """One row per system: solved k/N, medians (unsolved = infinitely slow), per-seed values."""
    import numpy as np
    from benchmarks.studies.suite_report import median_to_target
    rows = []
    for system in systems:
        rs = sorted((r for r in runs if r["system"] == system), key=lambda r: r["seed"])
        finals = [r["final_return"] for r in rs if r.get("final_return") is not None]
        rows.append({"system": system, "runs": len(rs), "solved": sum(bool(r["reached"]) for r in rs),
                     "failed": sum(r["status"] != "ok" for r in rs),
                     "median_time_to_target_s": median_to_target([r["time_to_target_s"] for r in rs]),
                     "median_env_steps_to_target": median_to_target([r["env_steps_to_target"] for r in rs]),
                     "median_final_return": float(np.median(finals)) if finals else None,
                     "per_seed": [(r["seed"], r["time_to_target_s"], r["env_steps_to_target"]) for r in rs]})
    return rows


def _cell(seconds: Optional[float], steps: Optional[int]) -> str:
    return "unsolved" if seconds is None else f"{seconds:.1f} s / {steps / 1000:.0f}k"


def markdown_table(rows: Sequence[Dict[str, Any]]) -> str:
    """``| system | seed 0 | ... | median time | median env steps | median final | solved |``."""
    seeds = sorted({s for r in rows for s, _, _ in r["per_seed"]})
    header = (["system"] + [f"seed {s}" for s in seeds] +
              ["median time to 475 (s)", "median env steps to 475", "median final return", "solved"])
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        by_seed = {s: _cell(t, n) for s, t, n in r["per_seed"]}
        fmt = lambda v, spec: "-" if v is None else format(v, spec)
        solved = f"{r['solved']}/{r['runs']}" + (f" ({r['failed']} failed)" if r["failed"] else "")
        lines.append("| " + " | ".join([r["system"]] + [by_seed.get(s, "") for s in seeds] +
                                       [fmt(r["median_time_to_target_s"], ".1f"),
                                        fmt(r["median_env_steps_to_target"], ",.0f"),
                                        fmt(r["median_final_return"], ".1f"), solved]) + " |")
    return "\n".join(lines)


def goal_lines(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """The issue's goals, checked: DataBloom's medians against SB3's, and every seed solved."""
    by = {r["system"]: r for r in rows}
    db = by.get("databloom")
    if db is None:
        return []
    out = [f"DataBloom solved {db['solved']}/{db['runs']} (goal: all)"]
    for system, key, rel, unit in (("sb3-ppo", "median_time_to_target_s", "<=", "s"),
                                   ("sb3-dqn", "median_time_to_target_s", "<", "s"),
                                   ("sb3-dqn", "median_env_steps_to_target", "<=", "env steps")):
        other = by.get(system)
        if other is None:
            continue
        a, b = db[key], other[key]
        met = a is not None and (b is None or (a <= b if rel == "<=" else a < b))
        shown = lambda v: "none (half or more unsolved)" if v is None else f"{v:,.1f}"
        out.append(f"median {unit} to 475: DataBloom {shown(a)} {rel} {system} {shown(b)}? "
                   f"{'met' if met else 'not met'}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/studies/time_to_solve.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=5, metavar="N", help="seeds 0..N-1 per system (default 5)")
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS), help="default: all three")
    p.add_argument("--eval-every", type=int, default=4000, metavar="N",
                   help="env steps between evaluations, every system (default 4000)")
    p.add_argument("--confirm-episodes", type=int, default=100, metavar="N",
                   help="episodes that must confirm a 20-episode mean >= 475, every system (default 100; 0 = off)")
    p.add_argument("--executor", choices=["local", "dask"], help="DataBloom executor (default: the config's, dask)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra DataBloom config override (repeatable)")
    p.add_argument("--torch-threads", type=int, default=2, metavar="N",
                   help="torch threads for SB3 (default 2, the cores here)")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="JSON", help="results (the table goes to the .md beside it)")
    return p


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from core.config import ConfigError
    if args.seeds < 1 or args.eval_every < 1 or args.confirm_episodes < 0:
        raise ConfigError("--seeds and --eval-every must be >= 1 and --confirm-episodes >= 0")
    check_sb3(args.systems)
    from benchmarks.common import git_state, machine_info
    commit, dirty = git_state()
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "git_commit": commit, "git_dirty": dirty, "machine": machine_info(with_load=False), "argv": sys.argv[1:],
              "eval": {"every_env_steps": args.eval_every, "episodes": 20, "confirm_episodes": args.confirm_episodes,
                       "target": TARGET}, "runs": []}
    for seed in range(args.seeds):
        for system in run_order(seed, args.systems):
            rec = run_one(system, seed, args)
            result["runs"].append(rec)
            shown = _cell(rec["time_to_target_s"], rec["env_steps_to_target"]) if rec["status"] == "ok" \
                else rec["error"]
            print(f"seed {seed} {system}: {rec['status']}, {shown}", flush=True)
            _write(args.out, result)   # after every run: an interrupted benchmark keeps what it measured
    rows = summarize(result["runs"], args.systems)
    result["rows"] = rows
    table = markdown_table(rows)
    _write(args.out, result, table, goal_lines(rows))
    print(table)
    print("\n".join(goal_lines(rows)))
    return 0


def _write(out: str, result: Dict[str, Any], table: Optional[str] = None, goals: Sequence[str] = ()) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(out + ".tmp", out)
    if table is not None:
        e = result["eval"]
        md = [f"# Time to 475 on CartPole-v1 ({result['date']}, commit {result['git_commit'][:12]})", "", table, "",
              f"Evaluation: every {e['every_env_steps']:,} env steps, 20 greedy episodes, a mean >= 475 confirmed "
              f"by {e['confirm_episodes']} more; time from process start. Machine: {result['machine']['cpu']} x "
              f"{result['machine']['cores']}.", ""] + [f"- {g}" for g in goals]
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    sys.exit(main())
