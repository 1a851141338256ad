"""Training with ``--executor beam``: the entry point, a run as rounds of Beam pipelines.

:func:`train_in_rounds` runs a training run as round pipelines of the
plan's blocks (:mod:`pipelines.beam.launcher` submits them,
:mod:`pipelines.beam.graph` builds them of the stages in
:mod:`pipelines.beam.blocks`, :mod:`pipelines.beam.learner` is
their learner stage). Local, Dask and Beam run the same
:mod:`pipelines.run.plan` schedule, so a config and seed give bit-identical
learner parameters and committed replay on all of them
(tests/pipelines/test_beam_identity.py).

Reproducibility, in detail: a Beam round holds ``blocks_per_round``
consecutive plan blocks; block ``b``'s tasks are ``plan.tasks(b)`` into shard
``s<b>``, acting with the version published after learner block
``b - 1 - policy_lag`` (one version per ``broadcast_period`` learner steps,
as the driver publishes them); actors keep their env state from task to task
(pipeline data within a round, ``core.actor_state`` documents across
rounds); the learner trains the plan's ``steps_per_call`` calls with
``sampler_rng(b)`` from its exact state after block ``b - 1``; evaluation
blocks, seeds, the stop rule (``STOP_DELAY``), best-version keeping and
checkpoint cadence are the driver's.

Example::

    summary = train_in_rounds(cfg, "gs://bucket/runs/a",
                              ["--runner", "DataflowRunner", "--project", "p", "--region", "us-central1",
                               "--temp_location", "gs://bucket/tmp", "--setup_file", "./setup.py",
                               "--blocks_per_round", "8"])
"""
from __future__ import annotations

import os
from typing import Any, Dict, Sequence

from core import urls
from pipelines.beam.launcher import RoundLauncher
from pipelines.beam.options import blocks_per_round_arg
from pipelines.executors import beam as beam_executor
from pipelines.executors.common import thread_env


def train_in_rounds(cfg, run_dir: str, pipeline_args: Sequence[str], progress: bool = True,
                    resume: bool = False) -> Dict[str, Any]:
    """Train ``cfg`` as rounds of Beam pipelines into ``run_dir``; returns the summary (see driver)."""
    run_dir = urls.normalize(run_dir)
    pipeline_args, blocks_per_round = blocks_per_round_arg(pipeline_args)
    options = beam_executor.pipeline_options(pipeline_args, run_dir)   # rejects bad runner/run dir first
    if beam_executor.is_local_runner(pipeline_args):
        for k, v in thread_env(cfg).items():   # inherited by DirectRunner worker processes
            os.environ.setdefault(k, v)
    return RoundLauncher(cfg, run_dir, options, progress, resume, blocks_per_round).run()
