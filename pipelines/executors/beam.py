"""Beam executor: pipeline options and one call that runs a round's pipeline.

Thin on purpose (see :mod:`pipelines.beam.graph` for the round's transforms).
It only decides *where* a pipeline runs:

* No ``--runner`` (or a DirectRunner): the embedded default is the
  DirectRunner in ``multi_processing`` mode with one SDK worker process per
  core, because rollouts are CPU-bound Python (``multi_threading`` is held by
  the GIL, ``in_memory`` is one process). ``--direct_running_mode`` and
  ``--direct_num_workers`` given by the user win. :func:`runner_for` runs
  DirectRunner pipelines on Beam's batch engine (``FnApiRunner``), in that
  mode with :data:`WORKER_COMMAND` as the worker process (Beam's worker, ended
  without the interpreter's teardown: :mod:`pipelines.beam.sdk_worker`), or
  on a training run's warm worker processes (:mod:`pipelines.beam.warm_workers`).
* Any other runner (``--runner DataflowRunner --project P --region R
  --temp_location gs://... --setup_file ./setup.py``): every option passes
  through untouched. Workers on other machines cannot see the launcher's
  disk, so the run directory must be a remote URL (``gs://``, ``s3://``); a
  local path is rejected with a one-line :class:`~core.config.ConfigError`
  before anything starts. Workers install this package from ``setup.py``:
  when none of ``--setup_file``, ``--sdk_container_image``,
  ``--extra_packages`` or ``--requirements_file`` is given, ``--setup_file``
  defaults to this checkout's ``setup.py`` (the one addition we make).

Dataset passes (:mod:`core.dataset`) run through :class:`BeamExecutor`'s
``map_reduce``: one pipeline per pass, ``Create | Reshuffle | Map | ToList |
reduce | write JSON``; the launcher reads the JSON, so nothing relies on the
launcher's memory. Its options pass through untouched (default: the
DirectRunner, in-process).

Example::

    options = pipeline_options(["--runner", "DataflowRunner", ...], "gs://b/run")
    run_pipeline(lambda p: p | beam.Create([1]) | beam.Map(print), options)
"""
from __future__ import annotations

import logging
import os
import shlex
import sys
import tempfile
import uuid
from typing import Any, Callable, List, Optional, Sequence

#: Runners that execute on this machine (a local run directory is fine for them).
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner", "PrismRunner")
SETUP_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "setup.py")
#: The DirectRunner's worker process in multi_processing mode (Beam's own: ``-m ...worker.sdk_worker_main``).
WORKER_COMMAND = f"{shlex.quote(sys.executable)} -m pipelines.beam.sdk_worker"
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


def is_direct_runner(options) -> bool:
    """True where ``options`` run on the DirectRunner (no ``--runner``, or ``DirectRunner`` / ``direct``)."""
    from apache_beam.options.pipeline_options import StandardOptions
    return options.view_as(StandardOptions).runner in (None, "DirectRunner", "direct")


def with_flags(options, **flags):
    """A copy of ``options`` (the flags given to them, unknown ones included) with ``flags`` set."""
    from apache_beam.options.pipeline_options import PipelineOptions
    return PipelineOptions.from_dictionary(
        {**options.get_all_options(drop_default=True, retain_unknown_options=True), **flags})


def runner_for(options):
    """``(runner, options)`` to run a pipeline with.

    Any runner named by ``--runner`` other than the DirectRunner: ``(None, options)``, Beam's choice.
    The DirectRunner: its batch engine, Beam's ``FnApiRunner``, set up as the DirectRunner sets it up
    (the pipeline options provisioned to its workers). Beam 2.78's DirectRunner would first try Prism,
    a binary it downloads from GitHub on first use; that would make the engine of a "DirectRunner" run
    depend on the network. In ``multi_processing`` mode the workers are :data:`WORKER_COMMAND`, or with
    ``--environment_type EXTERNAL --environment_config HOST:PORT`` the worker pool there (a training
    run's warm workers, :mod:`pipelines.beam.warm_workers`). Then the runner gets a copy of ``options``
    whose running mode no longer overrides that environment (``--direct_num_workers`` stands; the
    workers still see the options as given), and the engine's gRPC servers for those workers listen on
    the loopback interface only (:mod:`pipelines.executors.beam_loopback`; Beam binds all interfaces).
    """
    from apache_beam.options.pipeline_options import DirectOptions, PortableOptions
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle
    from apache_beam.transforms.environments import ExternalEnvironment, SubprocessSDKEnvironment
    if not is_direct_runner(options):
        return None, options
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(
        pipeline_options=JobServiceHandle.encode_pipeline_options(options.get_all_options())))
    portable = options.view_as(PortableOptions)
    if portable.environment_type == "EXTERNAL":      # a worker pool's address (pipelines.beam.warm_workers)
        environment = ExternalEnvironment(portable.environment_config)
    elif options.view_as(DirectOptions).direct_running_mode == "multi_processing":
        environment = SubprocessSDKEnvironment.from_command_string(WORKER_COMMAND)
    else:
        return fn_runner.FnApiRunner(provision_info=provision), options
    from pipelines.executors import beam_loopback
    beam_loopback.install()     # its servers for these workers: loopback only, not Beam's [::]
    engine = fn_runner.FnApiRunner(default_environment=environment, provision_info=provision)
    # FnApiRunner's default running mode, so that the environment above stands:
    return engine, with_flags(options, direct_running_mode="in_memory")


def run_pipeline(build: Callable, options) -> None:
    """Build a pipeline with ``build(pipeline)`` and run it to completion (on :func:`runner_for`'s runner)."""
    import apache_beam as beam
    logging.getLogger("apache_beam").setLevel(logging.ERROR)   # worker start-up chatter, per round
    runner, options = runner_for(options)
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        build(pipeline)


def _reduce_and_write(results: List[Any], reduce: Callable, url: str) -> None:
    import json

    import fsspec
    with fsspec.open(url, "w") as f:
        json.dump(reduce(results), f)


class BeamExecutor:
    """Dataset passes as Beam pipelines (the executor protocol's ``map_reduce`` and ``close``).

    Pass results travel through ``--temp_location`` (a URL the workers and
    this process both reach; a temporary folder here for a local runner).
    """

    name = "beam"

    def __init__(self, pipeline_args: Optional[Sequence[str]] = None):
        from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions
        from core.dataset.errors import DatasetError
        self.options = PipelineOptions(list(pipeline_args or []))
        # The plain DirectRunner runs passes in this process (memory:// stores are visible to them).
        self.in_process = (runner_name(list(pipeline_args or [])) in ("DirectRunner", "direct")
                           and self.options.view_as(DirectOptions).direct_running_mode != "multi_processing")
        self.temp = self.options.view_as(GoogleCloudOptions).temp_location
        self._local_temp = None
        if not self.temp:
            if not is_local_runner(list(pipeline_args or [])):
                raise DatasetError(f"Beam runner {runner_name(list(pipeline_args or []))} needs --temp_location (a URL"
                                   " its workers and this process can both reach, e.g. gs://bucket/tmp) for pass results")
            self._local_temp = tempfile.mkdtemp(prefix="databloom-beam-")
            self.temp = self._local_temp

    def map_reduce(self, label: str, fn: Callable, items: Sequence[Any], reduce: Callable) -> Any:
        """One pass: ``fn`` per item on the workers, ``reduce`` once, its JSON read back here."""
        import json

        import apache_beam as beam
        import fsspec
        from pipelines.executors.common import json_round_trip
        url = f"{self.temp.rstrip('/')}/{label}-{uuid.uuid4().hex}.json"
        runner, options = runner_for(self.options)
        with beam.Pipeline(runner=runner, options=options) as p:
            _ = (p
                 | "CreateItems" >> beam.Create(list(items))
                 | "Reshuffle" >> beam.Reshuffle()  # to prevent fusion: spread shards over workers
                 | f"Map-{label}" >> beam.Map(fn)
                 | "Gather" >> beam.combiners.ToList()
                 | "ReduceAndWrite" >> beam.Map(_reduce_and_write, reduce, url))
        fs, path = fsspec.core.url_to_fs(url)
        try:
            with fs.open(path) as f:
                return json_round_trip(json.load(f))
        finally:
            fs.rm(path)

    def close(self) -> None:
        if self._local_temp:
            import shutil
            shutil.rmtree(self._local_temp, ignore_errors=True)
