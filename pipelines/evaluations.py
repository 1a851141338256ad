"""Evaluations of a training run: planned, submitted as executor tasks, decided in block order.

:class:`EvaluationSteps` is the part of :class:`pipelines.driver.Trainer`
that evaluates policy versions (a mixin, like :class:`pipelines.block_tasks.BlockTasks`)::

    learner block b ends, rows cross eval.every_env_steps -> _evaluate: an evaluation task of the
                                                             newest version, seeds from its number n
    block c is about to commit        -> BlockTasks._stop_decided hands each evaluation of a block
                                         <= c - STOP_DELAY, in order, to _on_evaluation: log it,
                                         keep the best version (the stage's best/ checkpoint), stop?
    --resume                          -> _resume_evaluations: the checkpoint's undecided evaluations
                                         again, same versions and seeds (pipelines.resume)

Seeds depend only on the evaluation's number, so every executor evaluates
the same episodes and the stop falls on the same block.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional

from pipelines import stages
from pipelines import summary as summary_lib
from pipelines.flight import Flight


class EvaluationSteps:
    """Evaluation steps of ``Trainer`` (a mixin: they share the run's state)."""

    def _evaluate(self, f: Flight, block: int, env_steps: int, ref=None, version: Optional[int] = None,
                  n: Optional[int] = None) -> None:
        """Submit an evaluation planned after learner block ``block`` (default: of the newest version)."""
        fut = self._submit_evaluation(ref, version, n)
        f.evals.append((block, fut, env_steps))
        f.eval_submitted[fut] = time.time()   # an evaluation's seconds count in the stall bound
        f.eval_meta[fut] = (self.loop.policy_version if version is None else version, self.n_evals if n is None else n)

    def _resume_evaluations(self, f: Flight) -> None:
        """Resume: submit again, in order, the evaluations the checkpoint left undecided (same seeds)."""
        for block, version, env_steps, n in self.loop.pending_evals:
            self._evaluate(f, block, env_steps, self.restored_eval_refs[version], version, n)
        self.loop.pending_evals = []

    def _submit_evaluation(self, ref=None, version: Optional[int] = None, n: Optional[int] = None):
        """Evaluate ``version`` (default: the newest) as evaluation number ``n`` (default: the next one)."""
        cfg = self.cfg
        if n is None:
            self.n_evals += 1
            n = self.n_evals
        self.eval_versions.add(self.loop.policy_version if version is None else version)
        return self.executor.submit(
            stages.run_evaluation_task, self.payload_ref if ref is None else ref, cfg.env.id, cfg.eval.episodes,
            cfg.seed + 100_000 + 1_000 * n, cfg.env.max_episode_steps,
            self.builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes,
            keep_returns=False, frame_stack=getattr(cfg.agent, "frame_stack", 1),
            key=f"eval-{self.run_id}-{n}")

    def _on_evaluation(self, result: Dict[str, Any], start: float, env_steps: Optional[int] = None) -> bool:
        """Log an evaluation, keep the best version's parameters; True = stop (target reached).

        Versions are ranked by the confirmed mean when there is one (see
        ``run_evaluation_task``), so the kept policy is the most trustworthy.
        ``env_steps``: the committed env steps the evaluation was planned at.
        """
        cfg = self.cfg
        if env_steps is not None:
            result = {**result, "env_steps": int(env_steps)}
        score = summary_lib.evaluation_score(result)
        self.eval_versions.discard(result["version"])
        summary_lib.log_evaluation(self.log, self.loop, result)
        if score > self.loop.best_return:
            self.loop.best_return = score
            self.loop.best_version = result["version"]
            self.stage.run("save_best", result["version"], json.dumps(result))
        return summary_lib.record_target(cfg, self.loop, result)
