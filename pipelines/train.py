"""Train an agent: ``python -m pipelines.train [options]``.

With no arguments it trains configs/default.yaml (CartPole-v1, double DQN,
int8 actors on an embedded Dask LocalCluster) into ``runs/<name>/``.

Examples::

    python -m pipelines.train
    python -m pipelines.train --executor local --set total_env_steps=20000
    python -m pipelines.train --dask-address tcp://10.0.0.5:8786 --run-dir gs://bucket/runs/a
    python -m pipelines.train --resume runs/cartpole-dqn
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from pipelines.cli import cli_errors, print_table

HELP_EPILOG = """
run directory layout:
  config.json            resolved config
  metrics.jsonl          one JSON record per event (learner, commit, broadcast, eval, summary)
  tb/                    TensorBoard events: tensorboard --logdir runs/
  replay/                zarr v3 replay shards + commit log
  checkpoints/           async zarr checkpoints (latest complete one is used by --resume)
  best/                  parameters of the best evaluated policy version
  carbon.json            energy and CO2e of the whole run, with the measurement source
  policy-<precision>.tflite, summary.json

examples:
  python -m pipelines.train                                   # configs/default.yaml on an embedded Dask cluster
  python -m pipelines.train --executor local --set total_env_steps=20000
  python -m pipelines.train --config configs/pendulum-d4pg.yaml --set actors.precision=fp32
  python -m pipelines.train --resume runs/cartpole-dqn
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipelines.train",
        description="Train an RL agent whose actors act with a quantized (int8 by default) copy of the "
                    "learner's policy. With no options: CartPole-v1, double DQN, on an embedded Dask cluster.",
        epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="PATH", help="YAML experiment config (default: configs/default.yaml)")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help="override a config key, e.g. --set agent.n_step=5 (repeatable)")
    p.add_argument("--executor", choices=["local", "dask", "beam"],
                   help="where stages run: 'local' = one process, deterministic; 'dask' = actors as Dask tasks "
                        "kept in flight (default); 'beam' = one Apache Beam pipeline per round (DirectRunner "
                        "by default; other Beam options such as --runner DataflowRunner pass through)")
    p.add_argument("--dask-address", metavar="tcp://HOST:PORT",
                   help="join an existing Dask scheduler instead of starting a LocalCluster")
    p.add_argument("--run-dir", metavar="PATH_OR_URL",
                   help="where the run is written: a local path or fsspec URL (default: runs/<name>, or "
                        "runs/<name>-N when earlier runs hold it; an explicit directory that already holds a "
                        "run is refused unless --resume)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue RUN_DIR from its latest complete checkpoint and replay log version "
                        "(uses the config saved in RUN_DIR unless --config is given)")
    p.add_argument("--seed", type=int, help="random seed (overrides the config's seed)")
    p.add_argument("--offline-dataset", metavar="STORE",
                   help="train from a fixed replay store (local path or URL) with no actors, then evaluate")
    p.add_argument("--no-progress", action="store_true", help="disable the progress bar")
    return p


def resolve_config(args: argparse.Namespace):
    from core import config as config_lib
    from core import urls
    overrides: List[str] = list(args.overrides)
    if args.executor:
        overrides.append(f"executor={args.executor}")
    if args.dask_address:
        overrides.append(f"dask.address={args.dask_address}")
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    if args.resume and not args.config:
        fs, path = urls.resolve(args.resume)
        if not fs.exists(f"{path}/config.json"):
            raise config_lib.ConfigError(f"--resume: {args.resume!r} is not a run directory (no config.json)")
        with fs.open(f"{path}/config.json") as f:
            data = json.load(f)
        return config_lib.from_dict(config_lib.apply_overrides(data, overrides))
    return config_lib.load_config(args.config, overrides)


def default_run_dir(name: str) -> str:
    """``runs/<name>``, or ``runs/<name>-2``, ``-3``, ... if earlier runs hold those (never overwrite a run)."""
    base = os.path.join("runs", name)
    candidate, n = base, 1
    while os.path.exists(os.path.join(candidate, "config.json")):
        n += 1
        candidate = f"{base}-{n}"
    if candidate != base:
        print(f"{base} holds an earlier run; writing this one to {candidate}", file=sys.stderr)
    return candidate


def train(cfg, run_dir: str, progress: bool = True, resume: bool = False,
          pipeline_args: Optional[List[str]] = None, offline_dataset: Optional[str] = None) -> dict:
    """Run one training job with ``cfg`` into ``run_dir``; returns the summary."""
    if offline_dataset:
        from pipelines.offline import train_offline
        return train_offline(cfg, run_dir, offline_dataset, progress=progress)
    if cfg.inference == "central":  # SEED mode: env-only actors + inference server (pipelines/central.py)
        from pipelines.central import train_central
        return train_central(cfg, run_dir, progress=progress, resume=resume)
    if cfg.executor == "beam":
        from pipelines.rounds import train_in_rounds
        return train_in_rounds(cfg, run_dir, pipeline_args or [], progress=progress, resume=resume)
    if pipeline_args:
        from core.config import ConfigError
        raise ConfigError(f"unrecognized arguments: {' '.join(pipeline_args)} "
                          f"(pipeline options pass through only with --executor beam)")
    from pipelines.driver import Trainer
    from pipelines.executors import run_with_executor
    return run_with_executor(Trainer, cfg, run_dir, progress, resume)


def print_summary(summary: dict) -> None:
    rows = [["env steps", f"{summary['env_steps']:,}"],
            ["learner steps", f"{summary['learner_steps']:,}"],
            ["wall time", f"{summary['wall_s']:.1f} s"],
            ["env steps/s", f"{summary['env_steps_per_s']:,.0f}"],
            ["policy versions", summary["policy_versions"]],
            ["bytes per broadcast", f"{summary['bytes_per_broadcast']:,} ({summary['precision']})"],
            ["best eval return", "- (no evaluation ran)" if summary["best_version"] < 0
             else f"{summary['best_eval_return']:.1f} (version {summary['best_version']})"],
            ["time to target", "-" if summary["time_to_target_s"] is None
             else f"{summary['time_to_target_s']:.1f} s, {summary['env_steps_to_target']:,} env steps"]]
    for precision, r in summary["final_eval"].items():
        rows.append([f"final return ({precision})", f"{r['mean']:.1f} +- {r['std']:.1f}"])
    if summary.get("energy_kwh") is not None:
        rows.append(["energy", f"{summary['energy_kwh'] * 1000:.3f} Wh, {summary['co2e_kg'] * 1000:.3f} g CO2e "
                               f"({summary['carbon_backend']})"])
    print_table(["", summary["run_dir"]], rows)


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    # Unknown options are Beam pipeline options (--runner, --project, ...): passed through untouched.
    args, pipeline_args = build_parser().parse_known_args(argv)
    cfg = resolve_config(args)
    run_dir = args.resume or args.run_dir or cfg.run_dir or default_run_dir(cfg.name)
    summary = train(cfg, run_dir, progress=not args.no_progress, resume=bool(args.resume),
                    pipeline_args=pipeline_args, offline_dataset=args.offline_dataset)
    print_summary(summary)
    return 0


if __name__ == "__main__":  # Dask spawns workers that re-import __main__: keep this guard.
    sys.exit(main())
