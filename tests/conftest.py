"""Suite-wide pytest hooks: in CI, no capability may skip silently.

Every optional dependency a test needs is in the ``test`` extra, so on a
machine set up with the README's test command nothing should skip. Tests
still use ``pytest.importorskip`` so that a partial install (say, without
``apache-beam[gcp]``) can run the rest. In CI (``CI=true``, which ``.ci/run``
sets) a skip means the extra lost a package or a test lost its capability,
so any skip not listed in :data:`DOCUMENTED_SKIPS` turns the run red::

    CI=true pytest      # 1 if anything undocumented skipped, with the list

The README's "Tests" section lists the same documented skips.

Each test process also pins TensorFlow's thread pools to the configs' own
(``threads.tf_intra_op``/``tf_inter_op``: 1) before any test runs TF. TF fixes
them at its first op in a process, and a worker runs many training runs in
process after tests that built models: without the pin, a run's parameters
depended in the last bits on which test that worker ran first, and a run
compared with one in a fresh process (a killed-and-resumed run) differed.

The longest test files run first (:data:`LONGEST_FILES`): xdist hands out
whole files (``--dist loadfile``) in collection order (``--no-loadscope-reorder``
in pytest.ini), so a long file collected last would run alone at the end while
the other worker idles.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Dict, List

import pytest

#: node id (or module path for module-level skips) -> what it needs. Keep in sync with README "Tests".
DOCUMENTED_SKIPS: Dict[str, str] = {}

_SKIPPED: List[str] = []

#: Test files by their seconds in CI (``pytest --durations=0`` summed per file, every file of 10 s or more;
#: 2026-12-07, after the sweep tests were cut to 4 runs and R2D2's learner step was XLA-compiled; refresh
#: when a file's time changes a lot). Longest first is the classic rule for two workers to finish together:
#: a long file left to the collection order (the pipelines' tests sort last) ran alone at the end.
LONGEST_FILES: Dict[str, float] = {
    "tests/pipelines/test_beam_identity.py": 216, "tests/pipelines/test_resume_identity.py": 198,
    "tests/pipelines/test_multihost.py": 155, "tests/pipelines/test_sweep.py": 110,
    "tests/core/agents/test_r2d2.py": 93, "tests/pipelines/test_collect_offline.py": 87,
    "tests/pipelines/test_beam_stop.py": 84, "tests/pipelines/test_central_plan.py": 71,
    "tests/pipelines/test_dask_cluster.py": 68, "tests/pipelines/test_training.py": 61,
    "tests/pipelines/test_determinism.py": 55, "tests/pipelines/test_executors.py": 51,
    "tests/core/inference/test_inference.py": 48, "tests/core/agents/test_r2d2_pixels.py": 41,
    "tests/core/envs/test_dmc.py": 36, "tests/pipelines/test_sweep_beam.py": 34,
    "tests/core/replay/test_replay_s3.py": 32, "tests/benchmarks/test_cluster_scale.py": 31,
    "tests/core/agents/test_d4pg.py": 31, "tests/pipelines/test_beam.py": 22,
    "tests/pipelines/test_beam_warm_workers.py": 22, "tests/pipelines/test_corruption.py": 22,
    "tests/benchmarks/test_r2d2_first_step.py": 21, "tests/core/test_native_logs.py": 19,
    "tests/core/carbon/test_carbon_integration.py": 17, "tests/core/carbon/test_carbon_eit.py": 16,
    "tests/pipelines/test_run_dir_urls.py": 16, "tests/benchmarks/test_learning_suite.py": 15,
    "tests/core/dataset/test_export_interop.py": 15, "tests/benchmarks/test_actorq_study.py": 14,
    "tests/pipelines/test_tf_threads.py": 13, "tests/core/envs/test_atari.py": 13,
    "tests/core/agents/test_fused_adam.py": 12, "tests/core/replay/test_replay_faults.py": 11,
    "tests/core/agents/test_vtrace.py": 11, "tests/core/test_run_lock.py": 11,
    "tests/benchmarks/test_time_to_solve.py": 10, "tests/pipelines/test_cli_errors.py": 10,
    "tests/pipelines/test_quality_sequences.py": 10,
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _documented(nodeid: str) -> bool:
    return any(nodeid == k or nodeid.startswith(k + "::") for k in DOCUMENTED_SKIPS)


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return                # the xdist controller runs no test
    if importlib.util.find_spec("tensorflow") is None:
        return                # a partial install: the tests that need TF skip
    from core.config import load_config
    from pipelines.run.learner_stage import configure_threads
    configure_threads(load_config())     # the default config's pools, as a fresh ``pipelines.train`` has


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    """The longest files first; the rest keep their order (a stable sort)."""
    items.sort(key=lambda item: -LONGEST_FILES.get(item.nodeid.split("::")[0], 0.0))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:   # a module-level importorskip skips the whole file
        _SKIPPED.append(report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    undocumented = sorted({n for n in _SKIPPED if not _documented(n)})
    if not (_in_ci() and undocumented):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(f"error: {len(undocumented)} test(s) skipped in CI without being documented "
                            "(tests/conftest.py DOCUMENTED_SKIPS, README 'Tests'); install what they need:",
                            red=True)
        for nodeid in undocumented:
            reporter.write_line(f"  {nodeid}", red=True)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
