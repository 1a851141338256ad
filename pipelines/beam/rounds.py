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
    show_rounds(cfg, ["--runner", "DataflowRunner", "--round_startup_s", "180"])   # the plan only, prints
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence, Tuple

from core import urls
from pipelines.beam.launcher import RoundLauncher
from pipelines.beam.options import round_options
from pipelines.beam.round_size import describe, size_rounds
from pipelines.beam.warm_workers import warm_options
from pipelines.executors import beam as beam_executor
from pipelines.executors.common import thread_env


def train_in_rounds(cfg, run_dir: str, pipeline_args: Sequence[str], progress: bool = True,
                    resume: bool = False) -> Dict[str, Any]:
    """Train ``cfg`` as rounds of Beam pipelines into ``run_dir``; returns the summary (see driver)."""
    run_dir = urls.normalize(run_dir)
    pipeline_args, ours = round_options(pipeline_args)
    # A round is one element (one worker runs its blocks in order: pipelines.beam.graph), so the
    # DirectRunner needs one worker process, not one per core (each costs start-up; --direct_num_workers wins).
    options = beam_executor.pipeline_options(pipeline_args, run_dir, num_workers=1)   # rejects bad runner/run dir
    if beam_executor.is_local_runner(pipeline_args):
        for k, v in thread_env(cfg).items():   # inherited by DirectRunner worker processes
            os.environ.setdefault(k, v)
    sizing = size_rounds(cfg, beam_executor.runner_name(pipeline_args), ours.startup_s, ours.blocks_per_round)
    with warm_options(options) as options:     # the DirectRunner's rounds: warm worker processes
        return RoundLauncher(cfg, run_dir, options, progress, resume, sizing,
                             startup_given=ours.startup_s is not None).run()


def show_rounds(cfg, pipeline_args: Sequence[str], out=None) -> int:
    """``--show-rounds``: print the round plan (and, for Dataflow, the largest round's job request size
    from a dry run); submits nothing, needs no credentials, writes nothing. Returns exit status 0."""
    import sys
    out = out or sys.stdout
    args, ours = round_options(pipeline_args)
    runner = beam_executor.runner_name(args)
    sizing = size_rounds(cfg, runner, ours.startup_s, ours.blocks_per_round)
    print(describe(sizing, runner), file=out)
    rounds = launcher_rounds(cfg, sizing)
    print(f"launcher: {len(rounds)} job{'s' if len(rounds) != 1 else ''} of "
          f"{max(b - a + 1 for a, b in rounds)} blocks at most", file=out)
    if not beam_executor.is_local_runner(args):
        size = dataflow_request_bytes(cfg, sizing.blocks_per_round)
        print(f"largest round ({sizing.blocks_per_round} blocks), Dataflow dry run: " +
              (f"job request {size[0]:,} bytes + pipeline proto {size[1]:,} bytes (limit ~10 MB)" if size
               else "not measured (needs apache-beam[gcp])"), file=out)
    return 0


def launcher_rounds(cfg, sizing) -> List[Tuple[int, int]]:
    """``[(first block, last block)]`` of every round the launcher submits when no round is measured (the
    start-up given, each block at the cost model's estimate): :class:`RoundLauncher`'s own sizing, block
    after block, so the count is the jobs the plan announces only if the launcher follows the plan."""
    launcher = RoundLauncher(cfg, "gs://databloom-dry-run/runs/show-rounds", None, False, False, sizing,
                             startup_given=True)
    rounds: List[Tuple[int, int]] = []
    launcher.next_block = 0
    while launcher.next_block < launcher.plan.num_blocks:
        last = min(launcher.next_block + launcher._round_blocks(), launcher.plan.num_blocks) - 1
        rounds.append((launcher.next_block, last))
        launcher.next_block = last + 1
    return rounds


def dataflow_request_bytes(cfg, blocks: int, first: int = 0) -> Any:
    """``(job request JSON bytes, pipeline proto bytes)`` of the round of blocks ``first .. first + blocks - 1``
    on Dataflow (a ``--dry_run``: nothing is submitted, no credentials), or None without the
    ``apache-beam[gcp]`` extras."""
    try:
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
    except ImportError:
        return None
    import apache_beam as beam
    from core.agents.registry import get_builder
    from pipelines.beam.blocks import BlockRun
    from pipelines.run import setup as run_setup
    from pipelines.beam.graph import build_block_round
    run_dir = "gs://databloom-dry-run/runs/show-rounds"
    options = beam_executor.pipeline_options(
        ["--runner", "DataflowRunner", "--project", "dry-run", "--region", "us-central1", "--temp_location",
         "gs://databloom-dry-run/tmp", "--dry_run=True", "--no_auth", "--sdk_location=container",
         "--sdk_container_image", "dry-run"], run_dir)
    specs = tuple(run_setup.actor_specs(cfg, run_setup.run_id(cfg), get_builder(cfg.agent.algo).action_selector))
    pipeline = beam.Pipeline(runner=DataflowRunner(), options=options)
    build_block_round(pipeline, BlockRun(cfg, run_dir, specs), 0, first, first + blocks - 1)
    job = pipeline.run().job
    return len(job.json()), len(job.proto_pipeline.SerializeToString())
