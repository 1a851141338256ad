"""Beam executor: pipeline options and one call that runs a round's pipeline.

Thin on purpose (see :mod:`pipelines.rounds` for the round's transforms).
It only decides *where* a pipeline runs:

* No ``--runner`` (or a DirectRunner): the embedded default is the
  DirectRunner in ``multi_processing`` mode with one SDK worker process per
  core, because rollouts are CPU-bound Python (``multi_threading`` is held by
  the GIL, ``in_memory`` is one process). ``--direct_running_mode`` and
  ``--direct_num_workers`` given by the user win.
* Any other runner (``--runner DataflowRunner --project P --region R
  --temp_location gs://... --setup_file ./setup.py``): every option passes
  through untouched. Workers on other machines cannot see the launcher's
  disk, so the run directory must be a remote URL (``gs://``, ``s3://``); a
  local path is rejected with a one-line :class:`~core.config.ConfigError`
  before anything starts. Workers install this package from ``setup.py``:
  when none of ``--setup_file``, ``--sdk_container_image``,
  ``--extra_packages`` or ``--requirements_file`` is given, ``--setup_file``
  defaults to this checkout's ``setup.py`` (the one addition we make).

Example::

    options = pipeline_options(["--runner", "DataflowRunner", ...], "gs://b/run")
    run_pipeline(lambda p: p | beam.Create([1]) | beam.Map(print), options)
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional, Sequence

#: Runners that execute on this machine (a local run directory is fine for them).
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner", "PrismRunner")
SETUP_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "setup.py")
_PACKAGING_FLAGS = ("--setup_file", "--sdk_container_image", "--extra_packages", "--requirements_file",
                    "--worker_harness_container_image")


def _given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def runner_name(pipeline_args: Sequence[str]) -> str:
    """The runner named by ``--runner`` (default ``DirectRunner``), without a module path."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    runner = PipelineOptions(list(pipeline_args)).view_as(StandardOptions).runner or "DirectRunner"
    return runner if isinstance(runner, str) else type(runner).__name__


def is_local_runner(pipeline_args: Sequence[str]) -> bool:
    name = runner_name(pipeline_args).rsplit(".", 1)[-1]
    return name in LOCAL_RUNNERS or name.lower() in ("direct", "prism")


def check_run_dir(pipeline_args: Sequence[str], run_dir: str) -> None:
    """ConfigError if a remote runner is pointed at a run directory its workers cannot reach."""
    from core import urls
    from core.config import ConfigError
    if not is_local_runner(pipeline_args) and not urls.is_remote(run_dir):
        raise ConfigError(
            f"--runner {runner_name(pipeline_args)} needs a run directory its workers can reach, got local path "
            f"{run_dir!r}; valid: --run-dir gs://BUCKET/PATH (or s3://...), or the default DirectRunner")


def pipeline_options(pipeline_args: Sequence[str], run_dir: str, num_workers: Optional[int] = None):
    """PipelineOptions for a round: defaults for the DirectRunner, pass-through otherwise.

    Raises:
        ConfigError: remote runner with a local ``run_dir`` (checked before anything starts).
    """
    from apache_beam.options.pipeline_options import PipelineOptions
    args = list(pipeline_args)
    check_run_dir(args, run_dir)
    if is_local_runner(args):
        if not _given(args, "--direct_running_mode"):
            args += ["--direct_running_mode", "multi_processing"]
        if not _given(args, "--direct_num_workers"):
            args += ["--direct_num_workers", str(num_workers or os.cpu_count() or 1)]
        if not _given(args, "--default_sdk_harness_log_level"):
            args += ["--default_sdk_harness_log_level", "ERROR"]  # quiet SDK-worker chatter
    elif not any(_given(args, f) for f in _PACKAGING_FLAGS):
        args += ["--setup_file", SETUP_PY]   # workers pip-install databloom from this checkout
    return PipelineOptions(args)


def run_pipeline(build: Callable, options) -> None:
    """Build a pipeline with ``build(pipeline)`` and run it to completion."""
    import apache_beam as beam
    logging.getLogger("apache_beam").setLevel(logging.ERROR)   # worker start-up chatter, per round
    with beam.Pipeline(options=options) as pipeline:
        build(pipeline)
