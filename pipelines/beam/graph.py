"""The Beam graph of one round: its plan blocks run in order by one stage, read top to bottom.

``--executor beam`` runs the same :class:`~pipelines.run.plan.TrainingPlan` as
local and Dask, so a config and seed give bit-identical learner parameters
and committed replay on all of them. A round pipeline holds blocks
``b0 .. b1`` and is three steps whatever its length::

    Round        beam.Create([round]): one element
    RunBlocks    run_blocks: per block b, in order, in one worker (the local executor's order):
                   RollOut   each actor's tasks of block b (plan.tasks), acting with the version
                             State(policy_block(b)) names (read by path, never in the graph), from
                             its state after block b-1 (in memory; at b0 the stored document,
                             core.actor_state)
                   Write     the block's results, actor-major -> uncommitted shard s<b>
                   Commit    the evaluations of blocks <= b - STOP_DELAY decide, in order (best
                             version, stop); no stop -> one commit entry for s<b>
                   Learn     LearnerStage.learn_block(b) from the exact state after b-1 (the learner
                             stays in memory: restored once, saved once, after b1), version,
                             evaluation due?, checkpoint cadence -> State(b)
                   Evaluate  on the plan's evaluation blocks
    RoundEnd     rounds/r<round>.json (what the launcher reads); after the run's last block (or a
                 stop): the driver's close -> rounds/final.json

Why one stage and not a step per block: a Dataflow job's start-up costs
minutes, so rounds hold hundreds of blocks (:mod:`pipelines.beam.round_size`),
and a step per block made the job request grow with the round (a 256-block
round was 5,412 transforms, 11.4 MB, over Dataflow's ~10 MB limit). Here the
graph is the same three steps for 1 block or 10,000. The price: a round's
actors do not fan out over workers (they never overlapped the learner on the
DirectRunner either: it ran one fused stage at a time); each step still
writes its durable record (:mod:`pipelines.beam.blocks`), so a retried
bundle redoes nothing that finished.

Example::

    beam_executor.run_pipeline(lambda p: build_block_round(p, run, round_index, first, last), options)
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

import apache_beam as beam

from core.stage_cpu import counted
from pipelines.beam.blocks import (BlockRun, commit_block, end_round, evaluate_block, finish_run, learn_block,
                                   load_actor, load_state, roll_block, write_block)


def run_blocks(_round: int, first: int, last: int, run: BlockRun) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """Blocks ``first .. last`` in order (module docstring): ``([State(b) for b in the round], timing)``;
    timing: ``work_s`` (the blocks' wall time) and ``learner_fixed_s`` (its build, restore and save parts)."""
    t0 = time.perf_counter()
    plan, evaluations = run.plan, run.evaluations()
    states: Dict[int, Dict[str, Any]] = {}
    # Each step's CPU under its own name (core.stage_cpu): the round's CPU by actor, write, commit, learner
    # and evaluation, as the driver's tasks record theirs (RunBlocks' own span covers them: counted once).
    load_state_, load_actor_, roll, write, commit, learn, evaluate = (
        counted(fn, run.cpu_sink) for fn in (load_state, load_actor, roll_block, write_block, commit_block,
                                             learn_block, evaluate_block))

    def state(b: int) -> Dict[str, Any]:
        """State(b): this round's, else the durable record (an earlier round's, or the start)."""
        if b not in states:
            states[b] = load_state_(b, run)
        return states[b]

    actors = [load_actor_(a, first, run) for a in range(len(run.actor_specs))]
    for b in range(first, last + 1):
        version_state = state(plan.policy_block(b))
        rolled = [roll(a, s, b, version_state, run, first, b == last) for a, s in enumerate(actors)]
        actors = [s for s, _ in rolled]
        info = write([results for _, results in rolled], b, run)
        committed = commit(state(b - 1), b, info, [], run)
        states[b] = learn(committed, b, run, save_state=b == last)
        if b in evaluations:
            evaluate(states[b], b, evaluations[b], run)
    from pipelines.beam.learner import take_fixed_seconds
    return [states[b] for b in range(first, last + 1)], {"work_s": round(time.perf_counter() - t0, 3),
                                                         "learner_fixed_s": take_fixed_seconds(run.cfg, run.run_dir)}


def build_block_round(pipeline, run: BlockRun, round_index: int, first: int, last: int) -> None:
    """Round ``round_index``: blocks ``first .. last`` (module docstring), top to bottom."""
    sink = run.cpu_sink
    (pipeline
     | "Round" >> beam.Create([round_index])
     | "RunBlocks" >> beam.Map(counted(run_blocks, sink), first, last, run)
     | "RoundEnd" >> beam.Map(counted(end_round, sink), round_index, run))


def build_finish(pipeline, run: BlockRun, block: int) -> None:
    """A pipeline of the run's close alone (a resumed run whose last block has no final record)."""
    (pipeline
     | "CreateFinal" >> beam.Create([block])
     | "State" >> beam.Map(counted(load_state, run.cpu_sink), run)
     | "Finish" >> beam.Map(counted(finish_run, run.cpu_sink), run))
