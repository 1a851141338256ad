"""The pieces of the cluster-scale study (``benchmarks/studies/cluster_scale.py``) that touch a run.

* :class:`ClusterProcesses`: a ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1, torn
  down on every exit path; the study reads each process's CPU time by pid.
* :class:`ScaleTrainer`: the product's :class:`~pipelines.run.driver.Trainer`, unchanged in what it
  does, with hooks that record the steady-state window (wall, CPU of driver / scheduler / workers),
  each commit's latency and the policy lag of every committed task.
* :class:`SimulatedLearnerStage`: a :class:`~pipelines.run.learner_stage.LearnerStage` whose
  ``learn_block`` waits ``step_s`` per planned learner step instead of training (no sampling, no
  gradient), then makes the plan's policy versions for real (TFLite int8 of its network);
  :class:`ThreadedStage` runs its ``learn_block`` on a thread of its own, as a learner on its own
  accelerator runs beside the driver (the in-process default would block the driver's loop).

Example::

    with ClusterProcesses(processes=2, threads=4, env={}, root=tmp) as cluster:
        executor = DaskExecutor(address=cluster.address)
        trainer = ScaleTrainer(cfg, run_dir, executor, progress=False, stage=None, warmup_blocks=2,
                               watch_pids=cluster.pids())
        trainer.run(); trainer.window     # {"env_steps", "wall_s", "blocks", "cpu_s": {...}, "workers_rss"}
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from pipelines.executors.dask_config import QUIET_CLUSTER, env_vars
from pipelines.run.driver import Trainer
from pipelines.run.in_process_stage import InProcessStage
from pipelines.run.learner_stage import LearnerStage
from pipelines.run.task_stats import tasks_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def percentile(values: List[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


class ClusterProcesses:
    """A scheduler process and ``processes`` worker processes of ``threads`` threads each (module docstring)."""

    def __init__(self, processes: int, threads: int, env: Dict[str, str], root: str, start_timeout_s: float = 120,
                 learner_resources: Optional[Dict[str, float]] = None):
        self.processes, self.threads, self.root, self.timeout = processes, threads, root, start_timeout_s
        self.learner_resources = learner_resources   # one more worker, one thread, advertising these
        # Dask's settings for few, long, pinned tasks (no stealing, profiler or 20 ms tick), as a user's
        # cluster should run them (README "Running on a cluster"); the driver's client gets them in-process.
        self.env = {**os.environ, **env, "PYTHONPATH": REPO, **env_vars(QUIET_CLUSTER)}
        self.procs: List[subprocess.Popen] = []
        self.address: Optional[str] = None

    def _start(self, module: str, *args: str, log: str) -> subprocess.Popen:
        out = open(os.path.join(self.root, log), "ab")
        proc = subprocess.Popen([sys.executable, "-m", module, *args], env=self.env, stdout=out, stderr=out)
        out.close()
        self.procs.append(proc)
        return proc

    def _start_worker(self, name: str, threads: int, *extra: str, log: str) -> subprocess.Popen:
        return self._start("distributed.cli.dask_worker", self.address, "--nthreads", str(threads), "--no-nanny",
                           "--memory-limit", "0", "--no-dashboard", "--name", name, *extra, log=log)

    def __enter__(self) -> "ClusterProcesses":
        sched_file = os.path.join(self.root, f"scheduler-{time.time_ns()}.json")
        try:
            self._start("distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                        "--scheduler-file", sched_file, log="scheduler.log")
            deadline = time.monotonic() + self.timeout
            while not os.path.exists(sched_file):
                if time.monotonic() > deadline or self.procs[0].poll() is not None:
                    raise RuntimeError(f"dask scheduler did not start (see {self.root}/scheduler.log)")
                time.sleep(0.1)
            time.sleep(0.2)     # the file is written before it is complete, at times
            with open(sched_file) as f:
                self.address = json.load(f)["address"]
            for i in range(self.processes):
                self._start_worker(f"w{i:02d}", self.threads, log="workers.log")
            if self.learner_resources:
                self._start_worker("learner", 1, "--resources",
                                   ",".join(f"{r}={n:g}" for r, n in self.learner_resources.items()), log="learner.log")
            self._wait_for_workers()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_for_workers(self) -> None:
        from distributed import Client
        with Client(self.address, timeout="30s") as client:
            client.wait_for_workers(self.processes + bool(self.learner_resources), timeout=self.timeout)

    def pids(self) -> Dict[str, List[int]]:
        """Process ids by role: the scheduler, the actors' workers and (with ``learner_resources``) the learner's."""
        actors = self.procs[1:1 + self.processes]
        learner = {"learner": [p.pid for p in self.procs[1 + self.processes:]]} if self.learner_resources else {}
        return {"scheduler": [self.procs[0].pid], "workers": [p.pid for p in actors], **learner}

    def __exit__(self, *exc) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def idle_floor(env: Dict[str, str], root: str, learner_resources: Optional[Dict[str, float]],
               seconds: float = 10.0) -> Dict[str, float]:
    """CPU ms per second of a cluster with nothing to do: the scheduler, one actor worker (and the learner's),
    and this process's client, all with QUIET_CLUSTER. Dask's heartbeats (every 0.5 s per worker below
    11 workers, fixed by the scheduler) cost this whatever the run does: the time-proportional floor of the
    central cost, which a slow N = 1 run pays per env step."""
    import dask
    from distributed import Client
    with ClusterProcesses(1, 1, env=env, root=root, learner_resources=learner_resources) as cluster, \
            dask.config.set(QUIET_CLUSTER), Client(cluster.address, timeout="30s"):
        time.sleep(2.0)           # past the connection's start-up
        sched, me = cluster.pids()["scheduler"], [os.getpid()]
        s0, c0, t0 = cpu_seconds(sched), cpu_seconds(me), time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        return {"seconds": round(wall, 2), "scheduler_ms_per_s": round(1000 * (cpu_seconds(sched) - s0) / wall, 3),
                "client_ms_per_s": round(1000 * (cpu_seconds(me) - c0) / wall, 3)}


def cpu_seconds(pids: List[int]) -> float:
    import psutil
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def driver_thread_cpu_seconds() -> Dict[str, float]:
    """This process's CPU seconds in its main thread (the driver's loop: plan, submit, commit) and in Dask's
    client event loop (the thread distributed names "IO loop": every message to and from the scheduler)."""
    import threading
    import psutil
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {"main": 0.0, "client_io_loop": 0.0}
    for t in psutil.Process().threads():
        key = {"MainThread": "main", "IO loop": "client_io_loop"}.get(names.get(t.id, ""))
        if key:
            out[key] += t.user_time + t.system_time
    return out


def rss_bytes(pids: List[int]) -> int:
    import psutil
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


class ScaleTrainer(Trainer):
    """``Trainer`` plus the study's measurements (module docstring); ``stage``: ``executor -> stage`` that makes
    a learner stand-in once the run's store exists, or None for the product's own placement."""

    def __init__(self, cfg, run_dir: str, executor, progress: bool, stage, warmup_blocks: int,
                 watch_pids: Dict[str, List[int]]):
        super().__init__(cfg, run_dir, executor, progress=progress)
        self._stand_in, self.warmup_blocks, self.watch_pids = stage, warmup_blocks, watch_pids
        self.commit_s: List[float] = []
        self.lags_seen: List[int] = []
        self.window: Dict[str, Any] = {}
        self._opened: Dict[str, Any] = {}

    def _place_learner(self):
        return self._stand_in(self.executor) if self._stand_in is not None else super()._place_learner()

    def _sample(self) -> Dict[str, Any]:
        return {"t": time.perf_counter(), "steps": self.loop.env_steps,
                "cpu_s": {"driver": cpu_seconds([os.getpid()]),
                          **{f"driver_{k}": v for k, v in driver_thread_cpu_seconds().items()},
                          **{k: cpu_seconds(v) for k, v in self.watch_pids.items()}}}

    def _commit_next(self, f, bar) -> bool:
        before, t0 = f.next_commit, time.perf_counter()
        out = super()._commit_next(f, bar)
        if f.next_commit > before and before >= self.warmup_blocks:
            self.commit_s.append(time.perf_counter() - t0)
        return out

    def _committed(self, f, c: int, rows: int, info: Dict[str, Any], bar) -> None:
        super()._committed(f, c, rows, info, bar)
        if c >= self.warmup_blocks:
            self.lags_seen.extend(self.loop.policy_version - task[5] for task in tasks_of(info))
        if c == self.warmup_blocks - 1:
            self._opened = self._sample()
        elif c == self.plan.num_blocks - 1 and self._opened:
            end = self._sample()
            self.window = {"env_steps": end["steps"] - self._opened["steps"], "wall_s": end["t"] - self._opened["t"],
                           "blocks": c - (self.warmup_blocks - 1),
                           "cpu_s": {k: end["cpu_s"][k] - self._opened["cpu_s"][k] for k in end["cpu_s"]},
                           "workers_rss": rss_bytes(self.watch_pids["workers"])}

    def _close(self, f):
        self.busy_s, self.idle_s = dict(f.busy_s), dict(f.idle_s)    # the driver's seconds by loop phase
        return super()._close(f)

    @property
    def driver_bytes_total(self) -> int:
        return self._driver_bytes_in() or 0


class SimulatedLearnerStage(LearnerStage):
    """A learner that waits ``step_s`` per planned step and makes real versions of its network (module docstring)."""

    def __init__(self, cfg, run_dir: str, step_s: float):
        super().__init__(cfg, run_dir)
        self.step_s, self.simulated_steps = step_s, 0

    @property
    def steps(self) -> int:
        return self.simulated_steps

    def learn_block(self, block: int, target: int, publish: Optional[int] = None, keep=()) -> Dict[str, Any]:
        n = max(0, target - self.simulated_steps)
        t0 = time.perf_counter()
        time.sleep(n * self.step_s)
        self.simulated_steps += n
        self.seconds["learn_stage"] += time.perf_counter() - t0
        t1 = time.perf_counter()
        published = self._version(publish, keep, blocking=True) if publish is not None else None
        self.seconds["new_version"] += time.perf_counter() - t1
        return {"steps": self.steps, "published": published, "records": self._drain()}


class _ThreadCall:
    """A stage call on the stage's thread: ``done``, ``wait(timeout)``, ``result`` (as the Dask handle's)."""

    def __init__(self, future: concurrent.futures.Future):
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def wait(self, timeout: float) -> None:
        concurrent.futures.wait([self.future], timeout=timeout)

    def result(self) -> Any:
        return self.future.result()


class ThreadedStage(InProcessStage):
    """An in-process stage whose ``call`` runs on one thread of its own (module docstring)."""

    def __init__(self, obj, executor):
        super().__init__(obj, executor)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner")

    def call(self, method: str, *args: Any, **kwargs: Any) -> _ThreadCall:
        return _ThreadCall(self._pool.submit(getattr(self.obj, method), *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        super().close()
