"""The plan's block rules, written once: what a commit records, when GC runs, what a learner block's end
decides (new version, evaluation, checkpoint).

Pure functions of the plan's counters, called by the Dask/local driver
(:mod:`pipelines.run.driver`) and by the Beam round's stages
(:mod:`pipelines.beam.blocks`), so the two cannot drift::

    commit of block c       -> commit_meta(c, version, episodes): the log entry's metadata
                               gc_due(log_version): GC after every 100th log version
    learner block b starts  -> version_due(...): does it end with a new policy version?
    learner block b ends    -> learn_end(...): evaluation due (and the next threshold), checkpoint due
    the whole plan          -> evaluation_blocks(plan, every): {block: n}, learn_end's evaluations
                               numbered 1, 2, ... from block 0 (Beam seeds evaluation n from it);
                               evaluation_state(plan, every, b): (n_evals, next_eval) after block b

Example::

    end = learn_end(env_steps=4096, learner_steps=2048, next_eval=4000, last_ckpt_step=1024,
                    eval_every=4000, checkpoint_every=1000)
    end.evaluate, end.next_eval, end.checkpoint        # True, 8000, True
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Tuple

#: The commit log is garbage-collected after every commit whose log version is a multiple of this.
GC_EVERY_LOG_VERSIONS = 100


def commit_meta(block: int, policy_version: int, episodes: int) -> Dict[str, Any]:
    """The metadata of block ``block``'s commit-log entry: the version its tasks acted with, the block, and
    its finished episodes (what a resume's counters read back, :func:`pipelines.run.resume.committed_episodes`)."""
    return {"policy_version": int(policy_version), "block": int(block), "episodes": int(episodes)}


def gc_due(log_version: int) -> bool:
    """Whether the commit that made ``log_version`` is followed by a GC (keeps removed shard data bounded)."""
    return log_version % GC_EVERY_LOG_VERSIONS == 0


def version_due(learner_steps: int, target: int, last_broadcast_step: int, broadcast_period: int) -> bool:
    """Whether the learner block that trains to ``target`` (from ``learner_steps``) ends with a new version."""
    return max(learner_steps, target) - last_broadcast_step >= broadcast_period


def checkpoint_due(learner_steps: int, last_ckpt_step: int, checkpoint_every: int) -> bool:
    """Whether a learner block that ended at ``learner_steps`` is followed by a checkpoint."""
    return learner_steps - last_ckpt_step >= checkpoint_every


@dataclasses.dataclass(frozen=True)
class LearnEnd:
    """What the end of a learner block decides."""
    evaluate: bool      # submit an evaluation of the newest version
    next_eval: int      # the env steps the next evaluation waits for
    checkpoint: bool    # write a checkpoint now


def learn_end(env_steps: int, learner_steps: int, next_eval: int, last_ckpt_step: int, eval_every: int,
              checkpoint_every: int) -> LearnEnd:
    """After a learner block: the committed ``env_steps`` reached ``next_eval`` once the learner has stepped
    -> an evaluation, and the next threshold is the following multiple of ``eval_every``; ``checkpoint_every``
    learner steps since the last checkpoint -> a checkpoint."""
    evaluate = env_steps >= next_eval and learner_steps > 0
    if evaluate:
        next_eval = (env_steps // eval_every + 1) * eval_every
    return LearnEnd(evaluate, next_eval, checkpoint_due(learner_steps, last_ckpt_step, checkpoint_every))


def _evaluation_ends(plan, eval_every: int):
    """``(block, n, next_eval)`` after each learner block of ``plan`` from block 0: :func:`learn_end`'s
    evaluations on the plan's rows and learner steps (``n``: evaluations submitted so far)."""
    n, next_eval = 0, eval_every
    for b in range(plan.num_blocks):
        rows = plan.rows_through(b)
        end = learn_end(rows, plan.learner_target(rows), next_eval, 0, eval_every, 1)
        if end.evaluate:
            n, next_eval = n + 1, end.next_eval
        yield b, end.evaluate, n, next_eval


def evaluation_blocks(plan, eval_every: int) -> Dict[int, int]:
    """``{block: n}``: the blocks of ``plan`` whose end submits the run's ``n``-th evaluation (n = 1, 2, ...),
    by :func:`learn_end` on the plan's rows and learner steps from block 0 (the first threshold: ``eval_every``)."""
    return {b: n for b, evaluate, n, _ in _evaluation_ends(plan, eval_every) if evaluate}


def evaluation_state(plan, eval_every: int, block: int) -> Tuple[int, int]:
    """``(n_evals, next_eval)`` after learner block ``block`` of ``plan``: the evaluations submitted so far and
    the env steps the next one waits for (what the driver's checkpoint records, pipelines.run.resume)."""
    out = (0, eval_every)
    for b, _, n, next_eval in _evaluation_ends(plan, eval_every):
        if b > block:
            break
        out = (n, next_eval)
    return out
