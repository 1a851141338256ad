"""Time from process start to a confirmed 475 on CartPole-v1: DataBloom's default vs SB3 DQN and SB3 PPO.

Systems, each run in a fresh process whose clock starts at process start
(imports, cluster start-up and evaluations included):

* ``databloom``: the shipped default, ``python -m pipelines.train --config configs/default.yaml --seed S``
  (double DQN, int8 actors on Dask), read from the run's summary.json. The runs are one product sweep
  (:mod:`pipelines.sweeps`: spec, validation of every run before any starts, run directories, status
  records, a failed run's one-line error), each run started alone in its seed's slot. Two things stay
  the default's rather than the sweep's, since this is a timing of the default as a user starts it: its
  thread settings (the spec's ``set`` restores the config's own values of the keys the sweep sets to one
  thread, :data:`pipelines.sweeps.spec.THREAD_OVERRIDES`) and its executor and environment
  (:class:`DefaultRunBackend`: the config's executor, Dask, unless ``--executor``; this process's
  environment, without the sweep's single-threaded BLAS/OpenMP);
* ``sb3-dqn`` / ``sb3-ppo``: Stable-Baselines3 with the rl-baselines3-zoo
  CartPole-v1 settings (``benchmarks/studies/sb3_cartpole.py``; PPO on 8 envs), which
  need ``pip install -e ".[bench]"``.

For each seed the systems run back to back, one process at a time, the order rotated by the seed
(seed 0: databloom, dqn, ppo; seed 1: dqn, ppo, databloom; ...), so slow drifts
in machine load hit all alike. Every run uses the same rule for its first
hit: every ``--eval-every`` env steps (default 4,000, the default config's
value) 20 greedy episodes; when their mean reaches 475, ``--confirm-episodes``
(default 100, the default config's value) fresh episodes must agree. DataBloom
gets these as ``--set eval.*`` overrides, equal to what it ships by default.
Every system stops at its first hit.

Per system: solved k/N, median time and env steps to 475 (a run that never
reached it counts as infinitely slow, see ``benchmarks.studies.suite_report.median_to_target``),
median final return. Writes ``--out`` (JSON, every run; a DataBloom run's record adds its sweep run
name ``run`` and ``process_wall_s``) and the markdown table beside it (``.md``). The sweep directory is a
temporary one, deleted at the end, as the run directories were before. SIGINT or SIGTERM during a
DataBloom run stops it (the sweep's planned stop) and the benchmark, with exit status 130; ``--out``
keeps the runs that ended.

    python benchmarks/studies/time_to_solve.py               # 5 seeds x 3 systems (est. 15-25 min, quiet 2 cores)
    python benchmarks/studies/time_to_solve.py --systems databloom --seeds 3 --executor local
"""
from __future__ import annotations

import argparse
import datetime
import functools
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
from pipelines.sweeps import launch  # noqa: E402
from pipelines.sweeps.launch import LocalBackend  # noqa: E402

SYSTEMS = ("databloom", "sb3-dqn", "sb3-ppo")
STOPPED = 130   # exit status after SIGINT/SIGTERM stopped a DataBloom run (benchmarks.studies.suite_runs.STOPPED)
TARGET = 475.0
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "results", "time_to_solve.json")
DEFAULT_CONFIG = os.path.join(ROOT, "configs", "default.yaml")   # pipelines.train's default


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


def _env() -> Dict[str, str]:
    """This process's environment with the repository importable (every run's, DataBloom's and SB3's)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def thread_overrides(config: str) -> List[str]:
    """The config's own values of the keys every sweep run sets to one thread (``THREAD_OVERRIDES``), as ``--set``."""
    from core.config import load_config
    from pipelines.sweeps.spec import THREAD_OVERRIDES, value_text
    cfg = load_config(config, [])
    keys = [item.partition("=")[0] for item in THREAD_OVERRIDES]
    return [f"{k}={value_text(functools.reduce(getattr, k.split('.'), cfg))}" for k in keys]


def databloom_spec(args: argparse.Namespace):
    """The DataBloom side as a sweep spec: the default config, seeds 0..N-1, its threads, the evaluation, ``--set``."""
    from pipelines.sweeps.spec import ConfigEntry, SweepSpec
    evals = [f"eval.every_env_steps={args.eval_every}", "eval.episodes=20",
             f"eval.confirm_episodes={args.confirm_episodes}", f"eval.target_return={TARGET:g}"]
    return SweepSpec(configs=[ConfigEntry(DEFAULT_CONFIG, name="databloom")], seeds=list(range(args.seeds)),
                     overrides=[*thread_overrides(DEFAULT_CONFIG), *evals, *args.overrides])


def with_executor(train_args: Sequence[str], executor: Optional[str]) -> List[str]:
    """A sweep run's ``pipelines.train`` arguments with ``executor`` in place of the sweep's ``--executor local``.

    ``executor`` None drops it (the config's own executor); arguments without ``--executor`` (a ``--resume``)
    are returned as they are.
    """
    args = list(train_args)
    if "--executor" not in args:
        return args
    i = args.index("--executor")
    return args[:i] + (["--executor", executor] if executor else []) + args[i + 2:]


class DefaultRunBackend(LocalBackend):
    """The sweep's local backend, one run at a time, whose run starts as a user starts the default.

    Its runs use ``executor`` (None: the config's own, Dask) instead of the sweep's ``--executor local``,
    and this process's environment instead of the sweep's single-threaded BLAS/OpenMP
    (:data:`pipelines.sweeps.launch.THREAD_ENV`), from the repository. ``commands`` holds each run's arguments as started.
    """

    def __init__(self, executor: Optional[str]):
        super().__init__(workers=1)
        self.executor = executor
        self.commands: Dict[str, List[str]] = {}

    def start(self, name: str, args: Sequence[str], log_path: str) -> None:
        args = with_executor(args, self.executor)
        self.commands[name] = args
        log = launch.open_log(log_path, args)
        proc = subprocess.Popen(launch.train_command(args), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=_env(), stdin=subprocess.DEVNULL, start_new_session=True)
        self._procs[name] = (proc, log)


class DataBloomRuns:
    """The DataBloom side as one sweep in ``root``: every run validated up front, then :meth:`run` one seed's."""

    def __init__(self, root: str, args: argparse.Namespace):
        from pipelines.sweeps.job import prepare
        self.sweep, spec, runs = prepare(databloom_spec(args), root, resume=False)
        self.sweep.create(spec, runs, argv=sys.argv[1:])
        self.runs = {r.seed: r for r in runs}
        self.backend = DefaultRunBackend(args.executor)
        self.stopped: Optional[str] = None     # the signal that stopped a run (SIGINT, SIGTERM)

    def run(self, seed: int) -> Dict[str, Any]:
        """Run seed ``seed``'s run alone (a sweep of that one run) and return its record."""
        from benchmarks.studies.suite_report import suite_record
        from pipelines.sweeps.runner import run_sweep
        run = self.runs[seed]
        result = run_sweep(self.sweep, [run], self.backend, progress=False)
        self.stopped = (result["signal"] or [None])[0]
        status = self.sweep.read_status(run.name)
        args = self.backend.commands.get(run.name, run.train_args(self.sweep.run_dir(run.name)))
        command = _shown([sys.executable, "-m", "pipelines.train",
                          *[os.path.relpath(a, ROOT) if a == run.config else a for a in args]])
        base = {"run": run.name, "process_wall_s": status.wall_s, "command": command}
        if run.name not in result["done"]:
            return {"status": "failed", "returncode": status.returncode,
                    "error": status.error or f"the run was {status.state}", "reached": False,
                    "time_to_target_s": None, "env_steps_to_target": None, "final_return": None, **base}
        rec = suite_record(self.sweep.run_dir(run.name))
        keep = ("reached", "time_to_target_s", "env_steps_to_target", "final_return", "env_steps", "executor", "curve")
        return {"status": "ok", **{k: rec[k] for k in keep}, **base}

    def close(self) -> None:
        self.backend.close()


def sb3_command(algo: str, seed: int, args: argparse.Namespace) -> List[str]:
    return [sys.executable, os.path.join(ROOT, "benchmarks", "studies", "sb3_cartpole.py"), "--algo", algo,
            "--seed", str(seed), "--eval-every", str(args.eval_every), "--confirm-episodes", str(args.confirm_episodes),
            "--torch-threads", str(args.torch_threads)]


def run_sb3(algo: str, seed: int, args: argparse.Namespace) -> Dict[str, Any]:
    cmd = sb3_command(algo, seed, args)
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
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


def run_one(system: str, seed: int, args: argparse.Namespace, databloom: Optional[DataBloomRuns]) -> Dict[str, Any]:
    rec = databloom.run(seed) if system == "databloom" else run_sb3(system.split("-")[1], seed, args)
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


#: Issue 33's goal: DataBloom's median time to a confirmed 475 at least this many times sooner than SB3 PPO's.
SOONER_THAN_PPO = 1.5


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
    ppo = by.get("sb3-ppo")
    if ppo is not None and db["median_time_to_target_s"] and ppo["median_time_to_target_s"]:
        ratio = ppo["median_time_to_target_s"] / db["median_time_to_target_s"]
        met = ratio >= SOONER_THAN_PPO and db["solved"] == db["runs"]
        out.append(f"DataBloom reaches 475 {ratio:.2f}x as soon as sb3-ppo (median time; goal >= "
                   f"{SOONER_THAN_PPO}x with every seed solved): {'met' if met else 'not met'}")
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
    with tempfile.TemporaryDirectory(prefix="time-to-solve-") as tmp:
        databloom = DataBloomRuns(os.path.join(tmp, "sweep"), args) if "databloom" in args.systems else None
        try:
            for seed in range(args.seeds):
                for system in run_order(seed, args.systems):
                    rec = run_one(system, seed, args, databloom)
                    if databloom is not None and databloom.stopped:
                        print(f"stopped by {databloom.stopped}: {len(result['runs'])} runs kept in {args.out}",
                              file=sys.stderr)
                        return STOPPED
                    result["runs"].append(rec)
                    shown = _cell(rec["time_to_target_s"], rec["env_steps_to_target"]) if rec["status"] == "ok" \
                        else rec["error"]
                    print(f"seed {seed} {system}: {rec['status']}, {shown}", flush=True)
                    _write(args.out, result)   # after every run: an interrupted benchmark keeps what it measured
        finally:
            if databloom is not None:
                databloom.close()
    rows = summarize(result["runs"], args.systems)
    result["rows"] = rows
    table = markdown_table(rows)
    _write(args.out, result, table, goal_lines(rows))
    print(table)
    print("\n".join(goal_lines(rows)))
    print(f"machine load at the end (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
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
