"""A training run's set-up, written once: the Dask/local driver and the Beam launcher both call it.

::

    check_run_dir(run_dir, resume)        a new run never reuses a directory that holds one
    run_id(cfg, run_dir)                  the run's name in task keys and actor specs
    actor_specs(cfg, run_id, selector)    one ActorSpec per actor, built one way
    write_config(run_dir, cfg, resume)    config.json: a new run's, or what --set/--config changed on resume
    progress_bar(...), progress_postfix   the progress display (env steps/s, learner steps, returns)

The callers keep their own order, on purpose: the driver writes a resumed
run's ``config.json`` only once the checkpoint restored (a failing resume
writes nothing), and builds its actor specs after the restore, which says
the block the actors start at; the Beam launcher writes ``config.json``
first, since a round pipeline's workers read the run from it.

Example::

    check_run_dir(run_dir, resume=False)
    specs = actor_specs(cfg, run_id(cfg, run_dir), builder.action_selector)
    write_config(run_dir, cfg, resume=False)
    bar = progress_bar(True, cfg.total_env_steps, 0, "step", cfg.name, mininterval=0.5)
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from core import config as config_lib
from core import urls
from core.actor import ActorSpec


def check_run_dir(run_dir: str, resume: bool, resume_needs_config: bool = False) -> None:
    """Refuse a new run in a directory that holds one (its shard ids and config would clash).

    Raises:
        ConfigError: a new run, and ``run_dir`` holds ``config.json``.
        FileNotFoundError: ``resume`` with ``resume_needs_config`` and no ``config.json`` (the
            Beam launcher: its rounds' records continue a run that must exist; the driver's resume
            is refused later, by a missing checkpoint).
    """
    fs, path = urls.resolve(run_dir)
    if resume:
        if resume_needs_config and not fs.exists(f"{path}/config.json"):
            raise FileNotFoundError(f"--resume: no run under {run_dir} (no config.json)")
    elif fs.exists(f"{path}/config.json"):
        raise config_lib.ConfigError(f"{run_dir} already holds a run; valid: --resume {run_dir}, or a new --run-dir")


def run_id(cfg, run_dir: Optional[str] = None) -> str:
    """``<name>-<seed>``, and with ``run_dir`` ``-<hash of run_dir>``: the run's name in task keys and actor specs.

    The driver passes its run directory: its ids key Dask tasks and the actors a worker keeps
    (``core.rollout``), which a cluster shares between runs, so two runs of one config must differ.
    The hash is Python's salted ``str`` hash (it differs per process), so an id names nothing
    durable. The Beam launcher passes none: its actors live in one round pipeline.
    """
    if run_dir is None:
        return f"{cfg.name}-{cfg.seed}"
    return f"{cfg.name}-{cfg.seed}-{abs(hash(run_dir)) % 10**8}"


def actor_specs(cfg, run_id: str, selector: str, first_task: int = 0) -> List[ActorSpec]:
    """One :class:`~core.actor.ActorSpec` per actor; ``first_task``: the task actors are built at from seeds."""
    return [ActorSpec(run_id, cfg.env.id, cfg.env.num_envs, cfg.seed, a, cfg.env.max_episode_steps,
                      cfg.threads.litert, selector, first_task=first_task,
                      frame_stack=getattr(cfg.agent, "frame_stack", 1))
            for a in range(cfg.actors.num_actors)]


def write_config(run_dir: str, cfg, resume: bool) -> None:
    """Write ``config.json`` (on resume only if ``--set``/``--config`` changed it)."""
    fs, path = urls.resolve(run_dir)
    text = config_lib.to_json(cfg)
    if resume and fs.exists(f"{path}/config.json"):
        with fs.open(f"{path}/config.json", "r") as f:
            if f.read() == text:
                return
    with fs.open(f"{path}/config.json", "w") as f:
        f.write(text)


def progress_bar(enabled: bool, total: int, initial: int, unit: str, desc: str, **options: Any):
    """A tqdm bar of ``total`` ``unit`` from ``initial`` (None when ``enabled`` is False)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, dynamic_ncols=True, **options)


def progress_postfix(loop, learner_steps: int, start: float, recent_returns: Sequence[float]) -> Dict[str, Any]:
    """The bar's shared fields: env steps/s, learner steps, recent and best return, policy version."""
    el = max(time.time() - start, 1e-9)
    return {"sps": f"{loop.env_steps / el:.0f}", "learn": learner_steps,
            "ret": f"{np.mean(recent_returns):.0f}" if recent_returns else "-",
            "best": f"{loop.best_return:.0f}" if loop.best_version >= 0 else "-",
            "v": loop.policy_version}
