"""Process an offline dataset (a replay store): ``python -m pipelines.process COMMAND STORE ...``.

Every command runs on Apache Beam (default: the DirectRunner, in this
process; other Beam options such as ``--runner DataflowRunner`` pass through)
or on Dask (``--executor dask``: a LocalCluster, or ``--dask-address``), over
a local path or URL, and gives identical results on both. The logic lives in
``core.dataset``; this is only the command line.

Examples::

    python -m pipelines.process stats runs/cartpole-dqn/replay
    python -m pipelines.process filter data/cartpole --min-return 400 --out data/cartpole-expert
    python -m pipelines.process compact runs/cartpole-dqn/replay --executor dask
    python -m pipelines.process export data/cartpole --format rlds --out data/cartpole-rlds
    python -m pipelines.process relabel data/cartpole --n-step 3 --discount 0.99
    python -m pipelines.process repair runs/cartpole-dqn/replay --truncate-after 41        # dry run
    python -m pipelines.process repair runs/cartpole-dqn/replay --truncate-after 41 --yes  # apply

``repair`` fixes a damaged commit log ("commit log is damaged at version N"; the
error names the command): it makes version N-1 the latest by removing later
entries and log checkpoints (``core.replay.repair``); shard data is left for
gc. It writes nothing without ``--yes``; run it with no writer on the store.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import List, Optional

from core.fast_exit import exit_now
from pipelines.cli import check_locations, check_output_file, cli_errors, parse_with_pipeline_args, print_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.process", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("store", metavar="STORE", help="replay store: a local path or URL (gs://, s3://, memory://)")
    common.add_argument("--executor", default="beam", metavar="beam|dask|local",
                        help="engine: 'beam' (default; DirectRunner in-process unless Beam options say otherwise),"
                             " 'dask' (LocalCluster or --dask-address), 'local' (one process, debugging)")
    common.add_argument("--dask-address", metavar="tcp://HOST:PORT", help="join an existing Dask scheduler")
    common.add_argument("--version", type=int, help="read the store at this commit-log version (default: latest)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = sub.add_parser("stats", parents=[common], help="episodes, steps, returns, per policy version and actor")
    s.add_argument("--plot", metavar="PNG", help="return histogram (default: <store name>-returns.png)")
    s.add_argument("--json", metavar="PATH", help="also write the statistics as JSON")
    s.add_argument("--bins", type=int, default=20, help="histogram bins (default 20)")
    f = sub.add_parser("filter", parents=[common], help="copy episodes with return >= X into a new store")
    f.add_argument("--min-return", type=float, required=True, metavar="X")
    f.add_argument("--out", required=True, metavar="NEW_STORE")
    c = sub.add_parser("compact", parents=[common], help="merge small shards into large ones (one atomic swap)")
    c.add_argument("--target-mib", type=float, default=64.0, help="raw MiB per merged shard (default 64)")
    e = sub.add_parser("export", parents=[common], help="export as RLDS (a TFDS dataset) or Parquet (an Arrow dataset)")
    e.add_argument("--format", required=True, metavar="rlds|parquet")
    e.add_argument("--out", required=True, metavar="PATH")
    r = sub.add_parser("relabel", parents=[common], help="add n-step return columns (one atomic swap)")
    r.add_argument("--n-step", type=int, required=True, metavar="N")
    r.add_argument("--discount", type=float, required=True, metavar="G")
    _add_repair_parser(sub)
    return p


def _add_repair_parser(sub) -> None:
    rp = sub.add_parser("repair", help="truncate a damaged commit log after version N (dry run without --yes)")
    rp.add_argument("store", metavar="STORE", help="replay store: a local path or URL")
    rp.add_argument("--truncate-after", type=int, required=True, metavar="N",
                    help="keep log versions 1..N; remove later entries and log checkpoints")
    rp.add_argument("--yes", action="store_true", help="apply (default: only show what would be removed)")


def repair(args: argparse.Namespace) -> int:
    """``process repair``: show the truncation plan; apply it with ``--yes``."""
    from core.replay import repair as repair_lib
    plan = repair_lib.plan_truncate(args.store, args.truncate_after)
    print("\n".join(repair_lib.describe(plan)))
    later = _checkpoints_after(plan.store_url, plan.after)
    if later:  # kept: learned parameters are not the log's to delete
        print(f"note: model checkpoints at learner steps {later} were saved at replay log versions after"
              f" {plan.after}; --resume from them continues with the shorter log")
    if not plan.changes:
        return 0
    if not args.yes:
        print("dry run: nothing was changed; rerun with --yes to apply")
        return 0
    repair_lib.apply_truncate(plan)
    print(f"done: the log of {plan.store_url} now ends at version {plan.after}")
    return 0


def _checkpoints_after(store_url: str, version: int) -> List[int]:
    """Steps of the model checkpoints beside a run's store (``<run>/replay`` -> ``<run>/checkpoints``)
    whose metadata records a replay log version after ``version``."""
    from core import urls
    from core.checkpoint import CheckpointError, Checkpointer
    run, name = (store_url.rstrip("/").rsplit("/", 1) + [""])[:2]
    if name != "replay":
        return []
    try:
        with Checkpointer(urls.join(run, "checkpoints"), keep_last=None) as ckpt:
            return [s for s in ckpt.all_steps() if int(ckpt.metadata(s).get("replay_log_version", 0)) > version]
    except CheckpointError:
        return []  # no readable checkpoint directory beside the store: nothing to note


def _print_stats(s: dict) -> None:
    d = s["return"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    print_table(["store", "version", "shards", "rows", "transitions", "episodes", "incomplete",
                 "mean length"],
                [[s["store"], s["version"], s["shards"], f"{s['rows']:,}", f"{s['transitions']:,}",
                  f"{s['episodes']:,}", s["incomplete_episodes"], fmt(s["episode_length"]["mean"])]])
    print()
    print_table(["return", "mean", "std", "min", "p25", "median", "p75", "max"],
                [["", *(fmt(d[k]) for k in ("mean", "std", "min", "p25", "median", "p75", "max"))]])
    for key, rows in (("policy_version", s["per_policy_version"]), ("actor", s["per_actor"])):
        print()
        print_table([key.replace("_", " "), "rows", "episodes", "mean return"],
                    [[r[key], f"{r['rows']:,}", r["episodes"], fmt(r["mean_return"])] for r in rows])


def stats_plot_path(args: argparse.Namespace) -> str:
    """Where ``stats`` writes its histogram: ``--plot``, or ``<store name>-returns.png`` here."""
    from core import urls
    name = os.path.basename(urls.normalize(args.store).rstrip("/")) or "store"
    return args.plot or f"{name}-returns.png"


def run(args: argparse.Namespace, pipeline_args: List[str]) -> dict:
    import contextlib

    from core.dataset import compact, export, relabel, shards, stats
    from core.dataset import filter as filter_lib
    from core.dataset.errors import DatasetError
    if args.command == "export":  # before any engine starts: bad format, or rlds without its extra
        export.check_format(args.format)
    if args.command == "stats" and args.bins < 1:
        raise DatasetError(f"--bins {args.bins} invalid; valid: >= 1")
    if args.command == "stats":   # the outputs, before the (long) statistics pass
        check_output_file(stats_plot_path(args), "--plot")
        check_output_file(args.json, "--json")
    from core.config import check_dask_address
    check_dask_address(args.dask_address, "--dask-address")   # a typo: one line, before any engine
    # A bad, empty, damaged-log or lost-chunk store fails here, in one line, before an engine starts.
    shards.verify_snapshot(*shards.open_snapshot(args.store, args.version))
    from pipelines.executors.factory import make_pass_executor
    with contextlib.closing(make_pass_executor(args.executor, pipeline_args, args.dask_address)) as engine:
        if args.command == "stats":
            result = stats.compute_stats(engine, args.store, args.version, bins=args.bins)
        elif args.command == "filter":
            result = filter_lib.filter_store(engine, args.store, args.out, args.min_return, args.version)
        elif args.command == "compact":
            result = compact.compact_store(engine, args.store, int(args.target_mib * (1 << 20)), args.version)
        elif args.command == "export":
            result = export.export_store(engine, args.store, args.format, args.out, args.version)
        else:
            result = relabel.relabel_store(engine, args.store, args.n_step, args.discount, args.version)
    return result


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args, pipeline_args = parse_with_pipeline_args(build_parser(), argv)
    check_locations(("STORE", args.store), ("--out", getattr(args, "out", None)))
    if args.command == "repair":  # no engine: a few small reads and deletes
        if pipeline_args:
            from core.dataset.errors import DatasetError
            raise DatasetError(f"unrecognized arguments: {' '.join(pipeline_args)}")
        return repair(args)
    result = run(args, pipeline_args)
    if args.command == "stats":
        from core.dataset.stats import plot_returns
        _print_stats(result)
        print(f"\nreturn histogram: {plot_returns(result, stats_plot_path(args))}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    else:
        print_table(["", ""], [[k, v] for k, v in result.items() if k not in ("files", "columns")])
    return 0


if __name__ == "__main__":  # Dask spawns workers that re-import __main__: keep this guard.
    exit_now(main())
