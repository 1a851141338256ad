"""The learner as a stage of a Beam round: restore, keep the best, train, checkpoint, publish.

These stages run on pipeline workers (a DirectRunner worker process, a
Dataflow worker), never in the launcher: the launcher only submits round
pipelines and reads their JSON records, so it needs neither TensorFlow nor
an accelerator. Every call starts from durable state (the latest complete
checkpoint, the commit log, the policy files), so a fresh worker process, a
retried bundle and a resumed run compute the same thing::

    Publish v (before the round's rollouts; work only when version v is not written yet,
               i.e. a new run's round 0 or after a crash):
        no checkpoint -> build the learner from the seed, checkpoint it as round -1
        restore the latest checkpoint -> quantize as v -> policies/v.tflite (pipelines.policy_files)
    Learn r (after the round's commit; its evaluation, if any, is a side input):
        latest checkpoint is round r   -> a retry: republish v = r + 2, return the stored record
        latest checkpoint is round r-1 -> restore it: the parameters this round's policy was made from
            evaluation scored above the best -> best/ := these parameters
            loop counters += the round record (env steps, episodes), the evaluation (best, target)
            K = floor(replay_ratio * committed_rows) - learner_steps steps, rng [seed, 11, r]
            checkpoint (step = learner steps; metadata: round, loop, this record)
            quantize the new parameters -> policies/v(r + 2)
    Finish (its own pipeline, after the last round):
        restore the latest checkpoint, then the best parameters -> final evaluation (pipelines.summary)

The learner object and its replay cache are kept per worker process
(:func:`stage_for`) only to avoid rebuilding graphs when one process runs
several rounds (``in_memory`` mode); each call restores first.

Example::

    stage = stage_for(cfg, run_dir)
    path = stage.publish(1)                            # policies/v000001.tflite
    record = stage.learn(0, round_record, None, started_at=time.time())
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from typing import Any, Dict, Optional

import numpy as np

from core import config as config_lib
from pipelines import policy_files

_LEARN_CHUNK = 128   # learner steps per learner call (one TF dispatch, one sampler call)


@dataclasses.dataclass(frozen=True)
class LearnPlan:
    """What a round's learner stages need beyond the round plan (small, picklable)."""
    cfg: Any                  # the run's core.config.Config
    started_at: float         # the launcher's process start: time to target counts from it


#: Episode returns of a round the learn record repeats for the launcher (progress shows the last 20).
RETURNS_TAIL = 20


def account_round(loop, record: Dict[str, Any]) -> Dict[str, Any]:
    """Add a round record's tasks to the loop counters; returns the digest the launcher reads.

    The digest is all the launcher learns of the round's commit (it never
    reads the round record itself): commit-log facts, one ``[actor, worker,
    env_steps, seconds]`` row per task, and the episode count, sum and tail.
    """
    returns = [x for t in record["tasks"] for x in t["returns"]]
    loop.env_steps += sum(int(t["env_steps"]) for t in record["tasks"])
    loop.episodes += len(returns)
    loop.shard_seq = int(record["round"]) + 1
    return {"log_version": record["log_version"], "shards": len(record["shards"]), "rows": record["rows"],
            "bytes": record["bytes"], "raw_bytes": record.get("raw_bytes", record["bytes"]),
            "tasks": [[t["actor"], t["worker"], t["env_steps"], round(t["seconds"], 4)] for t in record["tasks"]],
            "episodes": len(returns), "return_sum": float(sum(returns)),
            "returns_tail": [round(x, 2) for x in returns[-RETURNS_TAIL:]]}


class LearnerStage:
    """Learner, replay cache, checkpoints and quantizer of one run, in one worker process."""

    def __init__(self, cfg, run_dir: str):
        from pipelines.learner_stage import learner_parts
        self.cfg, self.run_dir = cfg, run_dir
        vars(self).update(learner_parts(cfg, run_dir, create_store=True))
        self.lock = threading.Lock()   # one stage call at a time (a multi-threaded worker)

    # -- durable state ----------------------------------------------------------------
    def restore_latest(self) -> Dict[str, Any]:
        """Load the latest complete checkpoint into the learner; returns its metadata."""
        state, meta = self.ckpt.restore(self.ckpt.latest_step())
        self.learner.restore(state["learner"])
        return meta

    def save(self, round_index: int, loop, record: Optional[Dict[str, Any]] = None) -> None:
        self.ckpt.save(self.learner.steps, {"learner": self.learner.state()},
                       metadata={"round": round_index, "loop": json.dumps(dataclasses.asdict(loop)),
                                 "learn": json.dumps(record or {}),
                                 "replay_log_version": int(self.store.latest_version()),
                                 "config": config_lib.to_json(self.cfg)})
        self.ckpt.wait()   # the next stage (maybe in another process) restores it: it must be committed

    def _loop(self, meta: Dict[str, Any]):
        from pipelines.driver import LoopState
        return LoopState(**json.loads(meta["loop"]))

    # -- stages ---------------------------------------------------------------------------
    def publish(self, version: int) -> str:
        """Path of policy ``version``, quantized from the latest checkpoint if not written yet."""
        with self.lock:
            if policy_files.exists(self.run_dir, version):
                return policy_files.payload_path(self.run_dir, version)
            if self.ckpt.latest_step() is None:    # a new run: round 0's policy is the initial network
                from pipelines.driver import LoopState
                self.save(-1, LoopState(next_task=[0] * self.cfg.actors.num_actors))
            self.restore_latest()
            self.cache.refresh()                   # int8-full calibrates on replay
            return self._write_policy(version)

    def _write_policy(self, version: int) -> str:
        payload = self.quantizer.quantize(self.learner.policy_model, version=version,
                                          calibration_obs=self.calibration_obs())
        return policy_files.write_payload(self.run_dir, payload)

    def learn(self, round_index: int, record: Dict[str, Any], evaluation: Optional[Dict[str, Any]],
              started_at: float) -> Dict[str, Any]:
        """Learner block of round ``round_index`` (module docstring); returns the learn record."""
        with self.lock:
            meta = self.restore_latest()
            done = int(meta["round"])
            if done == round_index:                # a retried bundle: trained and saved already
                stored = json.loads(meta.get("learn") or "{}")
                if not policy_files.exists(self.run_dir, round_index + 2):
                    self.cache.refresh()
                    self._write_policy(round_index + 2)
                return stored
            if done != round_index - 1:
                raise RuntimeError(f"learner stage of round {round_index}: the latest checkpoint is of round "
                                   f"{done}, expected {round_index - 1}")
            t0 = time.time()
            loop = self._loop(meta)
            digest = account_round(loop, record)
            loop.policy_version = max(loop.policy_version, round_index + 1)
            stop = self._on_evaluation(loop, evaluation, started_at) if evaluation else False
            trained, metrics = self._train(round_index)
            out = {"round": round_index, "trained": trained, "learner_steps": int(self.learner.steps),
                   "loss": metrics["loss"] if metrics else None, "stop": bool(stop),
                   "learn_s": time.time() - t0, "worker": f"{socket.gethostname()} pid {os.getpid()}",
                   "loop": dataclasses.asdict(loop), "commit": digest,
                   "evaluation": {k: v for k, v in evaluation.items() if k != "returns"} if evaluation else None}
            self.save(round_index, loop, out)
            self._write_policy(round_index + 2)
            return out

    def _on_evaluation(self, loop, result: Dict[str, Any], started_at: float) -> bool:
        """Keep the evaluated parameters if they scored best; True = the target is reached (stop)."""
        from pipelines import summary as summary_lib
        score = summary_lib.evaluation_score(result)
        if score > loop.best_return:
            loop.best_return, loop.best_version = score, result["version"]
            # The learner holds the checkpoint the evaluated version was quantized from.
            self.best_ckpt.save(result["version"], {"params": self.learner.state()["params"]},
                                metadata={"eval": json.dumps(result), "config": config_lib.to_json(self.cfg)})
            self.best_ckpt.wait()
        first = loop.time_to_target_s is None
        stop = summary_lib.record_target(self.cfg, loop, result)
        if first and loop.time_to_target_s is not None:   # from the launcher's start, not this worker's
            loop.time_to_target_s = time.time() - started_at
        return stop

    def _train(self, round_index: int):
        from pipelines import stages
        cfg = self.cfg
        self.cache.refresh()
        k = int(cfg.learner.replay_ratio * self.store.state().rows) - self.learner.steps
        metrics = None
        if self.cache.size >= cfg.replay.min_size and k > 0:
            rng = np.random.default_rng([cfg.seed, 11, round_index])   # a re-run round repeats itself
            for n in [_LEARN_CHUNK] * (k // _LEARN_CHUNK) + ([k % _LEARN_CHUNK] if k % _LEARN_CHUNK else []):
                metrics = stages.learn_stage(self.learner, self.sampler, n, cfg.agent.batch_size, rng)
        return (max(k, 0) if metrics else 0), metrics

    def finish(self) -> Dict[str, Any]:
        """The final evaluation of the best (else latest) parameters; writes ``policy-<precision>.tflite``."""
        from pipelines import summary as summary_lib
        with self.lock:
            loop = self._loop(self.restore_latest())
            steps = int(self.learner.steps)
            self.cache.refresh()
            self.best_ckpt.wait()
            summary_lib.restore_best(self.best_ckpt, loop.best_version, self.learner)
            final = summary_lib.final_evaluation(self.cfg, self.learner, self.builder, self.run_dir,
                                                 loop.policy_version, self.calibration_obs())
            return {"final": final, "learner_steps": steps}

    def calibration_obs(self) -> Optional[np.ndarray]:
        """Replay observations for int8-full calibration (reset observations before any replay)."""
        cfg = self.cfg
        if cfg.actors.precision != "int8-full":
            return None
        n = cfg.actors.calibration_size
        if self.cache.size >= n:
            obs = self.sampler.sample(n, np.random.default_rng([cfg.seed, 7]))["observation"]
        else:
            from core.envs import make_vector_env
            envs, obs = make_vector_env(cfg.env.id, n, cfg.seed + 999)
            envs.close()
        return obs.reshape(len(obs), -1).astype(np.float32)

    def close(self) -> None:
        self.ckpt.close()
        self.best_ckpt.close()


_STAGES: Dict[Any, LearnerStage] = {}
_STAGES_LOCK = threading.Lock()


def stage_for(cfg, run_dir: str) -> LearnerStage:
    """This process's learner stage for ``(cfg, run_dir)`` (one at a time: a new run closes the old one)."""
    key = (run_dir, config_lib.to_json(cfg))
    with _STAGES_LOCK:
        stage = _STAGES.get(key)
        if stage is None:
            for old in _STAGES.values():
                old.close()
            _STAGES.clear()
            stage = _STAGES[key] = LearnerStage(cfg, run_dir)
        return stage
