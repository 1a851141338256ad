"""pipelines/executors/dask_config.py: the quiet settings reach processes started apart, and do what they say."""
import os
import subprocess
import sys
import time

import dask.config

from pipelines.executors.dask_config import QUIET_CLUSTER, env_vars


def test_env_vars_are_daskss_spelling_of_each_key():
    assert env_vars({"distributed.admin.tick.interval": "1s", "distributed.scheduler.work-stealing": False,
                     "distributed.scheduler.active-memory-manager.start": False}) == {
        "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
        "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING": "False",
        "DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__START": "False"}


def test_dask_reads_the_env_vars_back_into_the_same_settings():
    read = dask.config.collect_env(env_vars(QUIET_CLUSTER))
    assert {key: dask.config.get(key, config=read) for key in QUIET_CLUSTER} == QUIET_CLUSTER


def test_a_scheduler_and_worker_started_with_them_run_quiet(tmp_path):
    """A ``dask scheduler`` and ``dask worker`` started with :func:`env_vars` hold the settings: no
    stealing extension, no profiler cycles, the 1 s tick."""
    from distributed import Client
    env = {**os.environ, **env_vars(QUIET_CLUSTER)}
    sched_file = str(tmp_path / "scheduler.json")
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", "0", "--no-dashboard", "--scheduler-file", sched_file], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sched_file):
            assert time.monotonic() < deadline and procs[0].poll() is None, "the scheduler did not start"
            time.sleep(0.1)
        procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                       sched_file, "--nthreads", "1", "--no-nanny", "--no-dashboard"], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with Client(scheduler_file=sched_file, timeout="30s") as client:
            client.wait_for_workers(1, timeout=60)
            assert "stealing" not in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.extensions))
            worker = client.run(lambda dask_worker: (dask.config.get("distributed.worker.profile.enabled"),
                                                     dask.config.get("distributed.admin.tick.interval"),
                                                     "profile" in dask_worker.periodic_callbacks))
            assert list(worker.values()) == [(False, "1s", False)]
    finally:
        for p in procs[::-1]:
            p.terminate()
            p.wait(timeout=30)


def test_the_training_clusters_workers_run_quiet_the_learners_worker_too():
    """DaskExecutor's embedded LocalCluster: its scheduler has no stealing, and every worker process, the one
    started later for a placed learner included, has no profiler and the 1 s tick."""
    from pipelines.executors.dask import DaskExecutor
    executor = DaskExecutor(n_workers=1, learner_resources={"GPU": 1})
    try:
        client = executor.client
        client.wait_for_workers(2, timeout=60)
        assert "stealing" not in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.extensions))
        workers = client.run(lambda dask_worker: (dask.config.get("distributed.admin.tick.interval"),
                                                  "profile" in dask_worker.periodic_callbacks))
        assert sorted(workers.values()) == [("1s", False), ("1s", False)]
    finally:
        executor.close()
