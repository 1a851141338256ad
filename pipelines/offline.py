"""Offline training: learn from a fixed replay store, with no actors, then evaluate in the env.

``python -m pipelines.train --offline-dataset STORE`` calls :func:`train_offline`:

1. the store's committed rows are loaded into a ``ReplayCache`` (all of them:
   the dataset is fixed) and the configured agent learns from its sampler:
   offline DQN for ``agent.algo: dqn`` (the online learner on n-step samples
   of the fixed data), or behaviour cloning for ``agent.algo: bc``;
2. the learner takes ``total_env_steps * learner.replay_ratio`` gradient
   steps (the compute an online run of the same config would spend), and
   every ``eval.every_env_steps * replay_ratio`` steps its policy plays
   ``eval.episodes`` episodes (confirmed like online runs); the best version
   is kept in ``best/`` (so ``pipelines.evaluate RUN_DIR`` works);
3. unless the agent is BC itself, a BC baseline trains on the same data
   (``min(steps, 5_000)`` steps) and its final return is reported next to
   the agent's, under ``final_eval["bc-baseline"]``.

The summary has the keys of an online run (``pipelines.summary``), so
``print_summary`` prints it; env steps are 0 because no actor runs.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Dict, Optional

import numpy as np

from core import config as config_lib
from core import urls

BASELINE_STEPS = 5_000


def _check_dataset(cfg, store_url: str):
    from core.dataset.shards import open_snapshot
    store, snap = open_snapshot(store_url)
    if store.env_id and store.env_id != cfg.env.id:
        raise config_lib.ConfigError(f"--offline-dataset {store.url} holds {store.env_id!r} data but env.id is"
                                     f" {cfg.env.id!r}; valid: --set env.id={store.env_id}")
    return store, snap


def _evaluate(cfg, builder, learner, version: int, seed: int) -> Dict[str, Any]:
    from core.evaluation import run_evaluation_task
    from core.quantize import PolicyQuantizer
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=version)
    return run_evaluation_task(payload, cfg.env.id, cfg.eval.episodes, seed, cfg.env.max_episode_steps,
                               builder.action_selector, cfg.eval.target_return, cfg.eval.confirm_episodes)


def _final_fp32(cfg, builder, learner) -> Dict[str, Any]:
    from core.evaluation import evaluate_payload
    from core.quantize import PolicyQuantizer
    payload = PolicyQuantizer("fp32").quantize(learner.policy_model, version=0)
    returns = evaluate_payload(payload, cfg.env.id, cfg.eval.episodes, seed=cfg.seed + 900_000,
                               selector=builder.action_selector, max_episode_steps=cfg.env.max_episode_steps)
    return {"mean": float(returns.mean()), "std": float(returns.std()), "payload_bytes": int(payload.nbytes)}


def fit(cfg, agent_cfg, cache, steps: int, log=None, best_ckpt=None, progress: bool = False,
        label: str = "offline"):
    """Train ``agent_cfg``'s learner on ``cache`` for ``steps``; returns (learner, builder, loop state)."""
    from core.agents.registry import get_builder
    from core.envs import env_spec
    from pipelines import stages
    from pipelines.driver import LoopState
    builder = get_builder(agent_cfg.algo)
    learner = builder.make_learner(env_spec(cfg.env.id), agent_cfg, cfg.seed)
    sampler = builder.make_sampler(cache, agent_cfg)
    rng = np.random.default_rng([cfg.seed, 11])
    loop = LoopState()
    every = max(1, int(cfg.eval.every_env_steps * cfg.learner.replay_ratio))
    start = time.time()
    while learner.steps < steps:
        n = min(cfg.learner.steps_per_call * 4, steps - learner.steps)
        m = stages.learn_stage(learner, sampler, n, agent_cfg.batch_size, rng)
        if learner.steps % every < n or learner.steps >= steps:
            loop.policy_version += 1
            r = _evaluate(cfg, builder, learner, loop.policy_version, cfg.seed + 100_000 + loop.policy_version)
            score = r["confirmed_mean"] if r["confirmed_mean"] is not None else r["mean"]
            if log is not None:
                log.write("eval", step=learner.steps, version=loop.policy_version, mean=r["mean"], std=r["std"],
                          confirmed_mean=r["confirmed_mean"], loss=m["loss"], agent=label)
            if progress:
                print(f"{label}: step {learner.steps:,}/{steps:,} loss {m['loss']:.3f} return {r['mean']:.1f}"
                      f" (best {max(loop.best_return, score):.1f})", flush=True)
            if score > loop.best_return:
                loop.best_return, loop.best_version = score, loop.policy_version
                loop.best_params = learner.state()["params"]
                if best_ckpt is not None:
                    best_ckpt.save(loop.policy_version, {"params": loop.best_params},
                                   metadata={"eval": json.dumps(r), "config": config_lib.to_json(cfg)})
            solved = score >= cfg.eval.target_return and (r["confirmed_mean"] is not None
                                                          or cfg.eval.confirm_episodes == 0)
            if solved and loop.time_to_target_s is None:
                loop.time_to_target_s, loop.env_steps_to_target = time.time() - start, 0  # no env steps offline
            if solved and cfg.eval.stop_at_target:
                break
    if getattr(loop, "best_params", None) is not None:
        learner.restore({**learner.state(), "params": loop.best_params})
    return learner, builder, loop


def train_offline(cfg, run_dir: str, store_url: str, progress: bool = True) -> Dict[str, Any]:
    """Train ``cfg``'s agent on the fixed store ``store_url`` into ``run_dir``; returns the summary."""
    from core.agents.bc.config import BCConfig
    from core.checkpoint import Checkpointer
    from core.metrics import MetricsLogger
    from core.replay import ReplayCache
    from pipelines.driver import configure_threads
    from pipelines.summary import build_summary, final_evaluation, write_summary
    store, snap = _check_dataset(cfg, store_url)
    configure_threads(cfg)
    run_dir = urls.normalize(run_dir)
    fs, path = urls.resolve(run_dir)
    fs.makedirs(path, exist_ok=True)
    with fs.open(f"{path}/config.json", "w") as f:
        f.write(config_lib.to_json(cfg))
    log = MetricsLogger(run_dir)
    log.write("config", step=0, config=config_lib.to_dict(cfg), offline_dataset=store.url,
              dataset_version=snap.version, dataset_rows=snap.num_rows)
    from pipelines.energy import start_run_tracker, stop_run_tracker
    energy = start_run_tracker(cfg, run_dir, None)     # this process: no actors in offline training
    cache = ReplayCache(store, max_transitions=max(snap.num_rows, 1))
    cache.refresh()
    steps = max(1, int(cfg.total_env_steps * cfg.learner.replay_ratio))
    best_ckpt = Checkpointer(urls.join(run_dir, "best"), keep_last=1)
    start = time.time()
    learner, builder, loop = fit(cfg, cfg.agent, cache, steps, log, best_ckpt, progress, cfg.agent.algo)
    best_ckpt.wait()
    ckpt = Checkpointer(urls.join(run_dir, "checkpoints"), keep_last=1)
    ckpt.save(learner.steps, {"learner": learner.state()},
              metadata={"loop": json.dumps({k: v for k, v in dataclasses.asdict(loop).items()}),
                        "config": config_lib.to_json(cfg), "offline_dataset": store.url})
    ckpt.wait()
    calib = None
    if cfg.actors.precision == "int8-full":
        calib = cache.data["observation"][:cache.size].reshape(cache.size, -1)[:cfg.actors.calibration_size]
    final = final_evaluation(cfg, learner, builder, run_dir, loop.policy_version, calib)
    if cfg.agent.algo != "bc":
        bc, bc_builder, _ = fit(cfg, BCConfig(), cache, min(steps, BASELINE_STEPS), log, None, progress,
                                "bc-baseline")
        final["bc-baseline"] = _final_fp32(cfg, bc_builder, bc)
    wall = time.time() - start
    summary = build_summary(cfg, run_dir, loop, learner.steps, wall, 0, [], final, snap.version)
    summary.update(executor="offline", offline_dataset=store.url, dataset_rows=snap.num_rows)
    summary.update(stop_run_tracker(energy))
    write_summary(run_dir, log, summary)
    best_ckpt.close()
    ckpt.close()
    log.close()
    return summary
