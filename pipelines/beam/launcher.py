"""The Beam launcher: submits one round pipeline of plan blocks after another, reads their JSON.

It holds no learner and imports neither TensorFlow nor LiteRT (the learner
is the rounds' ``Learn`` stages, :mod:`pipelines.beam.learner`), so it can
run anywhere that reaches the run directory and the runner::

    setup   : a new run's config.json, or (--resume) the newest rounds/r<round>.json
    round r : blocks b0 .. b0 + n - 1 of the plan (pipelines.run.plan; n: see "Round size")
              -> one pipeline (pipelines.beam.graph.build_block_round)
              -> the round's worker appends each block's commit, learner and broadcast records
                 to metrics.jsonl (the launcher closes its logger while a round runs)
              -> rounds/r<r>.json: the round's totals and counters, evaluations decided, version
                 published (a few hundred bytes whatever the round's length)
              -> metrics.jsonl (eval, round), progress bar
    finish  : rounds/final.json (written by the round that ends the run; else one Finish pipeline)
              -> summary.json

Round size: before every round the launcher sizes it so that job start-up
stays within 10% of the run's wall time (:mod:`pipelines.beam.round_size`),
from the start-up and per-block cost measured in the previous round (the
first round: the runner's default start-up and the cost model's estimate);
``--blocks_per_round N`` fixes it instead. A round's job graph is three steps
whatever its length (:mod:`pipelines.beam.graph`), so no round is too large
to submit.

Planned stop: SIGTERM or Ctrl-C (SIGINT) while rounds run lets the current round finish, logs
``stopped`` and raises KeyboardInterrupt (the CLI's one line, exit 130); ``--resume`` then continues
from the next block, bit-identically. A second signal raises KeyboardInterrupt at once: the round in
flight is lost as a crash loses it (its finished blocks' records stay, so --resume redoes none of them).

Resume: the rounds' records say which blocks are done; every block's
learner state, actor states and stage records are durable (pipelines.beam.blocks),
so ``--resume`` (or a re-run after a crash) continues exactly where the last
finished round ended, bit-identically to an uninterrupted Beam run.

Example::

    RoundLauncher(cfg, "gs://bucket/runs/a", pipeline_options(args, run_dir), progress=True,
                  resume=False).run()      # usually through pipelines.beam.rounds.train_in_rounds
"""
from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from core import config as config_lib
from core import urls
from pipelines.beam import policy_files
from pipelines.beam.blocks import BlockRun
from pipelines.beam.graph import build_block_round, build_finish
from pipelines.beam.records import final_path, round_indices, round_path
from pipelines.beam.round_size import RoundSizing, blocks_per_round
from pipelines.run.energy import stage_cpu_sink
from pipelines.run import setup as run_setup
from pipelines.run.plan import TrainingPlan

@contextlib.contextmanager
def stop_after_round():
    """SIGTERM and SIGINT set the yielded request (a list: the signal names); a second one raises
    KeyboardInterrupt at once. Main thread only (elsewhere no handler can be installed: never set)."""
    request: List[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame) -> None:
        request.append(signal.Signals(signum).name)
        if len(request) > 1:
            raise KeyboardInterrupt(request[-1])

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield request
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class RoundLauncher:
    """Submits round pipelines until the plan's last block or a planned stop; see module docstring."""

    def __init__(self, cfg, run_dir: str, options, progress: bool, resume: bool, sizing: RoundSizing,
                 startup_given: bool = False):
        self.cfg, self.run_dir, self.options = cfg, run_dir, options
        self.progress, self.resume, self.sizing = progress, resume, sizing
        # What sizes the next round: the defaults until a round is measured (a given start-up holds).
        self.startup_s, self.block_s, self.startup_given = sizing.startup_s, sizing.block_s, startup_given
        self.run_id = run_setup.run_id(cfg)
        self.driver_bytes_in = self.trajectory_bytes = 0
        self.plan = TrainingPlan.from_config(cfg)

    # -- setup ---------------------------------------------------------------------------------
    def _setup(self) -> None:
        from core.agents.registry import get_builder
        from pipelines.run.flight import LoopState
        from pipelines.run.summary import process_start
        cfg = self.cfg
        fs, path = urls.resolve(self.run_dir)
        run_setup.check_run_dir(self.run_dir, self.resume, resume_needs_config=True)
        fs.makedirs(path, exist_ok=True)
        run_setup.write_config(self.run_dir, cfg, self.resume)
        self.next_round, last = self._last_round()
        self.last: Optional[Dict[str, Any]] = last
        self.next_block = last["last_block"] + 1 if last else 0
        self.loop = LoopState(next_task=[0] * cfg.actors.num_actors)
        self.learner_steps = 0
        if last:
            self._counters(last)
        self.log = self._logger()
        self.log.write("config", step=self.loop.env_steps, config=config_lib.to_dict(cfg))
        self.log.write("placement", step=self.loop.env_steps, executor="beam",
                       learner="Beam stage RunBlocks (a runner worker; blocks/b*-learn.json names it)",
                       actors={str(a): "Beam stage RunBlocks (the learner's worker, in block order)"
                               for a in range(cfg.actors.num_actors)})
        builder = get_builder(cfg.agent.algo)   # the registry imports no TensorFlow
        self.specs = tuple(run_setup.actor_specs(cfg, self.run_id, builder.action_selector))
        self.started_at = process_start()

    def _logger(self):
        from core.metrics import MetricsLogger
        return MetricsLogger(self.run_dir, tensorboard=False)   # TensorBoard would import TensorFlow

    def _last_round(self) -> Tuple[int, Optional[Dict[str, Any]]]:
        """(next round index, the newest round record or None); names are validated before use."""
        rounds = round_indices(self.run_dir)
        if not rounds:
            return 0, None
        r = max(rounds)
        record = self._read(round_path(self.run_dir, r), f"round {r}")
        if record.get("round") != r or not isinstance(record.get("last_block"), int):
            raise ValueError(f"{round_path(self.run_dir, r)[1]}: not the record of round {r}")
        return r + 1, record

    def _read(self, where: Tuple[Any, str], what: str) -> Dict[str, Any]:
        """A record the pipeline must have written; counted as bytes the launcher received."""
        fs, path = where
        if not fs.exists(path):
            raise RuntimeError(f"{what}: the pipeline finished but wrote no record {path}")
        with fs.open(path) as f:
            text = f.read()
        self.driver_bytes_in += len(text)    # what the launcher receives: JSON metadata, never trajectories
        return json.loads(text)

    # -- rounds --------------------------------------------------------------------------------
    def _counters(self, record: Dict[str, Any]) -> None:
        """The loop counters a round record carries (progress and log steps; the summary's are final's)."""
        for key in ("env_steps", "episodes", "policy_version", "best_return", "best_version"):
            setattr(self.loop, key, record[key])
        self.learner_steps = int(record["learner_steps"])

    def _done(self) -> bool:
        return self.next_block >= self.plan.num_blocks or bool(self.last and self.last["stop"])

    def run(self) -> Dict[str, Any]:
        from pipelines.run.energy import start_run_tracker
        from pipelines.executors import beam as beam_executor
        self._setup()
        self.energy = start_run_tracker(self.cfg, self.run_dir, None)   # launcher + DirectRunner worker processes
        self.run_spec = BlockRun(self.cfg, self.run_dir, self.specs, self.started_at, stage_cpu_sink(self.energy))
        start = time.time()
        self.lags: List[Tuple[int, float]] = []
        self.recent: List[float] = []
        bar = self._progress_bar()
        with stop_after_round() as stop:
            while not self._done():
                r, first = self.next_round, self.next_block
                last = min(first + self._round_blocks(), self.plan.num_blocks) - 1
                t0 = time.time()
                self.log.close()      # the round's worker appends its blocks' records meanwhile
                try:
                    beam_executor.run_pipeline(lambda p: build_block_round(p, self.run_spec, r, first, last),
                                               self.options)
                finally:
                    self.log = self._logger()
                record = self._read(round_path(self.run_dir, r), f"round {r}")
                self._account(record, time.time() - t0)
                self.next_round, self.next_block = r + 1, record["last_block"] + 1
                if bar is not None:
                    bar.update(last - first + 1)
                    bar.set_postfix(self._postfix(start), refresh=False)
                if stop and not self._done():
                    self._stop(stop[0], bar)
        if bar is not None:
            bar.close()
        return self._finish(start)

    def _stop(self, signal_name: str, bar) -> None:
        """The planned stop after a round (module docstring): ``stopped`` logged, KeyboardInterrupt."""
        from pipelines.run.energy import stop_run_tracker
        if bar is not None:
            bar.close()
        self.log.write("stopped", step=self.loop.env_steps, signal=signal_name, learner_steps=self.learner_steps,
                       block=self.next_block)
        self.log.close()
        stop_run_tracker(self.energy)
        raise KeyboardInterrupt(signal_name)

    def _round_blocks(self) -> int:
        """The next round's blocks: ``--blocks_per_round``, else the start-up rule on the blocks left."""
        if self.sizing.chosen == "--blocks_per_round":
            return self.sizing.blocks_per_round
        return blocks_per_round(self.plan.num_blocks - self.next_block, self.block_s, self.startup_s)

    def _measure(self, record: Dict[str, Any], pipeline_s: float) -> None:
        """Per-block cost and job start-up as the round just measured them (the learner's build, restore
        and save count as start-up: a round pays them once whatever its length)."""
        blocks = record["last_block"] - record["first_block"] + 1
        fixed = sum((record.get("learner_fixed_s") or {}).values())
        work = max(float(record.get("work_s") or 0.0) - fixed, 0.0)
        if work > 0:
            self.block_s = work / blocks
        if not self.startup_given:
            self.startup_s = max(pipeline_s - work, 0.0)

    def _account(self, record: Dict[str, Any], pipeline_s: float) -> None:
        """metrics.jsonl records of a round (its blocks' records are the worker's: records.log_block_metrics)."""
        from pipelines.run import summary as summary_lib
        self.last = record
        self._counters(record)
        for result in record["evaluated"]:
            summary_lib.log_evaluation(self.log, self.loop, result)
        commit = record["commit"]
        self.trajectory_bytes += int(commit["raw_bytes"])
        self.recent = (self.recent + commit["returns_tail"])[-20:]
        lag_sum, lag_n = record["lag_versions"]
        self.lags += [(lag_sum / lag_n, 0.0)] * lag_n if lag_n else []
        self._measure(record, pipeline_s)
        self.log.write("round", step=self.loop.env_steps, round=record["round"], first_block=record["first_block"],
                       last_block=record["last_block"], pipeline_s=pipeline_s, learn_s=record["learn_s"],
                       work_s=record.get("work_s"), learner_fixed_s=record.get("learner_fixed_s"),
                       startup_s=round(self.startup_s, 3), block_s=round(self.block_s, 4),
                       learner_steps=self.learner_steps, learner_workers=record["learner_workers"])

    # -- end of run ------------------------------------------------------------------------------
    def _finish(self, start: float) -> Dict[str, Any]:
        """The run's close as a pipeline stage (if no round did it), then the summary from JSON records."""
        from core.replay import ReplayStore
        from pipelines.run import summary as summary_lib
        from pipelines.run.energy import stop_run_tracker
        from pipelines.executors import beam as beam_executor
        from pipelines.run.flight import LoopState
        wall = time.time() - start
        fs, path = final_path(self.run_dir)
        final = self._read((fs, path), "final") if fs.exists(path) else None
        closes = (self.last["learned_through"], self.plan.num_blocks)
        if final is None or (final.get("block"), final.get("num_blocks")) != closes:   # not closed by a round
            last_block = self.last["last_block"]
            beam_executor.run_pipeline(lambda p: build_finish(p, self.run_spec, last_block), self.options)
            final = self._read((fs, path), "final")
        loop = LoopState(**final["loop"], next_task=[])
        for result in final["evaluated"]:
            summary_lib.log_evaluation(self.log, loop, result)
        payload = policy_files.describe(self.run_dir, loop.policy_version) or {"nbytes": 0}
        log_version = ReplayStore.open(urls.join(self.run_dir, "replay")).latest_version()
        summary = summary_lib.build_summary(self.cfg, self.run_dir, loop, final["learner_steps"], wall,
                                            payload["nbytes"], self.lags, final["final"], log_version,
                                            self.driver_bytes_in, self.trajectory_bytes)
        summary.update(stop_run_tracker(self.energy))
        summary_lib.write_summary(self.run_dir, self.log, summary)
        self.log.close()
        return summary

    def _progress_bar(self):
        return run_setup.progress_bar(self.progress, self.plan.num_blocks, self.next_block, "block",
                                      f"{self.cfg.name} (beam)")

    def _postfix(self, start: float) -> Dict[str, Any]:
        return {"steps": self.loop.env_steps,
                **run_setup.progress_postfix(self.loop, self.learner_steps, start, self.recent)}
