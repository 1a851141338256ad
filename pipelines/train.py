"""Train an agent: ``python -m pipelines.train [options]``.

With no arguments it trains configs/default.yaml (CartPole-v1, double DQN,
int8 actors on an embedded Dask LocalCluster) into ``runs/<name>/``.

Examples::

    python -m pipelines.train
    python -m pipelines.train --executor local --set total_env_steps=20000
    python -m pipelines.train --dask-address tcp://10.0.0.5:8786 --run-dir gs://bucket/runs/a
    python -m pipelines.train --resume runs/cartpole-dqn

Before anything is written the config is fully validated and the run
directory is locked (:mod:`core.run_lock`): a second trainer on a directory
in use, new run or ``--resume``, exits 2 and writes nothing. The lock is
released on exit, also on an error or Ctrl-C. Ctrl-C ends with one line that
names the resume command, exit status 130.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Tuple

from core.fast_exit import exit_now
from pipelines.beam.warm_workers import WorkerLost   # its module imports only the standard library
from pipelines.cli import Interrupted, check_locations, cli_errors, parse_with_pipeline_args, print_table

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


def check_pipeline_args(cfg, pipeline_args: List[str], offline_dataset: Optional[str]) -> None:
    """Unknown options are Beam pipeline options: refuse them (before anything is written) elsewhere."""
    if pipeline_args and not offline_dataset and cfg.inference != "central" and cfg.executor != "beam":
        from core.config import ConfigError
        raise ConfigError(f"unrecognized arguments: {' '.join(pipeline_args)} "
                          f"(pipeline options pass through only with --executor beam)")


def interrupt_message(run_dir: str, ended: str = "interrupted") -> str:
    """The one line printed on Ctrl-C: how to resume, or why there is nothing to resume yet. ``ended``
    names how the run ended (``stopped`` after a lost Beam worker).

    A Beam run resumes from its newest round record (``rounds/r<round>.json``), which it may have before
    its first periodic checkpoint; any other run from its newest checkpoint."""
    from core import urls
    from core.checkpoint import Checkpointer
    resume = f"resume with: python -m pipelines.train --resume {run_dir}"
    beam_round = _newest_beam_round(run_dir)
    if beam_round is not None:
        return f"{ended} after Beam round {beam_round[0]} (blocks 0-{beam_round[1]} done); {resume}"
    try:
        with Checkpointer(urls.join(run_dir, "checkpoints")) as ckpt:
            step = ckpt.latest_step()
    except Exception:  # noqa: BLE001 - unreadable: say so below rather than fail while exiting
        step = None
    if step is None:
        return (f"{ended} before the first complete checkpoint; nothing to resume in {run_dir}: "
                "start again with a new --run-dir")
    return f"{ended} at checkpoint step {step}; {resume}"


def _newest_beam_round(run_dir: str) -> Optional[Tuple[int, int]]:
    """``(round, its last block)`` of the newest readable Beam round record, or None (no Beam rounds)."""
    from pipelines.beam.records import round_indices, round_path
    try:
        rounds = round_indices(run_dir)
        if not rounds:
            return None
        fs, path = round_path(run_dir, rounds[-1])
        with fs.open(path) as f:
            return rounds[-1], int(json.load(f)["last_block"])
    except Exception:  # noqa: BLE001 - unreadable: the checkpoint's line below rather than fail while exiting
        return None


def _close_progress_bars() -> None:
    """Close progress bars left open by the interrupted loop, so the resume line is the last one."""
    try:
        from tqdm import tqdm
        for bar in list(getattr(tqdm, "_instances", [])):
            bar.close()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def train(cfg, run_dir: str, progress: bool = True, resume: bool = False,
          pipeline_args: Optional[List[str]] = None, offline_dataset: Optional[str] = None) -> dict:
    """Run one training job with ``cfg`` into ``run_dir``; returns the summary.

    Holds the run-directory lock (:class:`core.run_lock.RunLock`) from before
    the first write to the end, so a second trainer on ``run_dir`` is refused
    (``RunDirInUse``) without writing anything.
    """
    from core.run_lock import RunLock
    from pipelines.run.setup import check_run_dir
    check_pipeline_args(cfg, pipeline_args or [], offline_dataset)
    with RunLock(run_dir):
        check_run_dir(run_dir, resume)     # a new run never reuses a directory that holds one
        return _train_locked(cfg, run_dir, progress, resume, pipeline_args, offline_dataset)


def _train_locked(cfg, run_dir: str, progress: bool, resume: bool, pipeline_args: Optional[List[str]],
                  offline_dataset: Optional[str]) -> dict:
    from pipelines.run.offline import recorded_dataset, train_offline
    if offline_dataset or (resume and recorded_dataset(run_dir)):    # an offline run resumes on its own dataset
        return train_offline(cfg, run_dir, offline_dataset, progress=progress, resume=resume)
    if cfg.inference == "central":  # SEED mode: env-only actors + inference server (pipelines/run/central.py)
        from pipelines.run.central import train_central
        return train_central(cfg, run_dir, progress=progress, resume=resume)
    if cfg.executor == "beam":
        from pipelines.beam.rounds import train_in_rounds
        return train_in_rounds(cfg, run_dir, pipeline_args or [], progress=progress, resume=resume)
    from pipelines.run.driver import Trainer
    from pipelines.executors.factory import run_with_executor
    return run_with_executor(Trainer, cfg, run_dir, progress, resume)


def clock_rows(summary: dict) -> List[List[str]]:
    """The run on one clock (``summary["clock"]``, pipelines.run.summary.run_clock): parts that add up."""
    clock = summary.get("clock") or {}
    if clock.get("startup_s") is None:        # no clock (an older summary) or no loop end (Beam)
        rows = [["training loop", f"{summary['wall_s']:.1f} s"]]
        if clock:
            rows.insert(0, ["start-up + end of run", f"{clock['startup_and_end_s']:.1f} s"])
    else:
        rows = [["start-up", f"{clock['startup_s']:.1f} s (process start to the training loop)"],
                ["training loop", f"{clock['training_loop_s']:.1f} s"],
                ["end of run", f"{clock['end_of_run_s']:.1f} s (final evaluation, summary)"]]
    if clock:
        rows.append(["since process start", f"{clock['since_process_start_s']:.1f} s (= the rows above)"])
    return rows


def print_summary(summary: dict) -> None:
    rows = [["env steps", f"{summary['env_steps']:,}"],
            ["learner steps", f"{summary['learner_steps']:,}"],
            *clock_rows(summary),
            ["env steps/s", f"{summary['env_steps_per_s']:,.0f} (env steps / training loop)"],
            ["policy versions", summary["policy_versions"]],
            ["bytes per broadcast", f"{summary['bytes_per_broadcast']:,} ({summary['precision']})"],
            ["best eval return", "- (no evaluation ran)" if summary["best_version"] < 0
             else f"{summary['best_eval_return']:.1f} (version {summary['best_version']})"],
            ["time to target", "-" if summary["time_to_target_s"] is None
             else f"{summary['time_to_target_s']:.1f} s from process start, "
                  f"{summary['env_steps_to_target']:,} env steps"]]
    for precision, r in summary["final_eval"].items():
        rows.append([f"final return ({precision})", f"{r['mean']:.1f} +- {r['std']:.1f}"])
    if summary.get("energy_kwh") is not None:
        rows.append(["energy", f"{summary['energy_kwh'] * 1000:.3f} Wh, {summary['co2e_kg'] * 1000:.3f} g CO2e "
                               f"({summary['carbon_backend']})"])
    print_table(["", summary["run_dir"]], rows)


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    # Unknown options are Beam pipeline options (--runner, --project, ...): passed through untouched.
    args, pipeline_args = parse_with_pipeline_args(build_parser(), argv)
    # A malformed URL: one line at once; an object store that does not answer: one line within seconds.
    check_locations(("--run-dir", args.run_dir), ("--resume", args.resume),
                    ("--offline-dataset", args.offline_dataset))
    cfg = resolve_config(args)                    # every value range-checked: nothing written yet
    if cfg.executor == "beam" and "--show-rounds" in pipeline_args:   # the round plan only: nothing written
        from pipelines.beam.rounds import show_rounds
        return show_rounds(cfg, pipeline_args)
    run_dir = args.resume or args.run_dir or cfg.run_dir or default_run_dir(cfg.name)
    if run_dir == cfg.run_dir and run_dir not in (args.resume, args.run_dir):
        check_locations(("the config's run_dir", run_dir))
    try:   # train() locks run_dir first: a directory in use is refused with nothing written
        summary = train(cfg, run_dir, progress=not args.no_progress, resume=bool(args.resume),
                        pipeline_args=pipeline_args, offline_dataset=args.offline_dataset)
    except KeyboardInterrupt:
        _close_progress_bars()
        raise Interrupted(interrupt_message(run_dir)) from None
    except WorkerLost as e:                      # a Beam round lost its worker process
        _close_progress_bars()
        print(f"error: {e}; {interrupt_message(run_dir, ended='stopped')}", file=sys.stderr)
        return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":  # Dask spawns workers that re-import __main__: keep this guard.
    exit_now(main())
