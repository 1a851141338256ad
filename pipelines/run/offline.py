"""Offline training: the online plan (:mod:`pipelines.run.plan`) on a fixed replay store, every commit done.

``python -m pipelines.train --offline-dataset STORE`` (or ``--resume RUN_DIR``: it ends bit-identical) drives
a :class:`~pipelines.run.learner_stage.LearnerStage` in this process whose cache holds the whole dataset::

    learn      : block b to  min(S, floor(replay_ratio * (b + 1) * block_rows))  steps, in the plan's calls
                 with sampler_rng(b);  S = max(1, floor(total_env_steps * replay_ratio))
    evaluate   : when (b + 1) * block_rows crosses a multiple of eval.every_env_steps, and after the last
                 block: version v plays with the online seeds; the best is kept in best/ (pipelines.evaluate)
    stop       : after a solved evaluation, with eval.stop_at_target
    checkpoint : every checkpoint.every_steps learner steps, and at the end
    baseline   : unless the agent is BC, BC on the same blocks for min(S, 5_000) steps: final_eval["bc-baseline"]
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Dict, Optional

from core import config as config_lib
from core import urls
from pipelines.run import setup as run_setup
from pipelines.run import stages
from pipelines.run import summary as summary_lib
from pipelines.run.flight import LoopState
from pipelines.run.learner_stage import LearnerStage

BASELINE_STEPS = 5_000
RECORD = "offline.json"       # {"dataset": url, "version": log version}: the data --resume trains on


class OfflineStage(LearnerStage):
    """The online runs' learner stage; its cache holds every row of a fixed dataset."""

    def __init__(self, cfg, run_dir: str, store, rows: int):
        super().__init__(cfg, run_dir, store=store, cache_rows=max(rows, 1))
        self.total = max(1, int(cfg.total_env_steps * cfg.learner.replay_ratio))

    def refresh_cache(self, block: int) -> None:
        """The whole fixed dataset, whatever the block: its shard ids are not the plan's."""
        self.cache.refresh()

    def target(self, block: int, cap: int) -> int:
        return min(cap, int(self.plan.replay_ratio * (block + 1) * self.plan.block_rows))

    def evaluates(self, block: int) -> bool:
        rows, every = self.plan.block_rows, self.cfg.eval.every_env_steps
        return block == self.plan.num_blocks - 1 or (block + 1) * rows // every > block * rows // every


def recorded_dataset(run_dir: str) -> Optional[Dict[str, Any]]:
    """The dataset record of an offline run in ``run_dir`` (its ``offline.json``), else None."""
    fs, path = urls.resolve(run_dir)
    return json.loads(fs.cat(f"{path}/{RECORD}")) if fs.exists(f"{path}/{RECORD}") else None


def _open_dataset(cfg, run_dir: str, store_url: Optional[str], resume: bool):
    """``(store, snapshot)`` once every check passed: a one-line error before anything is written."""
    from core.dataset.shards import open_snapshot
    was = recorded_dataset(run_dir) if resume else None
    store, snap = open_snapshot(store_url or was["dataset"])     # resume: train.py found a record
    for ok, message in [
            (not resume or was is not None, f"--resume {run_dir} is not an offline run (no {RECORD}); valid: "
             f"--resume {run_dir} without --offline-dataset"),
            (not store.env_id or store.env_id == cfg.env.id, f"--offline-dataset {store.url} holds "
             f"{store.env_id!r} data but env.id is {cfg.env.id!r}; valid: --set env.id={store.env_id}"),
            (snap.num_rows >= cfg.replay.min_size, f"--offline-dataset {store.url} holds {snap.num_rows} rows, "
             f"fewer than replay.min_size {cfg.replay.min_size}; valid: --set replay.min_size={snap.num_rows}"),
            (not was or (was["dataset"], was["version"]) == (store.url, snap.version),
             f"--resume {run_dir} trained on {(was or {}).get('dataset')} at version {(was or {}).get('version')},"
             f" not {store.url} at version {snap.version}; valid: that dataset, unchanged")]:
        if not ok:
            raise config_lib.ConfigError(message)
    return store, snap


def _evaluate(cfg, stage: OfflineStage, loop: LoopState, log, progress: bool) -> None:
    """Play the block's new version (the online seeds); log it and keep it if it is the best."""
    from core.policy_evaluation import run_evaluation_task
    from pipelines.run.evaluation_schedule import decide_evaluation, evaluation_args
    v = loop.policy_version
    r = run_evaluation_task(stage.payload(v), *evaluation_args(cfg, v, stage.builder.action_selector))
    summary_lib.log_evaluation(log, loop, {**r, "env_steps": stage.steps})   # step: learner steps (no env steps)
    decide_evaluation(cfg, loop, r, lambda version, result: stage.save_best(version, json.dumps(result)))
    if progress:
        print(f"{cfg.agent.algo}: step {stage.steps:,} return {r['mean']:.1f} (best {loop.best_return:.1f})")


def _train(cfg, stage: OfflineStage, loop: LoopState, log, progress: bool) -> None:
    """The blocks from ``loop.block`` to the last one or a solved evaluation (module docstring)."""
    done = lambda: loop.block >= stage.plan.num_blocks or cfg.eval.stop_at_target and loop.time_to_target_s is not None
    last_ckpt = stage.steps
    while not done():
        b, version = loop.block, loop.policy_version + 1 if stage.evaluates(loop.block) else None
        for kind, step, fields in stage.learn_block(b, stage.target(b, stage.total), version,
                                                    [loop.best_version])["records"]:
            log.write(kind, step=step, **fields)
        if version is not None:
            loop.policy_version = version
            _evaluate(cfg, stage, loop, log, progress)
        loop.block = b + 1
        if stage.steps - last_ckpt >= cfg.checkpoint.every_steps or done():
            stage.best_ckpt.wait()    # a complete checkpoint never names a best version a kill could lose
            last_ckpt = stage.checkpoint(json.dumps(dataclasses.asdict(loop)))


def _bc_baseline(cfg, stage: OfflineStage) -> Dict[str, Any]:
    """Behaviour cloning on the same data, blocks and RNG streams; its final fp32 return."""
    from core.agents.bc.config import BCConfig
    from core.agents.registry import get_builder
    from core.policy_evaluation import run_evaluation_task
    from core.quantize import PolicyQuantizer
    bc_cfg, builder = BCConfig(), get_builder("bc")
    learner, sampler = builder.make_learner(stage.spec, bc_cfg, cfg.seed), builder.make_sampler(stage.cache, bc_cfg)
    for b in range(stage.plan.num_blocks):
        rng = stage.plan.sampler_rng(b)
        for n in stage.plan.calls(learner.steps, stage.target(b, min(stage.total, BASELINE_STEPS))):
            stages.learn_stage(learner, sampler, n, bc_cfg.batch_size, rng)
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=0)
    r = run_evaluation_task(payload, cfg.env.id, cfg.eval.episodes, cfg.seed + 900_000, cfg.env.max_episode_steps)
    return {"mean": r["mean"], "std": r["std"], "payload_bytes": int(payload.nbytes)}


def train_offline(cfg, run_dir: str, store_url: Optional[str], progress=True, resume=False) -> Dict[str, Any]:
    """Train ``cfg``'s agent on the fixed store ``store_url`` (resume: the run's own) into ``run_dir``."""
    from core.metrics import MetricsLogger
    from pipelines.run.energy import start_run_tracker, stop_run_tracker
    run_dir = urls.normalize(run_dir)
    store, snap = _open_dataset(cfg, run_dir, store_url, resume)
    fs, path = urls.resolve(run_dir)
    if not resume:
        fs.makedirs(path, exist_ok=True)
        run_setup.write_config(run_dir, cfg, resume=False)
        fs.pipe(f"{path}/{RECORD}", json.dumps({"dataset": store.url, "version": snap.version}).encode())
    stage = OfflineStage(cfg, run_dir, store, snap.num_rows)
    try:
        loop = LoopState(**json.loads(stage.restore()["loop"])) if resume else LoopState()
        with MetricsLogger(run_dir) as log:
            log.write("config", step=0, config=config_lib.to_dict(cfg), offline_dataset=store.url,
                      dataset_version=snap.version, dataset_rows=snap.num_rows)
            log.write("placement", step=0, learner="{host} pid {pid} (offline, in process)".format(**stage.where()),
                      learner_address=None, learner_resources={}, actors={}, executor="offline")
            energy, start = start_run_tracker(cfg, run_dir, None), time.time()   # no actors: this process only
            _train(cfg, stage, loop, log, progress)
            out = stage.finish(loop.best_version, loop.policy_version)
            for kind, step, fields in out["records"]:
                log.write(kind, step=step, **fields)
            final = {**out["final"], **({"bc-baseline": _bc_baseline(cfg, stage)} if cfg.agent.algo != "bc" else {})}
            summary = summary_lib.build_summary(cfg, run_dir, loop, out["steps"], time.time() - start,
                                                final[cfg.actors.precision]["payload_bytes"], [], final, snap.version)
            summary.update(executor="offline", offline_dataset=store.url, dataset_rows=snap.num_rows,
                           **stop_run_tracker(energy))
            summary_lib.write_summary(run_dir, log, summary)
            return summary
    finally:
        stage.close()
