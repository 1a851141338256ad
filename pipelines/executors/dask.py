"""Dask executor: stages as tasks on a LocalCluster or an existing cluster.

* Policy payloads are scattered once per version to one worker and tasks
  receive the future, so a version is never re-sent per task; other workers
  fetch it from a worker that holds it.
* A block's rollouts are one task per worker (:meth:`DaskExecutor.actor_groups`:
  the actors pinned there, run on its threads), submitted in one batch
  (:meth:`DaskExecutor.submit_batch`: one ``client.map`` per worker).
* Each actor is pinned to a worker (``workers=[...]``,
  ``allow_other_workers=True``) so its env state stays warm between tasks,
  and may move if that worker dies.
* Lost or failed tasks are retried (``retries``); deterministic task keys and
  shard ids make retries harmless.
* Dataset passes (``map_reduce``) map a function over items as tasks and
  reduce on a worker.
* A stateful stage (the learner) is placed with :meth:`DaskExecutor.place`
  as a Dask actor on a worker picked by resources
  (:mod:`pipelines.executors.dask_stage`). Actors are then pinned to the
  other workers, and so is every other task that may run anywhere (it may
  still move there if they die). An embedded LocalCluster honours
  ``learner_resources`` by starting one more worker that advertises them.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

#: Longest wait on the cluster's futures while a stage call (an in-process thread, polled by done())
#: is among those waited on: how late its end may be seen.
STAGE_POLL_S = 0.1


@contextlib.contextmanager
def workers_ignore_stop_signals():
    """Start worker processes with SIGINT and SIGTERM ignored (inherited across spawn; Python then adds no
    handler for them).

    Ctrl-C in a terminal reaches the whole process group, and so does a batch
    scheduler's SIGTERM (Slurm's ``scancel`` signals every process of the
    job): without this every worker prints a KeyboardInterrupt traceback, or
    dies with the rollouts and shard writes in flight before the driver's
    planned stop (:mod:`pipelines.run.stop_signal`) can finish its block and
    checkpoint. The driver alone handles both and closes the cluster, which
    stops the workers; a driver killed outright takes them with it
    (distributed's workers exit when their parent does).
    """
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: What the embedded cluster's forkserver imports once, before its workers fork from it (:func:`start_worker_forkserver`).
WORKER_PRELOAD = ("distributed", "numpy", "gymnasium", "ai_edge_litert.interpreter")
#: The environment Dask gives a worker process before it starts (its ``distributed.nanny.pre-spawn-environ``
#: defaults: read at process start or at numpy's import, so a forked worker has them only from its forkserver).
WORKER_PRE_START_ENV = {"MALLOC_TRIM_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                        "OPENBLAS_NUM_THREADS": "1"}


def start_worker_forkserver(env: Dict[str, str]) -> bool:
    """Start multiprocessing's forkserver for the embedded cluster's workers; False where there is none.

    A worker process Dask spawns imports ``distributed`` on its own (~0.75 s on
    a 2-core Zen 3), after this process has imported it: two imports one after
    the other on the way to the first env step. A forkserver started before this
    process imports ``distributed`` imports :data:`WORKER_PRELOAD` beside it, and
    each worker is then a fork of it (Dask's
    ``distributed.worker.multiprocessing-method: forkserver``). The forkserver is
    a fresh, single-threaded process (not a fork of this one, whose threads a
    fork would copy in the middle of their work). Called inside
    :func:`workers_ignore_stop_signals`: workers get the forkserver's signal
    dispositions, not those of the process that asks for them. ``env`` (thread
    counts, :func:`pipelines.executors.common.thread_env`, over Dask's own
    :data:`WORKER_PRE_START_ENV`) is set while it starts, because numpy's BLAS
    reads it once, at import, and glibc at process start; a forkserver runs
    once per process, so a later cluster in the same process keeps the first
    one's.
    """
    import multiprocessing
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    from multiprocessing import forkserver
    env = {**WORKER_PRE_START_ENV, **env}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        multiprocessing.set_forkserver_preload(list(WORKER_PRELOAD))
        forkserver.ensure_running()
    except OSError:
        return False
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    import distributed.utils
    if hasattr(distributed.utils, "_forkserver_preload_set"):
        # Ours runs already; Dask's own preload list would only import pandas into this process (~0.5 s).
        distributed.utils._forkserver_preload_set = True
    return True


class DaskExecutor:
    name = "dask"
    deterministic = False
    in_process = False
    #: fn -> fn applied to every submitted stage (pipelines.run.energy sets it: per-process CPU records).
    task_wrapper: Optional[Callable[[Callable], Callable]] = None

    def __init__(self, address: Optional[str] = None, n_workers: int = 0, threads_per_worker: int = 1,
                 retries: int = 3, thread_env: Optional[Dict[str, str]] = None,
                 learner_resources: Optional[Dict[str, float]] = None):
        self.retries = retries
        self._cluster = None
        if address:
            from distributed import Client
            self.client = Client(address, timeout="20s")
        else:
            n = n_workers or os.cpu_count() or 1
            # Dask's settings for few, long, pinned tasks (QUIET_CLUSTER): no work stealing (a stolen
            # rollout leaves its actor's warm worker, its env state and LiteRT interpreter, and must ship
            # the state along: core.rollout), no profiler or 20 ms tick spending the run's cores. A worker
            # process takes the config its nanny was made under, so the learner's worker is made inside too.
            # The forkserver starts before this process imports distributed, so the two imports overlap.
            with workers_ignore_stop_signals():
                forked = start_worker_forkserver(thread_env or {})
            import dask
            from distributed import Client, LocalCluster
            from pipelines.executors.dask_config import QUIET_CLUSTER
            start = {**QUIET_CLUSTER, "distributed.worker.multiprocessing-method": "forkserver" if forked else "spawn"}
            with workers_ignore_stop_signals(), dask.config.set(start):
                self._cluster = LocalCluster(n_workers=n, threads_per_worker=threads_per_worker,
                                             processes=True, dashboard_address=None,
                                             env=thread_env or {}, silence_logs=logging.ERROR)
                self.client = Client(self._cluster)
                if learner_resources:
                    self._add_stage_worker(learner_resources)
        self.client.wait_for_workers(1, timeout=60)
        self._addrs: List[str] = []
        self._addrs_time = 0.0
        self._threads: Dict[str, int] = {}    # worker -> its threads (actor_groups)
        self._stage_addrs: List[str] = []     # workers holding a placed stage (actors avoid them)

    def _add_stage_worker(self, resources: Dict[str, float]) -> None:
        """One more LocalCluster worker, advertising ``resources``, for the placed learner."""
        import copy
        spec = copy.deepcopy(self._cluster.new_spec)
        spec["options"] = {**spec["options"], "resources": dict(resources)}
        n = len(self._cluster.worker_spec)
        self._cluster.worker_spec["learner"] = spec
        with workers_ignore_stop_signals():
            self._cluster.sync(self._cluster._correct_state)    # SpecCluster: start what worker_spec names
        self.client.wait_for_workers(n + 1, timeout=60)

    def check_resources(self, resources: Dict[str, float]) -> None:
        """ConfigError (one line) unless a worker advertises ``resources`` (checked before a run writes)."""
        from pipelines.executors.dask_stage import check_resources
        check_resources(self.client, resources)

    def place(self, cls, *args: Any, resources: Optional[Dict[str, float]] = None, key: str = "stage",
              **kwargs: Any):
        """Start ``cls(*args, **kwargs)`` as an actor on a worker with ``resources``; returns its handle."""
        from pipelines.executors.dask_stage import DaskStageHandle
        handle = DaskStageHandle(self.client, cls, args, kwargs, resources, key)
        self._stage_addrs.append(handle.address)
        self._addrs_time = 0.0      # re-read the actors' workers without it
        return handle

    def broadcast(self, payload: Any):
        # To one worker, not every one: the driver sends the bytes once (not once per worker, each a
        # round trip it waits for) and the actors' workers fetch them from each other on first use.
        return self.client.scatter(payload, broadcast=False, hash=False)

    def submit(self, fn: Callable, *args: Any, key: str | None = None, actor: int | None = None, **kwargs: Any):
        workers = self._placement_of(actor)
        if self.task_wrapper is not None:
            fn = self.task_wrapper(fn)
        return self.client.submit(fn, *args, key=key, workers=workers, allow_other_workers=workers is not None,
                                  retries=self.retries, pure=False, **kwargs)

    def submit_batch(self, fn: Callable, calls: Sequence[Any]) -> List[Any]:
        """``fn`` over ``calls`` (:class:`pipelines.executors.common.BatchCall`): one ``client.map`` per worker.

        Measured (2026-12-04, 2-core Zen 5): ``client.submit`` costs this process ~350 us of CPU per task,
        ``client.map`` ~5-12 us (the scheduler builds the tasks): a block's 64 rollouts cost the driver
        ~22 ms one by one. Calls pinned to one worker go in one map, with the same keys, retries and
        pinning as :meth:`submit`.
        """
        placed = [self._placement_of(c.actor) for c in calls]
        if self.task_wrapper is not None:
            fn = self.task_wrapper(fn)
        groups: Dict[Any, List[int]] = {}
        for i, workers in enumerate(placed):
            groups.setdefault(tuple(workers or ()), []).append(i)
        out: List[Any] = [None] * len(calls)
        for workers, idx in groups.items():
            futures = self.client.map(_apply, [fn] * len(idx), [calls[i].args for i in idx],
                                      [calls[i].kwargs for i in idx], key=[calls[i].key for i in idx],
                                      workers=list(workers) or None, allow_other_workers=bool(workers),
                                      retries=self.retries, pure=False)
            for i, fut in zip(idx, futures):
                out[i] = fut
        return out

    def _placement_of(self, actor: Optional[int]) -> Optional[List[str]]:
        """``workers=`` of a task (see :meth:`submit`): the actor's worker, any but the learner's, or any."""
        addrs = self._worker_addresses()
        if actor is not None:
            return [addrs[actor % len(addrs)]] if addrs else None
        if self._stage_addrs and addrs:
            return addrs          # any worker but the learner's, while there is one
        return None

    def wait(self, futures: Sequence[Any], timeout: float | None = None) -> List[Any]:
        """The futures that are done (finished, failed or cancelled) after at most ``timeout`` s.

        A future Dask cancelled counts as done, not as an error here: a killed
        worker can take a task's inputs with it ("lost dependencies"), and the
        driver resubmits that work when it reads the future (``Trainer._resubmit_lost``).
        """
        import concurrent.futures
        from distributed import Future, wait
        tasks = [f for f in futures if isinstance(f, Future)]      # not a stage call (polled by done())
        if not tasks:
            return [f for f in futures if f.done()]
        if len(tasks) < len(futures) and timeout is not None:
            timeout = min(timeout, STAGE_POLL_S)   # a stage call among them: see it end within STAGE_POLL_S
        try:
            wait(tasks, timeout=timeout, return_when="FIRST_COMPLETED")
        except (TimeoutError, concurrent.futures.CancelledError):
            pass
        return [f for f in futures if f.done()]

    def map_reduce(self, label: str, fn: Callable, items: Sequence[Any], reduce: Callable) -> Any:
        """A dataset pass (:mod:`core.dataset`): ``fn`` per item as tasks, then one reduce task.

        Per-item results go worker -> reduce task; only the reduced result reaches this process.
        """
        from pipelines.executors.common import json_round_trip
        run = uuid.uuid4().hex[:8]
        futures = self.client.map(fn, list(items), key=[f"{label}-{run}-{i}" for i in range(len(items))],
                                  pure=False, retries=self.retries)
        return json_round_trip(self.client.submit(reduce, futures, key=f"{label}-{run}-reduce",
                                                  pure=False).result())

    def _worker_addresses(self) -> List[str]:
        # Refreshed at most every 2 s: one scheduler round trip, not one per task.
        # A placed stage's worker runs no actors while another worker exists.
        if time.monotonic() - self._addrs_time > 2.0 or not self._addrs:
            workers = self.workers()
            addrs = sorted(workers)
            self._addrs = [a for a in addrs if a not in self._stage_addrs] or addrs
            self._threads = {a: int(workers[a].get("nthreads", 1)) for a in addrs}
            self._addrs_time = time.monotonic()
        return self._addrs

    def actor_groups(self, actors: Sequence[int]) -> List[Tuple[List[int], int]]:
        """``actors`` grouped by the worker each is pinned to, with that worker's threads: a block's
        rollouts go as one task per group (:func:`core.rollout.run_rollout_group`), since the scheduler's
        and this client's costs are per task (~0.45 ms of driver CPU each; README, Running on a cluster).
        """
        groups: Dict[str, List[int]] = {}
        for a in actors:
            workers = self._placement_of(a)
            if not workers:        # no worker yet: one task per actor, placed when one joins
                return [([a], 1) for a in actors]
            groups.setdefault(workers[0], []).append(a)
        return [(group, self._threads.get(addr, 1)) for addr, group in groups.items()]

    def placement(self, num_actors: int) -> Dict[int, str]:
        """The worker each actor is pinned to (it may move if that worker dies)."""
        return {a: (self._placement_of(a) or ["any"])[0] for a in range(num_actors)}

    def workers(self) -> Dict[str, Dict[str, Any]]:
        return self.client.scheduler_info(n_workers=-1)["workers"]

    def worker_pids(self) -> List[int]:
        """PIDs of this host's worker processes (energy attribution; core.carbon).

        Workers on other hosts are left out: their PIDs mean nothing here.
        Cached for 5 s, so the energy ledger's 1 s sampling costs at most one
        round trip per 5 s.
        """
        if time.monotonic() - getattr(self, "_pids_time", -1e9) > 5.0:
            import socket
            host = socket.gethostname()
            info = self.client.run(lambda: (socket.gethostname(), os.getpid()))
            self._pids = [pid for h, pid in info.values() if h == host]
            self._pids_time = time.monotonic()
        return list(self._pids)

    def close(self) -> None:
        if self._cluster is not None:
            self._quiet_workers()
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()

    def _quiet_workers(self, timeout_s: float = 5.0) -> None:
        """Silence our own workers' logs before stopping them.

        Stopping a LocalCluster mid-run (Ctrl-C, an error) cuts transfers between
        workers, and the worker still reading logs a ``CommClosedError`` traceback:
        noise at shutdown, not news (task errors reach the driver as exceptions).
        Bounded, so an unresponsive worker cannot hold up the close.
        """
        import concurrent.futures
        pool = concurrent.futures.ThreadPoolExecutor(1)
        try:
            pool.submit(self.client.run, _silence_distributed_logs, on_error="ignore").result(timeout=timeout_s)
        except Exception:   # a worker already gone, or too slow: close anyway
            pass
        finally:
            pool.shutdown(wait=False)


def _apply(fn: Callable, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` on a worker: one item of :meth:`DaskExecutor.submit_batch`'s maps."""
    return fn(*args, **kwargs)


def _silence_distributed_logs() -> None:
    """On a worker: only CRITICAL records from distributed's loggers (see ``DaskExecutor._quiet_workers``)."""
    for name in ["distributed", *[n for n in logging.root.manager.loggerDict if n.startswith("distributed.")]]:
        logging.getLogger(name).setLevel(logging.CRITICAL)
