"""Evaluate a saved policy: ``python -m pipelines.evaluate RUN_DIR [options]``.

Loads the learner's parameters from RUN_DIR (the best evaluated version by
default, or ``--checkpoint STEP|latest``), converts them at ``--precision``,
plays ``--episodes`` greedy episodes with the LiteRT policy and prints the
returns. ``--export PATH`` writes the actor's TFLite policy file.

Examples::

    python -m pipelines.evaluate runs/cartpole-dqn
    python -m pipelines.evaluate runs/cartpole-dqn --checkpoint latest --precision fp32 --episodes 50
    python -m pipelines.evaluate runs/cartpole-dqn --export cartpole-int8.tflite
"""
from __future__ import annotations

import argparse
import json
from typing import List, Optional

import numpy as np

from core.fast_exit import exit_now
from pipelines.cli import check_locations, check_output_file, cli_errors, print_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.evaluate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by pipelines.train")
    p.add_argument("--checkpoint", default="best", metavar="STEP|latest|best",
                   help="which parameters: 'best' evaluated version (default; falls back to latest), "
                        "'latest' complete checkpoint, or a learner step")
    p.add_argument("--precision", choices=["fp32", "fp16", "int8-dynamic", "int8-full"],
                   help="actor precision to evaluate at (default: the run's actors.precision)")
    p.add_argument("--episodes", type=int, default=20, help="number of greedy episodes (default 20)")
    p.add_argument("--seed", type=int, default=123_456, help="evaluation env seed (default 123456)")
    p.add_argument("--export", metavar="PATH", help="also write the TFLite policy file to PATH")
    return p


def load_policy_params(run_dir: str, which: str):
    """``(config, params, label)`` for a run dir's best / latest / given-step parameters."""
    from core import config as config_lib
    from core import urls
    from core.checkpoint import Checkpointer
    fs, path = urls.resolve(run_dir)
    if not fs.exists(f"{path}/config.json"):
        raise FileNotFoundError(f"{run_dir!r} is not a run directory (no config.json)")
    with fs.open(f"{path}/config.json") as f:
        cfg = config_lib.from_dict(json.load(f))
    if which == "best" and fs.exists(f"{path}/best"):
        best = Checkpointer(urls.join(run_dir, "best"))
        step = best.latest_step()
        if step is not None:
            state, _ = best.restore(step, select=["params"])
            return cfg, state["params"], f"best (policy version {step})"
    ckpt = Checkpointer(urls.join(run_dir, "checkpoints"))
    if which in ("best", "latest"):
        step = ckpt.latest_step()
        if step is None:
            raise FileNotFoundError(f"{run_dir!r} has no complete checkpoint")
    else:
        try:
            step = int(which)
        except ValueError:
            raise FileNotFoundError(f"--checkpoint {which!r} is not a step, 'latest' or 'best'") from None
    state, _ = ckpt.restore(step, select=["learner/params"])
    return cfg, state["learner"]["params"], f"checkpoint step {step}"


def _calibration(learner, builder, env_id: str, seed: int) -> np.ndarray:
    """Observations of the policy's own greedy episodes (8 envs x 64 steps), for int8-full calibration."""
    from core.envs import env_spec, make_vector_env
    from core.exploration import SELECTORS, greedy_params
    select, spec = SELECTORS[builder.action_selector], env_spec(env_id)
    envs, obs = make_vector_env(env_id, 8, seed)
    rows = [obs]
    for _ in range(63):
        out = learner.policy_model(obs.reshape(8, -1).astype(np.float32)).numpy()
        action, _ = select(out, greedy_params(builder.action_selector), np.random.default_rng(0), spec)
        obs, *_ = envs.step(action)
        rows.append(obs)
    envs.close()
    return np.concatenate(rows).reshape(len(rows) * 8, -1).astype(np.float32)


def policy_payload(run_dir: str, which: str, precision: Optional[str], seed: int, version: int = 0):
    """``(cfg, builder, payload, label)``: a trained run's policy at ``precision`` (default: the run's).

    ``seed`` seeds the greedy episodes that calibrate ``int8-full``.
    """
    from core.agents.registry import get_builder
    from core.envs import env_spec
    from core.quantize import PolicyQuantizer
    cfg, params, label = load_policy_params(run_dir, which)
    precision = precision or cfg.actors.precision
    builder = get_builder(cfg.agent.algo)
    learner = builder.make_learner(env_spec(cfg.env.id), cfg.agent, cfg.seed)
    learner.restore({**learner.state(), "params": params})
    calib = _calibration(learner, builder, cfg.env.id, seed) if precision == "int8-full" else None
    payload = PolicyQuantizer(precision).quantize(learner.policy_model, version=version, calibration_obs=calib)
    return cfg, builder, payload, label


def check_args(args: argparse.Namespace) -> None:
    """Every option, and that ``--export`` can be written, before the (long) evaluation."""
    from core.config import MAX_SEED, ConfigError
    if args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes} is out of range; valid: >= 1")
    if not 0 <= args.seed <= MAX_SEED:
        raise ConfigError(f"--seed {args.seed} is out of range; valid: 0..{MAX_SEED}")
    check_output_file(args.export, "--export")


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    check_locations(("RUN_DIR", args.run_dir))
    check_args(args)
    from core.policy_evaluation import evaluate_payload
    cfg, builder, payload, label = policy_payload(args.run_dir, args.checkpoint, args.precision, args.seed + 1)
    precision = payload.precision
    returns = evaluate_payload(payload, cfg.env.id, args.episodes, seed=args.seed,
                               selector=builder.action_selector, max_episode_steps=cfg.env.max_episode_steps,
                               frame_stack=getattr(cfg.agent, "frame_stack", 1))
    print_table(["run", "parameters", "precision", "episodes", "mean return", "std", "min", "max", "payload bytes"],
                [[args.run_dir, label, precision, args.episodes, f"{returns.mean():.1f}", f"{returns.std():.1f}",
                  f"{returns.min():.0f}", f"{returns.max():.0f}", f"{payload.nbytes:,}"]])
    print("returns:", " ".join(f"{r:.0f}" for r in returns))
    if args.export:
        with open(args.export, "wb") as f:
            f.write(payload.data)
        print(f"wrote {args.export} ({payload.nbytes:,} bytes, {precision})")
    return 0


if __name__ == "__main__":
    exit_now(main())
