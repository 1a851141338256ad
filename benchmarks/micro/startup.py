"""Start-up of a training run: seconds from process start to its ``config`` record, first env step and first commit.

With ``--whole-run`` every run is the default run to its end (its own
budget and evaluations, as a user runs it), and the table adds its env
steps/s (``summary.json``: env steps / training wall) and the ratio of each
checkout's median to the first checkout's.

Runs ``python -m pipelines.train`` (the default config, a short budget, no
evaluation) from each given checkout in turn, alternating, ``--pairs`` times,
and prints per run the seconds from the process's start (the wall clock
just before it is started) to the first ``config`` record (imports, the embedded Dask
cluster, the learner's set-up), to the first env step and to the first
``commit`` record (the first shard of env steps in the replay). The first env
step is the end of the first ``SyncVectorEnv.step`` call in any process of
the run (the driver or a Dask worker), recorded by a ``sitecustomize`` hook
this script puts on the run's ``PYTHONPATH`` (:data:`FIRST_STEP_HOOK`), so
any checkout is measured the same way without code of its own. Compare two
commits side by side::

    git worktree add /tmp/base <commit>
    python benchmarks/micro/startup.py /tmp/base .          # base vs this checkout, 3 alternating pairs
    python benchmarks/micro/startup.py . --pairs 5 --set executor=local
    python benchmarks/micro/startup.py /tmp/base . --pairs 5 --whole-run     # env steps/s, side by side
    python benchmarks/micro/startup.py /tmp/base . --phases                  # each phase, median of 5

With Stable-Baselines3 installed (``pip install -e ".[bench]"``), every round
also starts SB3's PPO and DQN on CartPole-v1 with RL-Zoo's settings
(``benchmarks/studies/sb3_cartpole.py --first-step``) and times them the same
way, from just before the process starts to the end of its first env step,
so the table shows both side by side (``--peers none`` leaves them out).

``--phases`` times each phase a default run needs before its first env step
(imports, config, Dask cluster, energy tracker, store, learner, int8 policy,
LiteRT interpreter, first env step), each in a fresh process with its own
imports (:func:`phase_child`); the run itself overlaps some of them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence

#: ``sitecustomize`` for the measured run's processes: when gymnasium's SyncVectorEnv module loads, its
#: ``step`` is wrapped (on the class, so no instance or pickle changes) to append ``pid time`` to the file
#: ``$DATABLOOM_FIRST_STEP_FILE`` when the process's first env step returns, then it is restored.
FIRST_STEP_HOOK = """
import os, sys
_PATH = os.environ.get("DATABLOOM_FIRST_STEP_FILE")
if _PATH:
    import importlib.machinery, time

    class _FirstStep:
        def find_spec(self, name, path, target=None):
            if name != "gymnasium.vector.sync_vector_env":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                cls = module.SyncVectorEnv
                step = cls.step

                def first_step(self, actions):
                    out = step(self, actions)
                    cls.step = step
                    with open(_PATH, "a") as f:
                        f.write(f"{os.getpid()} {time.time()}\\n")
                    return out
                cls.step = first_step
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _FirstStep())
"""


def one_run(checkout: str, overrides: Sequence[str], whole: bool = False) -> Dict[str, float]:
    """One default run from ``checkout`` (short unless ``whole``); seconds to its first config record, env step
    and commit record, from just before the process is started."""
    with tempfile.TemporaryDirectory(prefix="startup-") as d:
        os.makedirs(f"{d}/hook")
        with open(f"{d}/hook/sitecustomize.py", "w") as f:
            f.write(FIRST_STEP_HOOK)
        cmd = [sys.executable, "-m", "pipelines.train", "--no-progress", "--run-dir", f"{d}/run"]
        if not whole:
            cmd += ["--set", "total_env_steps=4096", "--set", "eval.every_env_steps=100000"]
        for o in overrides:
            cmd += ["--set", o]
        start = time.time()     # the wall clock the run's records and the hook write (not psutil's, below)
        proc = subprocess.Popen(cmd, cwd=checkout,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": f"{d}/hook{os.pathsep}{os.path.abspath(checkout)}",
                                     "DATABLOOM_FIRST_STEP_FILE": f"{d}/first_step"})
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"error: the run from {checkout} failed (exit {proc.returncode}): "
                             f"{err.strip().splitlines()[-1] if err.strip() else ''}")
        with open(f"{d}/run/metrics.jsonl") as f:
            records = [json.loads(line) for line in f]
        with open(f"{d}/run/summary.json") as f:
            summary = json.load(f)
        with open(f"{d}/first_step") as f:
            first_step = min(float(line.split()[1]) for line in f if line.strip())
    first = {kind: next(r["time"] for r in records if r["kind"] == kind) - start for kind in ("config", "commit")}
    return {"config_s": first["config"], "first_step_s": first_step - start, "first_commit_s": first["commit"],
            "load": os.getloadavg()[0],
            "env_steps": summary["env_steps"], "env_steps_per_s": summary["env_steps_per_s"]}


#: Peers whose start-up is timed beside DataBloom's: name -> ``sb3_cartpole.py --algo`` value.
PEERS = {"sb3-ppo": "ppo", "sb3-dqn": "dqn"}
SB3_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "studies", "sb3_cartpole.py")


def peer_first_step(peer: str, seed: int = 0) -> float:
    """Seconds from just before an SB3 process starts to the end of its first env step (its model built)."""
    cmd = [sys.executable, SB3_SCRIPT, "--algo", PEERS[peer], "--seed", str(seed), "--first-step",
           "--torch-threads", "1"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: the {peer} start-up run failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["first_step_time"] - start


def peers_of(option: str) -> List[str]:
    """``--peers``: ``auto`` (both SB3 peers when stable-baselines3 and torch are installed), ``none``, or a list."""
    if option == "none":
        return []
    installed = _sb3_installed()
    if option == "auto":
        return list(PEERS) if installed else []
    names = [n.strip() for n in option.split(",") if n.strip()]
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise SystemExit(f"error: --peers {','.join(bad)} invalid; valid: auto, none, or a list of {', '.join(PEERS)}")
    if not installed:
        raise SystemExit('error: --peers needs stable-baselines3 and torch: pip install -e ".[bench]"')
    return names


def _peer_note(peers: Sequence[str]) -> str:
    if peers:
        return "SB3 (RL-Zoo settings, one torch thread): process start to its first env step, same clock"
    return "SB3 not measured" + ("" if _sb3_installed() else ' (not installed: pip install -e ".[bench]")')


#: The start-up phases, in the order a default run needs them before its first env step.
PHASES = ("imports", "config", "dask_cluster", "energy_tracker", "store_creation", "learner_build",
          "actor_policy_build", "litert_interpreter", "first_env_step")


def _own_process_clock():
    """``core/process_clock.py`` of this script's own checkout, loaded by path: a measured older checkout
    (on ``PYTHONPATH`` in :func:`phase_child`) may lack it, or have psutil's up-to-1-s-early clock."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "core", "process_clock.py")
    spec = importlib.util.spec_from_file_location("_startup_process_clock", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def phase_child() -> Dict[str, float]:
    """In a fresh process: seconds of each start-up phase of the default config, each with its own imports.

    Runs this script's code against the checkout on ``PYTHONPATH`` (the current directory), so an older
    checkout without this function is measured the same way.

    ``imports``: process start to ``pipelines.train`` imported (what ``--help`` pays); ``config``: the
    default config loaded and checked; ``dask_cluster``: the embedded LocalCluster (one worker per core)
    and its client; ``energy_tracker``: the run's energy tracker started (``carbon.backend``; codecarbon
    probes the hardware); ``store_creation``: the replay store created; ``learner_build``: TensorFlow and the
    learner (networks, optimizer); ``actor_policy_build``: the first int8 policy payload;
    ``litert_interpreter``: a LiteRT interpreter on it, first invoke; ``first_env_step``: the actor's
    vector env made, reset and stepped once.
    """
    seconds: Dict[str, float] = {}
    import pipelines.train  # noqa: F401  (the command-line tool's own imports)
    seconds["imports"] = time.time() - _own_process_clock().process_start_time()
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        seconds[name], mark = now - mark, now

    from core.config import load_config
    cfg = load_config(os.path.join(os.getcwd(), "configs", "default.yaml"))     # the checkout's (cwd)
    lap("config")
    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=os.cpu_count(), threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    lap("dask_cluster")
    with tempfile.TemporaryDirectory(prefix="startup-phases-") as d:
        from core.carbon import EnergyTracker
        tracker = EnergyTracker(f"{d}/run", backend=cfg.carbon.backend, country=cfg.carbon.country,
                                pue=cfg.carbon.pue).start()
        lap("energy_tracker")
        from core.replay import ReplayStore
        ReplayStore.open_or_create(f"{d}/replay", env_id=cfg.env.id, **cfg.replay.writer_options())
        lap("store_creation")
        from core.agents.registry import get_builder
        from core.envs import env_spec
        spec = env_spec(cfg.env.id)
        learner = get_builder(cfg.agent.algo).make_learner(spec, cfg.agent, cfg.seed)
        lap("learner_build")
        from core.quantize import PolicyQuantizer
        payload = PolicyQuantizer(cfg.actors.precision, patch=True).quantize(learner.policy_model, version=1)
        lap("actor_policy_build")
        from core.policy import LiteRTPolicy
        import numpy as np
        policy = LiteRTPolicy(payload, batch_size=cfg.env.num_envs, num_threads=cfg.threads.litert)
        policy(np.zeros((cfg.env.num_envs, spec.obs_dim), np.float32))
        lap("litert_interpreter")
        from core.envs import make_vector_env
        envs, _ = make_vector_env(cfg.env.id, cfg.env.num_envs, cfg.seed)
        envs.step(envs.action_space.sample())
        lap("first_env_step")
        envs.close()
        tracker.stop()
    client.close()
    cluster.close()
    return seconds


def phase_table(checkouts: Sequence[str], repeats: int, peers: Sequence[str] = ()) -> None:
    """Run :func:`phase_child` ``repeats`` times per checkout (alternating) and print the median of each phase,
    then each peer's median seconds to its first env step (``repeats`` runs, alternating with the checkouts)."""
    runs: Dict[str, List[Dict[str, float]]] = {c: [] for c in checkouts}
    peer_runs: Dict[str, List[float]] = {p: [] for p in peers}
    for i in range(repeats):
        for peer in peers:
            peer_runs[peer].append(peer_first_step(peer, i))
        for c in checkouts:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), c, "--phase-child"],
                                  capture_output=True, text=True, cwd=c,
                                  env={**os.environ, "PYTHONPATH": os.path.abspath(c), "TF_CPP_MIN_LOG_LEVEL": "2"})
            if proc.returncode != 0:
                raise SystemExit(f"error: the phase run from {c} failed: {proc.stderr.strip().splitlines()[-1:]}")
            runs[c].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"load {os.getloadavg()[0]:.1f}; median of {repeats} fresh processes per checkout; {_peer_note(peers)}")
    print("| phase | " + " | ".join(checkouts) + " |\n|---|" + "---|" * len(checkouts))
    for name in (*PHASES, "total"):
        cells = [statistics.median(sum(r.values()) if name == "total" else r[name] for r in runs[c]) for c in checkouts]
        print(f"| {name} | " + " | ".join(f"{v:.2f} s" for v in cells) + " |")
    for peer, seconds in peer_runs.items():
        print(f"{peer}: process start to its first env step, median {statistics.median(seconds):.2f} s "
              f"({min(seconds):.2f}-{max(seconds):.2f})")


def _sb3_installed() -> bool:
    return _has("stable_baselines3") and _has("torch")


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/micro/startup.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[1:]))
    p.add_argument("checkouts", nargs="+", help="repository checkouts to run from, alternating")
    p.add_argument("--pairs", type=int, default=3, help="runs per checkout (default 3)")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="extra config override for every run (repeatable)")
    p.add_argument("--whole-run", action="store_true",
                   help="run the default config to its end and compare env steps/s (default: a 4,096-step start)")
    p.add_argument("--phases", action="store_true",
                   help="time each start-up phase in fresh processes (median of --pairs, default 5) instead")
    p.add_argument("--peers", default="auto", metavar="auto|none|sb3-ppo,sb3-dqn",
                   help="SB3 runs timed beside DataBloom's, to their first env step (default auto: both SB3 peers "
                        "when stable-baselines3 and torch are installed; not with --whole-run)")
    p.add_argument("--phase-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.phase_child:
        print(json.dumps(phase_child()))
        return 0
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs} invalid; valid: >= 1")
    for c in args.checkouts:
        if not os.path.isfile(os.path.join(c, "pipelines", "train.py")):
            p.error(f"{c!r} is not a DataBloom checkout (no pipelines/train.py)")
    peers = [] if args.whole_run else peers_of(args.peers)
    if args.phases:
        phase_table(args.checkouts, args.pairs if "--pairs" in (argv or sys.argv) else 5, peers)
        return 0
    runs: Dict[str, List[Dict[str, float]]] = {c: [] for c in args.checkouts}
    peer_runs: Dict[str, List[float]] = {p: [] for p in peers}
    for i in range(args.pairs):
        for peer in peers:
            peer_runs[peer].append(peer_first_step(peer, i))
            print(f"{peer}: first env step at {peer_runs[peer][-1]:.2f} s (load {os.getloadavg()[0]:.1f})", flush=True)
        for c in args.checkouts:
            r = one_run(c, args.overrides, args.whole_run)
            runs[c].append(r)
            print(f"{c}: config record at {r['config_s']:.2f} s, first env step at {r['first_step_s']:.2f} s, "
                  f"first commit at {r['first_commit_s']:.2f} s, "
                  f"{r['env_steps']:,} env steps at {r['env_steps_per_s']:,.0f}/s (load {r['load']:.1f})", flush=True)
    base = statistics.median(r["env_steps_per_s"] for r in runs[args.checkouts[0]])
    print(f"\nmedian of {args.pairs} runs per checkout, alternating; load {os.getloadavg()[0]:.1f} at the end; "
          f"{_peer_note(peers)}\n"
          "| checkout | s to config record | s to first env step | s to first commit | env steps/s | vs first |"
          "\n|---|---|---|---|---|---|")
    for c, rs in runs.items():
        speed = statistics.median(r["env_steps_per_s"] for r in rs)
        print(f"| {c} | {statistics.median(r['config_s'] for r in rs):.2f} | "
              f"{statistics.median(r['first_step_s'] for r in rs):.2f} | "
              f"{statistics.median(r['first_commit_s'] for r in rs):.2f} | {speed:,.0f} | {speed / base:.2f}x |")
    for peer, seconds in peer_runs.items():
        print(f"| {peer} | - | {statistics.median(seconds):.2f} | - | - | - |")
    if peer_runs:
        ours = statistics.median(r["first_step_s"] for r in runs[args.checkouts[0]])
        print("\n" + "; ".join(f"{peer} starts {statistics.median(s) / ours:.2f}x as long as {args.checkouts[0]}"
                                for peer, s in peer_runs.items()) + " (to the first env step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
