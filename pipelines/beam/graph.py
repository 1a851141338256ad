"""The Beam graph of one round: a chain of consecutive plan blocks, read top to bottom.

``--executor beam`` runs the same :class:`~pipelines.run.plan.TrainingPlan` as
local and Dask, so a config and seed give bit-identical learner parameters
and committed replay on all of them. A round pipeline holds blocks
``b0 .. b1`` (``blocks_per_round`` of them) as one chain::

    State(b) for b < b0     durable: blocks/b<b>-learn.json (Start for b = -1: version 1, the store)
    per block b:
      RollOut<b>            actor a's tasks of block b (plan.tasks), acting with the version of
                            State(policy_block(b)) (a side input; the payload is read by path), from
                            actor a's state after block b-1: pipeline data (RollOut<b-1>'s output),
                            at b0 the stored document blocks/actors/a<a>-t<task>.json (core.actor_state)
      Write<b>              the block's results, actor-major -> uncommitted shard s<b> (one writer)
      Commit<b>             after State(b-1): the evaluations of blocks <= b - STOP_DELAY decide,
                            in order (best version, stop); no stop -> one commit entry for s<b>
      Learn<b>              LearnerStage.learn_block(b) from the exact state after b-1
                            (pipelines.beam.learner), version, evaluation due?, checkpoint cadence
                            -> State(b)
      Evaluate<b>           on the plan's evaluation blocks, beside the next blocks' stages
    RoundEnd                rounds/r<round>.json (what the launcher reads); after the run's last
                            block (or a stop): the driver's close -> rounds/final.json

Each step is a named ``beam.Map`` over a stage function of :mod:`pipelines.beam.blocks`. The
graph has a fixed number of transforms per block, so its size grows with
``blocks_per_round``, never with the run length; the policy enters by path, never as bytes.

Example::

    beam_executor.run_pipeline(lambda p: build_block_round(p, run, round_index, first, last), options)
"""
from __future__ import annotations

from typing import Any, Dict

import apache_beam as beam

from core.stage_cpu import counted
from pipelines.beam.blocks import (BlockRun, commit_block, end_round, evaluate_block, finish_run, learn_block,
                                   load_actor, load_state, roll_block, write_block)


def build_block_round(pipeline, run: BlockRun, round_index: int, first: int, last: int) -> None:
    """Round ``round_index``: blocks ``first .. last`` as one chain (module docstring), top to bottom."""
    plan, sink = run.plan, run.cpu_sink
    evaluations = run.evaluations()
    states: Dict[int, Any] = {}     # block -> State(block) of this round (Learn<b>'s output)

    def state(b: int, use: str):
        """State(b): this round's Learn<b>, else the durable record, read on a worker by a root of
        its own per use (the FnApiRunner deadlocks when one root feeds a main input and, beside
        another root, a side input of a fused chain)."""
        if b in states:
            return states[b]
        return (pipeline | f"{use}Block{b}" >> beam.Create([b])
                | f"{use}State{b}" >> beam.Map(counted(load_state, sink), run))

    actors = (pipeline
              | "CreateActors" >> beam.Create(list(range(len(run.actor_specs))))
              | "Reshuffle" >> beam.Reshuffle()     # to prevent fusion: actors spread over workers
              | "LoadActors" >> beam.Map(counted(load_actor, sink), first, run))
    evals, learned = {}, []
    for b in range(first, last + 1):
        rolled = actors | f"RollOut{b}" >> beam.Map(counted(roll_block, sink), b,
                                                     beam.pvalue.AsSingleton(state(plan.policy_block(b), f"RollOut{b}")), run,
                                                     first, b == last)
        actors = rolled | f"Carry{b}" >> beam.Map(lambda t: (t[0], t[1]))
        info = (rolled
                | f"Results{b}" >> beam.Map(lambda t: t[2])
                | f"Gather{b}" >> beam.combiners.ToList()      # the block's shard has one writer
                | f"Write{b}" >> beam.Map(counted(write_block, sink), b, run))
        due = [e for e in evals if e <= plan.decides_stop_before(b)]
        decided = ([evals[e] for e in due] | f"Decided{b}" >> beam.Flatten()) if due else None
        committed = state(b - 1, "Chain") | f"Commit{b}" >> beam.Map(
            counted(commit_block, sink), b, beam.pvalue.AsSingleton(info),
            beam.pvalue.AsList(decided) if decided is not None else [], run)
        states[b] = committed | f"Learn{b}" >> beam.Map(counted(learn_block, sink), b, run)
        learned.append(states[b])
        if b in evaluations:
            evals[b] = states[b] | f"Evaluate{b}" >> beam.Map(counted(evaluate_block, sink), b, evaluations[b], run)
    everything = tuple(evals.values())
    all_evals = (everything | "Evaluations" >> beam.Flatten()) if everything else None
    (states[last]
     | "RoundEnd" >> beam.Map(counted(end_round, sink), round_index,
                              beam.pvalue.AsList(tuple(learned) | "Learned" >> beam.Flatten()),
                              beam.pvalue.AsList(all_evals) if all_evals is not None else [], run))


def build_finish(pipeline, run: BlockRun, block: int) -> None:
    """A pipeline of the run's close alone (a resumed run whose last block has no final record)."""
    (pipeline
     | "CreateFinal" >> beam.Create([block])
     | "State" >> beam.Map(counted(load_state, run.cpu_sink), run)
     | "Finish" >> beam.Map(counted(finish_run, run.cpu_sink), run))
