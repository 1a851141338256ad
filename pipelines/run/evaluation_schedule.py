"""The evaluation schedule of a training run: evaluations planned, submitted as executor tasks, decided in block order.

:class:`EvaluationSteps` is the part of :class:`pipelines.run.driver.Trainer`
that evaluates policy versions (a mixin, like :class:`pipelines.run.block_tasks.BlockTasks`)::

    learner block b ends, rows cross eval.every_env_steps -> _evaluate: an evaluation task of the
                                                             newest version, seeds from its number n
    block c is about to commit        -> BlockTasks._stop_decided hands each evaluation of a block
                                         <= c - STOP_DELAY, in order, to _on_evaluation: log it,
                                         keep the best version (the stage's best/ checkpoint), stop?
    --resume                          -> _resume_evaluations: the checkpoint's undecided evaluations
                                         again, same versions and seeds (pipelines.run.resume)

Seeds depend only on the evaluation's number, so every executor evaluates
the same episodes and the stop falls on the same block. Each evaluation task
is :func:`core.policy_evaluation.run_evaluation_task` (the function that
evaluates a policy); the ``python -m pipelines.evaluate`` tool evaluates a
finished run's policy.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, Optional

from pipelines.run import stages
from pipelines.run import summary as summary_lib
from pipelines.run.flight import Flight


def evaluation_args(cfg, n: int, selector: str) -> tuple:
    """``run_evaluation_task(payload, *evaluation_args(cfg, n, selector))``: evaluation number ``n``.

    Its seeds depend only on ``n``, so every executor (driver, Beam rounds,
    offline training) plays the same episodes for the same evaluation.
    """
    return (cfg.env.id, cfg.eval.episodes, cfg.seed + 100_000 + 1_000 * n, cfg.env.max_episode_steps, selector,
            cfg.eval.target_return, cfg.eval.confirm_episodes, False, getattr(cfg.agent, "frame_stack", 1))


def decide_evaluation(cfg, loop, result: Dict[str, Any], save_best: Callable[[int, Dict[str, Any]], None]) -> bool:
    """Keep ``result``'s version if it is the best so far, note the target; True = stop (target reached).

    Versions are ranked by the confirmed mean when there is one (see
    ``run_evaluation_task``), so the kept policy is the most trustworthy;
    ``save_best(version, result)`` stores the new best version's parameters.
    """
    score = summary_lib.evaluation_score(result)
    if score > loop.best_return:
        loop.best_return, loop.best_version = score, int(result["version"])
        save_best(int(result["version"]), result)
    return summary_lib.record_target(cfg, loop, result)


class EvaluationSteps:
    """Evaluation steps of ``Trainer`` (a mixin: they share the run's state)."""

    def _evaluate(self, f: Flight, block: int, env_steps: int, ref=None, version: Optional[int] = None,
                  n: Optional[int] = None, retry: int = 0) -> None:
        """Submit an evaluation planned after learner block ``block`` (default: of the newest version)."""
        ref = self.payload_ref if ref is None else ref
        version = self.loop.policy_version if version is None else version
        fut = self._submit_evaluation(ref, version, n, retry)
        f.evals.append((block, fut, env_steps))
        f.eval_submitted[fut] = time.time()   # an evaluation's seconds count in the stall bound
        f.eval_meta[fut] = (version, self.n_evals if n is None else n)
        f.eval_ref[fut] = ref

    def _resubmit_lost_evaluation(self, f: Flight) -> None:
        """The oldest evaluation was cancelled (Dask lost its inputs with a worker): submit it again.

        Same version, same number, so the same seeds; its payload is
        published again if it was lost too. It stays first in line, so the
        stop is decided in the same order. At most ``MAX_BLOCK_RETRIES`` times.
        """
        from pipelines.run.block_tasks import MAX_BLOCK_RETRIES
        from pipelines.run.flight import StallError
        block, fut, steps = f.evals.popleft()
        (version, n), ref = f.eval_meta.pop(fut), f.eval_ref.pop(fut)
        f.eval_submitted.pop(fut, None)
        f.retries += 1
        f.eval_retries[n] = f.eval_retries.get(n, 0) + 1
        if f.eval_retries[n] > MAX_BLOCK_RETRIES:    # never spin: each retry was cancelled at once
            raise StallError(f"evaluation {n} (policy version {version}) was lost {MAX_BLOCK_RETRIES} times; "
                             f"valid: a cluster whose workers stay up")
        self.log.write("task_lost", step=self.loop.env_steps, task=f"evaluation {n} of version {version}")
        if getattr(ref, "cancelled", lambda: False)():
            ref = self._republish(f, ref, version)      # BlockTasks: the blocks that act with it get it too
        self._evaluate(f, block, steps, ref, version, n, retry=f.retries)
        f.evals.appendleft(f.evals.pop())

    def _resume_evaluations(self, f: Flight) -> None:
        """Resume: submit again, in order, the evaluations the checkpoint left undecided (same seeds)."""
        for block, version, env_steps, n in self.loop.pending_evals:
            self._evaluate(f, block, env_steps, self.restored_eval_refs[version], version, n)
        self.loop.pending_evals = []

    def _submit_evaluation(self, ref, version: int, n: Optional[int] = None, retry: int = 0):
        """Evaluate ``version`` (payload ``ref``) as evaluation number ``n`` (default: the next one)."""
        if n is None:
            self.n_evals += 1
            n = self.n_evals
        self.eval_versions.add(version)
        args = evaluation_args(self.cfg, n, self.builder.action_selector)
        return self.executor.submit(stages.run_evaluation_task, ref, *args,
                                    key=f"eval-{self.run_id}-{n}" + (f"-r{retry}" if retry else ""))

    def _on_evaluation(self, result: Dict[str, Any], start: float, env_steps: Optional[int] = None) -> bool:
        """Log an evaluation and decide it (:func:`decide_evaluation`); True = stop (target reached).

        ``env_steps``: the committed env steps the evaluation was planned at.
        """
        if env_steps is not None:
            result = {**result, "env_steps": int(env_steps)}
        self.eval_versions.discard(result["version"])
        summary_lib.log_evaluation(self.log, self.loop, result)
        return decide_evaluation(self.cfg, self.loop, result,
                                 lambda version, r: self.stage.run("save_best", version, json.dumps(r)))
