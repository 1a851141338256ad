"""How many actors one driver feeds: the central costs of a training run, measured to 64 simulated actors.

Issue 30's ``benchmarks/cluster_scale.py``. On a real cluster every worker has its own cores; what stays
central is the driver (planning, submitting, committing, publishing versions) and the Dask scheduler.
This study makes the actors cost (almost) no CPU, so that a 2-core machine shows those costs to N = 64:

* **the env waits**: ``waiting:<obs>-<step>us`` (:mod:`core.envs.waiting`), a real gymnasium env whose
  step sleeps. Actors, LiteRT int8 policies, shard writes, commits, policy versions and the plan are all
  the product's own (``pipelines.run.driver.Trainer`` on a Dask cluster);
* **the learner** is the real one (``--learner real``) or a stand-in (``--learner simulated``, the
  default) that waits ``--learn-us-per-step`` per planned learner step, as a learner on its own
  accelerator would, and publishes real policy versions of its (untrained) network on the plan's
  schedule; on one more worker started with ``--resources GPU=1`` (``--learner-host worker``, the
  product's ``learner.resources`` placement: the driver's CPU is orchestration only) or on a thread of
  the driver (``--learner-host driver``, the product's one-machine default);
* **the cluster** is a ``dask scheduler`` process and ``dask worker`` processes on 127.0.0.1, the way a
  cluster is started (a LocalCluster would mix the scheduler's CPU into the driver's). N actors run on
  ``min(N, --max-processes)`` worker processes with a thread each: a waiting env holds no GIL, so threads
  scale like processes here (64 processes would take ~64 x 180 MB; the record gives the workers' RSS);
  all of them run with :data:`pipelines.executors.dask_config.QUIET_CLUSTER` (no work stealing, no
  profiler, a 1 s event-loop tick), as README's "Running on a cluster" starts a cluster;
* **blocks** hold ``--block-rows`` rows (4,096 by default: the issue's bound)
  at every N; a task is ``--num-envs`` x ``--steps-per-task`` rows (8 x 8),
  so a block is 64 tasks however they are spread over actors (``--steps-per-task
  auto``: one task per actor per block);
* **Dask tasks**: a block's rollouts are one Dask task per worker process (``run_rollout_group``),
  plus its shard write; ``--rollout-tasks per-actor``: one per actor (the product before).

For each N it measures, over the run's steady state (from the commit of
block ``--warmup-blocks`` to the last): env steps/s; efficiency = steps/s /
(N x steps/s at N = 1); the driver's and the scheduler's CPU seconds per
1,000 env steps (psutil, their processes' user + system time); the workers'
CPU in cores and as a share of this machine; bytes the driver received
against trajectory bytes; commit latency (the driver's time for one
commit, p50/p99); the policy lag the committed tasks saw. It projects, from the central cost per env
step, the env steps/s one driver core and one scheduler core sustain, names the first to saturate,
plots and writes ``benchmarks/results/cluster-scale.json``. First it measures an idle cluster's CPU
(``--idle-seconds``): the floor of the central cost per second, which a slow run pays per env step.

Example::

    python benchmarks/studies/cluster_scale.py                         # N = 1..64, ~14 min on 2 cores
    python benchmarks/studies/cluster_scale.py --quick                 # N = 1 2 4, short runs
    python benchmarks/studies/cluster_scale.py --obs 84x84x4-uint8 --workers 1 4 --seconds 10 \\
        --out benchmarks/results/cluster-scale-atari.json --plot ''   # Atari-sized frames
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:   # run as a script or imported by tests: this checkout's core/pipelines/benchmarks
    sys.path.insert(0, REPO)

from benchmarks.common import git_state, machine_info  # noqa: E402
from benchmarks.studies.cluster_scale_plot import plot_record  # noqa: E402
from benchmarks.studies.cluster_scale_parts import (  # noqa: E402
    ClusterProcesses, ScaleTrainer, SimulatedLearnerStage, ThreadedStage, idle_floor, percentile)
from pipelines.executors.common import thread_env  # noqa: E402

DEFAULT_WORKERS = (1, 2, 4, 8, 16, 32, 64)
LEARNER_RESOURCES = {"GPU": 1}     # what the learner's worker advertises (--learner-host worker)
RESULTS = os.path.join(REPO, "benchmarks", "results")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")    # the TFLite converter's C++ notes, one per version


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/studies/cluster_scale.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=list(DEFAULT_WORKERS),
                   help="actor counts N to sweep, one actor per worker thread (default: 1 2 4 8 16 32 64)")
    p.add_argument("--step-us", type=int, default=10000,
                   help="wall microseconds one env step waits (default 10000: one actor ~ 100 env steps/s, so "
                        "that the actors' own CPU, ~150-280 us per env step here (inference, shard writes), stays "
                        "under this machine's two cores up to N = 64; at 1000, N = 32 would need 3-6 cores and "
                        "the study would measure contention, not orchestration)")
    p.add_argument("--obs", default="4-float32",
                   help="observation of the waiting env, <shape>-<dtype>: 4-float32 (CartPole-sized, default) "
                        "or 84x84x4-uint8 (Atari-sized frames)")
    p.add_argument("--learner", choices=("simulated", "real"), default="simulated",
                   help="simulated: waits --learn-us-per-step per learner step on its own thread (default); "
                        "real: the DQN learner in the driver process (the product's default placement)")
    p.add_argument("--learner-host", choices=("worker", "driver"), default="worker",
                   help="worker: the learner (either kind) runs as a Dask actor on a worker process of its own, "
                        "started with --resources GPU=1 (learner.resources), as a learner on its accelerator "
                        "would, so that the driver's CPU is orchestration only (default); driver: in the driver "
                        "process (the product's default placement: the driver's CPU then includes the learner's)")
    p.add_argument("--learn-us-per-step", type=float, default=10.0,
                   help="wall microseconds per learner step of the simulated learner (default 10)")
    p.add_argument("--block-rows", type=int, default=4096, help="rows per plan block = per shard (default 4096)")
    p.add_argument("--num-envs", type=int, default=8, help="envs per actor task (default 8)")
    p.add_argument("--steps-per-task", type=steps_per_task_arg, default=8,
                   help="vector steps per actor task (default 8: 64 tasks per 4,096-row block at every N), or "
                        "'auto': one task per actor per block (block-rows / (N x num-envs) vector steps)")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="steady-state seconds to aim for at each N, after warm-up (default 20)")
    p.add_argument("--warmup-blocks", type=int, default=2,
                   help="blocks committed before the measurement window opens (default 2)")
    p.add_argument("--max-processes", type=int, default=8,
                   help="most worker processes; more actors share them as threads (default 8)")
    p.add_argument("--quick", action="store_true", help="N = 1 2 4, 4 s each: a short check, not a result")
    p.add_argument("--idle-seconds", type=float, default=10.0,
                   help="first measure an idle cluster's CPU this long, the central cost's floor (0: skip)")
    p.add_argument("--out", default=os.path.join(RESULTS, "cluster-scale.json"),
                   help="JSON record (default benchmarks/results/cluster-scale.json; '' = none)")
    p.add_argument("--plot", default=os.path.join(RESULTS, "cluster-scale.png"),
                   help="PNG of steps/s, efficiency and central CPU against N (default "
                        "benchmarks/results/cluster-scale.png; '' = none)")
    p.add_argument("--policy-lag", type=int, default=1,
                   help="actors.policy_lag: blocks that run ahead of the learner (default 1, the product's)")
    p.add_argument("--rollout-tasks", choices=("per-worker", "per-actor"), default="per-worker",
                   help="per-worker: a block's rollouts are one Dask task per worker process, running its "
                        "actors on its threads (the product's); per-actor: one task per actor per block (before)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar per run")
    return p


def steps_per_task_arg(text: str):
    """``--steps-per-task``: an int, or ``auto`` (one task per actor per block, :func:`task_steps`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'auto'") from None


def task_steps(args, n: int) -> int:
    """Vector steps of one actor task at N actors: ``--steps-per-task``, or with ``auto`` one task per actor
    per block (``check_args`` has made sure that N x num-envs divides the block)."""
    if args.steps_per_task == "auto":
        return args.block_rows // (n * args.num_envs)
    return args.steps_per_task


def check_args(args) -> None:
    """``error:`` one line and exit 2 for settings that cannot run (argparse's convention)."""
    from core.envs import EnvError
    from core.envs.waiting import parse_env_id
    bad = [(f"--workers {n}", "every N >= 1") for n in args.workers if n < 1]
    for name in ("step_us", "block_rows", "num_envs", "max_processes"):
        if getattr(args, name) < 1:
            bad.append((f"--{name.replace('_', '-')} {getattr(args, name)}", ">= 1"))
    if args.seconds <= 0 or args.learn_us_per_step < 0 or args.warmup_blocks < 1 or args.idle_seconds < 0:
        bad.append(("--seconds/--learn-us-per-step/--warmup-blocks/--idle-seconds",
                    "seconds > 0, learn >= 0, warm-up >= 1, idle >= 0"))
    try:
        parse_env_id(env_id(args))
    except EnvError as e:
        bad.append((f"--obs {args.obs}", str(e)))
    if args.steps_per_task == "auto":
        for n in args.workers:
            if n >= 1 and args.num_envs >= 1 and args.block_rows % (n * args.num_envs):
                bad.append((f"--steps-per-task auto at N = {n}: {n} x {args.num_envs} envs does not divide "
                            f"--block-rows {args.block_rows}", "N x num-envs divides block-rows at every N"))
    elif args.steps_per_task < 1:
        bad.append((f"--steps-per-task {args.steps_per_task}", ">= 1, or auto"))
    else:
        task_rows = args.num_envs * args.steps_per_task
        if any(n * task_rows > args.block_rows for n in args.workers):
            bad.append((f"N x {task_rows} task rows > --block-rows {args.block_rows}",
                        "N x num-envs x steps-per-task <= block-rows (a block is one round of tasks or more)"))
    if bad:
        what, valid = bad[0]
        print(f"error: {what}; valid: {valid}", file=sys.stderr)
        raise SystemExit(2)


def env_id(args) -> str:
    return f"waiting:{args.obs}-{args.step_us}us"


def run_config(args, n: int, total_env_steps: int):
    """The run's config: the default config with a waiting env, N actors, fixed blocks, no evaluations."""
    from core import config as config_lib
    big = 10 ** 12
    sets = [f"env.id={env_id(args)}", f"env.num_envs={args.num_envs}", f"actors.num_actors={n}",
            f"actors.steps_per_task={task_steps(args, n)}", f"replay.shard_max_rows={args.block_rows}",
            f"replay.min_size={args.block_rows}", f"total_env_steps={total_env_steps}", "executor=dask",
            f"eval.every_env_steps={big}", "eval.episodes=1", "eval.confirm_episodes=0",
            "eval.stop_at_target=false", "actors.stall_timeout_s=600", f"actors.policy_lag={args.policy_lag}"]
    if args.learner_host == "worker":
        sets.append(f"learner.resources={json.dumps(LEARNER_RESOURCES)}")
    if args.learner == "simulated":   # the stand-in's learner never steps: its checkpoints would repeat step 0
        sets.append(f"checkpoint.every_steps={big}")
    if args.obs != "4-float32":       # a wide input: a small torso keeps the int8 policy (actors' CPU) small
        sets.append("agent.hidden=[32]")
    return config_lib.load_config(os.path.join(REPO, "configs", "default.yaml"), sets)


def planned_steps(args, n: int) -> int:
    """Env steps for ``--seconds`` of steady state at the actors' own speed, plus the warm-up blocks."""
    rate = n * 1e6 / args.step_us
    blocks = max(3, int(rate * args.seconds / args.block_rows) + 1) + args.warmup_blocks
    return blocks * args.block_rows


def measure(args, n: int, root: str) -> Dict[str, Any]:
    """One run at N actors on a fresh cluster; its steady-state record."""
    import dask
    from pipelines.executors.dask import DaskExecutor
    from pipelines.executors.dask_config import QUIET_CLUSTER
    from pipelines.run.learner_stage import LearnerStage
    cfg = run_config(args, n, planned_steps(args, n))
    processes = min(n, args.max_processes)
    threads = -(-n // processes)
    run_dir = os.path.join(root, f"n{n}")
    learner_resources = LEARNER_RESOURCES if args.learner_host == "worker" else None
    with ClusterProcesses(processes, threads, env=thread_env(cfg), root=root,
                          learner_resources=learner_resources) as cluster, \
            dask.config.set(QUIET_CLUSTER):     # the client's side of the cluster's settings
        executor = DaskExecutor(address=cluster.address, retries=cfg.dask.task_retries)
        if args.rollout_tasks == "per-actor":     # BlockTasks then makes a group of each actor
            executor.actor_groups = None
        try:
            step_s = args.learn_us_per_step * 1e-6
            if args.learner == "real":
                stage = None       # the product's placement: learner.resources picks the learner's worker
            elif learner_resources:
                stage = lambda ex: ex.place(SimulatedLearnerStage, cfg, run_dir, step_s,       # noqa: E731
                                            resources=learner_resources, key=f"learner-sim-{n}-{time.time_ns()}")
            else:
                stage = lambda ex: ThreadedStage(SimulatedLearnerStage(cfg, run_dir, step_s), ex)  # noqa: E731
            trainer = ScaleTrainer(cfg, run_dir, executor, progress=not args.no_progress, stage=stage,
                                   warmup_blocks=args.warmup_blocks, watch_pids=cluster.pids())
            trainer.run()
            learner_where = trainer.stage.where()
        finally:
            executor.close()
    w = trainer.window
    steps, wall = w["env_steps"], w["wall_s"]
    cores = os.cpu_count() or 1
    cpu = {k: w["cpu_s"].get(k, 0.0) for k in ("driver", "scheduler", "workers", "learner")}
    lags = trainer.lags_seen
    rollout_tasks = processes if args.rollout_tasks == "per-worker" else n
    return {"n_workers": n, "worker_processes": processes, "threads_per_process": threads,
            "block_rows": trainer.plan.block_rows, "rollout_tasks": args.rollout_tasks,
            # Dask tasks per block: the rollouts' and the shard write; the plan's actor tasks they run
            "tasks_per_block": rollout_tasks + 1,
            "plan_tasks_per_block": trainer.plan.num_actors * trainer.plan.tasks_per_block,
            "task_rows": trainer.plan.task_rows,
            "blocks_measured": w["blocks"], "env_steps": steps, "wall_s": round(wall, 3),
            "env_steps_per_s": round(steps / wall, 1),
            "driver_cpu_s_per_1k_steps": round(1000 * cpu["driver"] / steps, 5),
            "scheduler_cpu_s_per_1k_steps": round(1000 * cpu["scheduler"] / steps, 5),
            "central_cpu_s_per_1k_steps": round(1000 * (cpu["driver"] + cpu["scheduler"]) / steps, 5),
            "driver_cpu_ms_per_block": round(1000 * cpu["driver"] / w["blocks"], 3),
            # the driver's CPU per block by thread: its loop (main) and Dask's client event loop; the rest
            # (energy ledger, progress bar, stage calls' threads) is the remainder
            "driver_cpu_ms_per_block_by_thread": _by_thread(w["cpu_s"], w["blocks"]),
            "scheduler_cpu_ms_per_task": round(1000 * cpu["scheduler"] / (w["blocks"] * (rollout_tasks + 1)), 4),
            "learner_host": args.learner_host, "learner_where": learner_where,
            "learner_cpu_s_per_1k_steps": (round(1000 * cpu["learner"] / steps, 5)
                                           if args.learner_host == "worker" else None),
            "workers_cpu_cores": round(cpu["workers"] / wall, 3),
            "workers_cpu_share": round(cpu["workers"] / wall / cores, 4),
            "workers_rss_mb": round(w["workers_rss"] / 2 ** 20, 1),
            "driver_bytes_in": int(trainer.driver_bytes_total), "trajectory_bytes": int(trainer.trajectory_bytes),
            "driver_bytes_pct": round(100 * trainer.driver_bytes_total / max(trainer.trajectory_bytes, 1), 4),
            "commit_latency_ms_p50": round(1000 * percentile(trainer.commit_s, 50), 3),
            "commit_latency_ms_p99": round(1000 * percentile(trainer.commit_s, 99), 3),
            "policy_lag_versions_mean": round(sum(lags) / max(len(lags), 1), 3),
            "policy_lag_versions_max": max(lags, default=0),
            # the driver's wall seconds per block by loop phase, whole run (Flight.busy_s / idle_s)
            "driver_busy_ms_per_block": {k: round(1000 * v / trainer.plan.num_blocks, 2) for k, v in trainer.busy_s.items()},
            "driver_idle_ms_per_block": {k: round(1000 * v / trainer.plan.num_blocks, 2) for k, v in trainer.idle_s.items()}}


def _by_thread(cpu_s: Dict[str, float], blocks: int) -> Dict[str, float]:
    main, io_loop = cpu_s.get("driver_main", 0.0), cpu_s.get("driver_client_io_loop", 0.0)
    return {k: round(1000 * v / blocks, 3) for k, v in
            (("main", main), ("client_io_loop", io_loop), ("other", cpu_s["driver"] - main - io_loop))}


def add_efficiency(records: List[Dict[str, Any]]) -> None:
    """``efficiency`` = steps/s at N / (N x steps/s at N = 1), for every record (needs the N = 1 record)."""
    one = next((r for r in records if r["n_workers"] == 1), None)
    for r in records:
        r["efficiency"] = None if one is None else round(r["env_steps_per_s"] / (r["n_workers"] * one["env_steps_per_s"]), 4)


def projection(records: List[Dict[str, Any]], block_rows: int, floor: Optional[Dict[str, float]]) -> Dict[str, Any]:
    """Env steps/s one driver core and one scheduler core sustain, from the largest N's central costs; the
    central cost's spread over N, and without the idle cluster's ``floor`` (its per-second CPU) where given."""
    top = max(records, key=lambda r: r["n_workers"])
    driver = 1000.0 / max(top["driver_cpu_s_per_1k_steps"], 1e-12)
    scheduler = 1000.0 / max(top["scheduler_cpu_s_per_1k_steps"], 1e-12)
    costs = [r["central_cpu_s_per_1k_steps"] for r in records]
    idle = [(floor["scheduler_ms_per_s"] + floor["client_ms_per_s"]) / r["env_steps_per_s"] for r in records] \
        if floor else [0.0] * len(records)
    less = [max(c - i, 1e-12) for c, i in zip(costs, idle)]
    return {"idle_floor": floor, "idle_floor_cpu_s_per_1k_steps": [round(i, 5) for i in idle],
            "central_cost_less_idle_max_over_min": round(max(less) / min(less), 3) if floor else None,
            "from_n_workers": top["n_workers"], "block_rows": block_rows,
            "driver_ms_per_block": top["driver_cpu_ms_per_block"],
            "one_driver_core_env_steps_per_s": round(driver), "one_scheduler_core_env_steps_per_s": round(scheduler),
            "saturates_first": "driver" if driver < scheduler else "scheduler",
            "central_cost_max_over_min": round(max(costs) / max(min(costs), 1e-12), 3)}


def table(records: List[Dict[str, Any]]) -> str:
    head = ("   N  procs x thr  tasks/blk   steps/s   eff.  driver ms/1k  sched ms/1k  workers cores (share)  RSS MB  "
            "drv bytes %  commit p50/p99 ms  lag mean/max")
    rows = [f"{r['n_workers']:4d}  {r['worker_processes']:5d} x {r['threads_per_process']:<3d}"
            f"{r['tasks_per_block']:10d}{r['env_steps_per_s']:10.0f}  {100 * (r['efficiency'] or 0):4.0f}%"
            f"  {1000 * r['driver_cpu_s_per_1k_steps']:12.1f}  {1000 * r['scheduler_cpu_s_per_1k_steps']:11.1f}"
            f"  {r['workers_cpu_cores']:6.2f} ({100 * r['workers_cpu_share']:4.1f}%)       {r['workers_rss_mb']:7.0f}"
            f"  {r['driver_bytes_pct']:10.3f}  {r['commit_latency_ms_p50']:7.1f} / {r['commit_latency_ms_p99']:<7.1f}"
            f"  {r['policy_lag_versions_mean']:.2f} / {r['policy_lag_versions_max']}" for r in records]
    return "\n".join([head, *rows])


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.workers, args.seconds = [n for n in args.workers if n <= 4] or [1, 2], min(args.seconds, 4.0)
        args.idle_seconds = min(args.idle_seconds, 2.0)
    args.workers = sorted(set(args.workers))
    check_args(args)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    machine = machine_info()
    records = []
    with tempfile.TemporaryDirectory(prefix="cluster-scale-") as root:
        floor = idle_floor(thread_env(run_config(args, 1, 1)), root, LEARNER_RESOURCES if args.learner_host ==
                           "worker" else None, args.idle_seconds) if args.idle_seconds > 0 else None
        for i, n in enumerate(args.workers):
            print(f"[{i + 1}/{len(args.workers)}] N = {n} actors ({env_id(args)}, learner {args.learner} on the "
                  f"{args.learner_host})", flush=True)
            records.append(measure(args, n, root))
            add_efficiency(records)
            print(table(records[-1:]).splitlines()[-1], flush=True)
    add_efficiency(records)
    proj = projection(records, args.block_rows, floor)
    print(table(records))
    print(f"one driver core: {proj['one_driver_core_env_steps_per_s']:,} env steps/s "
          f"({proj['driver_ms_per_block']} ms CPU per {args.block_rows}-row block); one scheduler core: "
          f"{proj['one_scheduler_core_env_steps_per_s']:,}; saturates first: {proj['saturates_first']}; "
          f"central cost max/min over N: {proj['central_cost_max_over_min']}")
    if floor:
        print(f"idle cluster: scheduler {floor['scheduler_ms_per_s']} ms/s, client {floor['client_ms_per_s']} ms/s of "
              f"CPU; central cost less that floor, max/min over N: {proj['central_cost_less_idle_max_over_min']}")
    split = max(records, key=lambda r: r["n_workers"])["driver_cpu_ms_per_block_by_thread"]
    print(f"driver CPU per block at N = {proj['from_n_workers']} by thread: main (plan, submit, commit) "
          f"{split['main']} ms, Dask client's event loop {split['client_io_loop']} ms, other {split['other']} ms")
    commit, dirty = git_state()
    record = {"study": "cluster-scale", "date": started, "command": " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
              "git_commit": commit, "git_dirty": dirty, "machine": machine,
              "machine_load_end": os.getloadavg(), "env_id": env_id(args), "learner": args.learner,
              "learner_host": args.learner_host, "policy_lag": args.policy_lag,
              "rollout_tasks": args.rollout_tasks,
              "learn_us_per_step": args.learn_us_per_step if args.learner == "simulated" else None,
              "records": records, "projection": proj}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"wrote {os.path.relpath(args.out)}")
    if args.plot:
        plot_record(record, args.plot)
        print(f"wrote {os.path.relpath(args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
