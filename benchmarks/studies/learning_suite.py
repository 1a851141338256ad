"""The learning suite: every shipped config x several seeds -> one JSON, a table and curves.

``python -m benchmarks.studies.learning_suite`` trains each selected config for each
seed, every run a fresh ``python -m pipelines.train --config C --seed S
--run-dir DIR`` subprocess, one at a time (the machine has 2 cores), and
appends one record per run to ``benchmarks/results/learning-suite.json``
(written after every run). Runs go seed by seed across configs (seed 0 of
every config, then seed 1, ...), so an interrupted sweep already covers every
config and slow drifts in machine load hit all configs alike.

What a record holds: the config and its overrides, seed, executor,
``reached``, ``env_steps_to_target``, ``time_to_target_s`` (from the train
process's start: imports, cluster start-up and evaluations included),
``final_return`` (best evaluated version, re-evaluated at the actors'
precision), ``best_confirmed_return``, the evaluation curve, git commit,
date, machine, load average, the command. See :func:`benchmarks.studies.suite_report.suite_record`.

Then it renders ``<report dir>/learning-suite.md`` (one table row per config:
target, solved k/N, median env steps and time to target, median final return)
and one ``<config>.png`` per config (median return and min-max band over seeds,
vs env steps and vs wall time) with :mod:`benchmarks.studies.suite_report`.

Usage::

    python -m benchmarks.studies.learning_suite --quick       # default + cartpole-vtrace, 2 seeds, small budgets
    python -m benchmarks.studies.learning_suite               # every shipped config: 5 seeds, configs/default.yaml 10
    python -m benchmarks.studies.learning_suite --resume      # continue: skip runs already recorded for this commit
    python -m benchmarks.studies.learning_suite --configs 'configs/actorq/*' --seeds 3
    python -m benchmarks.studies.learning_suite --render-only # table and PNGs from the JSON, no training
"""
from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import shlex
import shutil
import sys
from typing import Any, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:   # run as a script or imported by tests: this checkout's core/pipelines/benchmarks
    sys.path.insert(0, REPO)

from benchmarks.common import git_state  # noqa: E402
from benchmarks.studies.suite_runs import EtaModel, PlannedRun, run_one  # noqa: E402
from pipelines.cli import cli_errors  # noqa: E402

DEFAULT_CONFIG = "configs/default.yaml"
DEFAULT_OUT = os.path.join("benchmarks", "results", "learning-suite.json")
QUICK_OUT = os.path.join("benchmarks", "results", "learning-suite-quick.json")
#: extra suite entries beside each shipped file: V-trace CartPole runs with local and with central inference
VARIANTS: Dict[str, List[tuple]] = {"configs/cartpole-vtrace.yaml": [("inference=central",)]}
#: --quick: these configs with reduced budgets (both usually solve well inside them on a quiet machine)
QUICK: Dict[str, tuple] = {"configs/default.yaml": ("total_env_steps=40000",),
                           "configs/cartpole-vtrace.yaml": ("total_env_steps=200000",)}
PRUNED = ("replay", "checkpoints", "best", "tb")

EPILOG = f"""
seeds:
  Seeds are 0..N-1. {DEFAULT_CONFIG} runs --default-seeds seeds (default 10); if only --seeds is given it
  applies to {DEFAULT_CONFIG} too; every other config runs --seeds seeds (default 5). --quick: 2 seeds each
  unless --seeds / --default-seeds say otherwise.

selection:
  --configs and --exclude take shell-style patterns matched against the config path
  ('configs/actorq/*', '*vtrace*'), its file name ('default.yaml') or its suite label
  ('configs/cartpole-vtrace.yaml inference=central'); an existing YAML path outside configs/ is run as it is.
  By default every configs/**/*.yaml runs, plus these variants (V-trace local and central inference):
  {'; '.join(f"{c} {' '.join(v)}" for c, vs in VARIANTS.items() for v in vs)}.

records and resume:
  A record's label is its config path plus its overrides (variant, --quick budget, --set), so runs with
  different overrides are different rows. A new record replaces an earlier one of the same
  commit + label + seed. --resume skips those already recorded with status ok (failed runs run again);
  a finished run directory with no record yet (the suite was interrupted after it) is harvested.
  Run directories: RUNS_DIR/<commit>/<label>/seed-<S>, with the run's output in seed-<S>.log.

quick:
  --quick runs {', '.join(f"{c} ({' '.join(o)})" for c, o in QUICK.items())}, 2 seeds, into {QUICK_OUT}
  (estimated 3-6 minutes on a quiet 2-core machine from
  the single-seed timings in docs/notebook/2026-11-results-history.md; not yet measured).

examples:
  python -m benchmarks.studies.learning_suite --quick
  python -m benchmarks.studies.learning_suite --resume --prune
  python -m benchmarks.studies.learning_suite --configs configs/default.yaml --seeds 1 --set total_env_steps=2048
  python -m benchmarks.studies.learning_suite --exclude configs/pong-vtrace.yaml --dry-run
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.learning_suite",
                                description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", metavar="PATTERN", help="run only these configs (see selection)")
    p.add_argument("--exclude", nargs="+", metavar="PATTERN", default=[], help="leave these configs out")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per config: 0..N-1 (default 5; --quick 2)")
    p.add_argument("--default-seeds", type=int, metavar="N",
                   help=f"seeds for {DEFAULT_CONFIG} (default 10, or --seeds if only that is given; --quick 2)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run, applied last (repeatable), e.g. --set executor=local")
    p.add_argument("--quick", action="store_true", help="small subset with reduced budgets (see quick)")
    p.add_argument("--out", metavar="JSON", help=f"records file (default {DEFAULT_OUT}; --quick {QUICK_OUT})")
    p.add_argument("--report-dir", metavar="DIR",
                   help="where learning-suite.md and the PNGs go (default: --out without .json)")
    p.add_argument("--runs-dir", metavar="DIR", default=os.path.join("runs", "learning-suite"),
                   help="parent of the run directories (default runs/learning-suite)")
    p.add_argument("--resume", action="store_true", help="skip runs already recorded for this commit (see above)")
    p.add_argument("--render-only", action="store_true", help="render the table and PNGs from --out; run nothing")
    p.add_argument("--commit", metavar="SHA",
                   help="render the records of this commit (default: per config label, HEAD's if recorded, else its newest "
                        "record's commit)")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs and their commands; run nothing")
    p.add_argument("--prune", action="store_true",
                   help=f"after a run is recorded, delete its {', '.join(PRUNED)}/ (curves and summary stay)")
    p.add_argument("--run-timeout", type=float, metavar="S",
                   help="kill a run after S seconds and record it as failed (default: no limit)")
    p.add_argument("--no-progress", action="store_true",
                   help="plain log lines (one a minute per run, with the ETA) instead of progress bars; "
                        "automatic when stderr is not a terminal")
    return p


# -- selection and plan -----------------------------------------------------------------------------------------------
def shipped_configs() -> List[str]:
    """Every ``configs/**/*.yaml``, repo-relative, sorted."""
    paths = glob.glob(os.path.join(REPO, "configs", "**", "*.yaml"), recursive=True)
    return sorted(os.path.relpath(p, REPO).replace(os.sep, "/") for p in paths)


def suite_entries(configs: Sequence[str]) -> List[tuple]:
    """``(config, variant overrides)`` per suite entry: each file, then its :data:`VARIANTS`."""
    return [(c, v) for c in configs for v in [()] + VARIANTS.get(c, [])]


def _matches(entry: tuple, pattern: str) -> bool:
    config, variant = entry
    label = " ".join((config,) + tuple(variant))
    return any(fnmatch.fnmatchcase(name, pattern) for name in (config, os.path.basename(config), label))


def select_entries(patterns: Optional[Sequence[str]], exclude: Sequence[str]) -> List[tuple]:
    """The suite entries named by ``patterns`` (all when None) minus ``exclude``; ConfigError if one matches nothing."""
    from core.config import ConfigError
    entries = suite_entries(shipped_configs())
    if patterns:
        chosen: List[tuple] = []
        for pat in patterns:
            found = [e for e in entries if _matches(e, pat)]
            if not found and pat.endswith((".yaml", ".yml")) and os.path.isfile(os.path.join(REPO, pat)):
                found = [(os.path.relpath(os.path.join(REPO, pat), REPO).replace(os.sep, "/"), ())]
            if not found:
                raise ConfigError(f"--configs {pat!r} matches no config; shipped: "
                                  f"{', '.join(sorted({e[0] for e in entries}))}")
            chosen += [e for e in found if e not in chosen]
        entries = chosen
    return [e for e in entries if not any(_matches(e, pat) for pat in exclude)]


def seed_counts(args: argparse.Namespace) -> tuple:
    """``(seeds for every config, seeds for configs/default.yaml)`` (see the epilog)."""
    seeds = args.seeds if args.seeds is not None else (2 if args.quick else 5)
    default = args.default_seeds
    if default is None:
        default = args.seeds if args.seeds is not None else (2 if args.quick else 10)
    from core.config import ConfigError
    if seeds < 1 or default < 1:
        raise ConfigError(f"--seeds / --default-seeds must be >= 1 (got {seeds} / {default})")
    return seeds, default


def plan_runs(entries: Sequence[tuple], seeds: int, default_seeds: int, overrides: Sequence[str],
              quick: bool = False) -> List[PlannedRun]:
    """Runs seed by seed across entries; each config is loaded with its overrides now, so a bad --set fails early."""
    per_entry = []
    for config, variant in entries:
        extra = tuple(variant) + (QUICK.get(config, ()) if quick else ()) + tuple(overrides)
        n = default_seeds if config == DEFAULT_CONFIG else seeds
        per_entry.append([PlannedRun.resolve(config, extra, s) for s in range(n)])
    longest = max((len(runs) for runs in per_entry), default=0)
    return [runs[i] for i in range(longest) for runs in per_entry if i < len(runs)]


# -- records file -----------------------------------------------------------------------------------------------------
def load_records(path: str) -> List[Dict[str, Any]]:
    if not os.path.exists(path):
        return []
    try:
        with open(path) as f:
            data = json.load(f)
        return list(data["runs"])
    except (ValueError, KeyError, TypeError) as e:
        from core.config import ConfigError
        raise ConfigError(f"{path} is not a learning-suite records file ({e}); pass another --out") from None


def save_records(path: str, records: List[Dict[str, Any]]) -> None:
    """Write atomically (temp file + rename): an interrupted write never loses earlier records."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"suite": "databloom learning suite", "schema": 1, "runs": records}, f, indent=1)
    os.replace(tmp, path)


def record_key(r: Dict[str, Any]) -> tuple:
    return r["git_commit"], r["label"], r["seed"]


def upsert(records: List[Dict[str, Any]], rec: Dict[str, Any]) -> None:
    """Replace the record of the same commit + label + seed, or append."""
    for i, r in enumerate(records):
        if record_key(r) == record_key(rec):
            records[i] = rec
            return
    records.append(rec)


def latest_per_label(records: List[Dict[str, Any]], head: Optional[str]) -> List[Dict[str, Any]]:
    """Each label's records at one commit: HEAD's where HEAD recorded that label, else its newest record's.

    A sweep of one config at a later commit thus replaces that config's rows
    and leaves the other configs' (each row names its commit in the notes).
    """
    chosen: Dict[str, str] = {}
    for label in dict.fromkeys(r["label"] for r in records):
        rs = [r for r in records if r["label"] == label]
        chosen[label] = head if any(r["git_commit"] == head for r in rs) else \
            max(rs, key=lambda r: r["date"])["git_commit"]
    return [r for r in records if r["git_commit"] == chosen[r["label"]]]


def render(records: List[Dict[str, Any]], report_dir: str, commit: Optional[str]) -> Optional[Dict[str, Any]]:
    """Table and PNGs: ``commit``'s records, or (None) each label's at its chosen commit (:func:`latest_per_label`)."""
    from benchmarks.studies.suite_report import write_suite_report
    if not records:
        return None
    commits = {r["git_commit"] for r in records}
    if commit:
        rs = [r for r in records if r["git_commit"].startswith(commit)]
    else:
        rs = latest_per_label(records, git_state()[0])
    if not rs:
        from core.config import ConfigError
        raise ConfigError(f"--commit {commit!r} has no records; recorded: {', '.join(sorted(commits))}")
    dates = sorted(r["date"] for r in rs)
    m = rs[0].get("machine", {})
    by_commit: Dict[str, List[str]] = {}
    for r in rs:
        labels = by_commit.setdefault(r["git_commit"], [])
        if r["label"] not in labels:
            labels.append(r["label"])
    notes = [f"commit {c}{' (uncommitted changes)' if any(r.get('git_dirty') for r in rs if r['git_commit'] == c) else ''}"
             + ("" if len(by_commit) == 1 else ": " + ", ".join(labels)) for c, labels in by_commit.items()]
    notes += [f"{len(rs)} runs, {dates[0]} to {dates[-1]}, machine: {m.get('cpu', '?')} x {m.get('cores', '?')}",
              "command per run: `" + rs[0]["command"] + "` (config and seed vary)"]
    return write_suite_report(rs, report_dir, notes=notes)


# -- main -------------------------------------------------------------------------------------------------------------
def _print_plan(plan: Sequence[PlannedRun], runs_dir: str, commit: str) -> None:
    for run in plan:
        print(shlex.join(run.command(run.run_dir(runs_dir, commit))))
    print(f"{len(plan)} runs, {sum(r.budget for r in plan):,} env steps at most")


def _prune(run_dir: str) -> None:
    for name in PRUNED:
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)


def run_plan(plan: Sequence[PlannedRun], records: List[Dict[str, Any]], args: argparse.Namespace,
             out: str) -> None:
    """Run (or skip, with --resume) each planned run and save the records after every one."""
    commit, dirty = git_state()
    done = {record_key(r) for r in records if r.get("status") == "ok"} if args.resume else set()
    todo = [r for r in plan if (commit, r.label, r.seed) not in done]
    print(f"{len(plan)} runs planned, {len(plan) - len(todo)} already recorded, {len(todo)} to run -> {out}",
          flush=True)
    eta = EtaModel(records)
    progress = not args.no_progress and sys.stderr.isatty()   # bars need a terminal; logs get plain lines
    overall = _overall_bar(len(todo)) if progress else None
    for i, run in enumerate(todo):
        run_dir = run.run_dir(args.runs_dir, commit)

        def tick(elapsed: float, rest=todo[i:]) -> str:
            text = eta.text(rest, elapsed)
            if overall is not None:
                overall.set_postfix_str(text)   # also refreshes the elapsed time
            return text
        text = tick(0.0)
        if overall is None:
            print(f"[{i + 1}/{len(todo)}] {run.label} seed {run.seed} ({run.budget:,} env steps at most); {text}",
                  flush=True)
        rec = run_one(run, run_dir, commit, dirty, timeout=args.run_timeout, progress=progress, on_tick=tick,
                      harvest=args.resume)
        upsert(records, rec)
        save_records(out, records)
        eta.add(rec)
        if args.prune:
            _prune(run_dir)
        line = f"[{i + 1}/{len(todo)}] {run.label} seed {run.seed}: {_outcome(rec)}"
        if overall is not None:
            overall.update(1)
            overall.write(line)
        else:
            print(line, flush=True)
    if overall is not None:
        overall.close()


def _outcome(rec: Dict[str, Any]) -> str:
    """``reached 475 at 24,576 env steps / 41.2 s, final 488.5, 52 s`` (or why the run failed)."""
    if rec["status"] != "ok":
        return f"{rec['status']}: {rec.get('error', '')}"
    wall = "" if rec.get("process_wall_s") is None else f", {rec['process_wall_s']:.0f} s"
    final = "-" if rec.get("final_return") is None else f"{rec['final_return']:.1f}"
    if rec["reached"]:
        return (f"reached {rec['target_return']:g} at {rec['env_steps_to_target']:,} env steps / "
                f"{rec['time_to_target_s']:.1f} s, final {final}{wall}")
    return f"not reached ({rec['target_return']:g}) in {rec.get('env_steps') or 0:,} env steps, final {final}{wall}"


def _overall_bar(total: int):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="suite", unit="run", position=0, dynamic_ncols=True,
                bar_format="{desc}: {n}/{total} runs |{bar:20}| {elapsed} elapsed{postfix}")


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    out = args.out or os.path.join(REPO, QUICK_OUT if args.quick else DEFAULT_OUT)
    report_dir = args.report_dir or (out[:-5] if out.endswith(".json") else out + "-report")
    records = load_records(out)
    if not args.render_only:
        seeds, default_seeds = seed_counts(args)
        if args.quick and not args.configs:   # the quick subset: its files only, no variants
            entries = [(c, ()) for c in QUICK if not any(_matches((c, ()), pat) for pat in args.exclude)]
        else:
            entries = select_entries(args.configs, args.exclude)
        plan = plan_runs(entries, seeds, default_seeds, args.overrides, quick=args.quick)
        if args.dry_run:
            _print_plan(plan, args.runs_dir, git_state()[0])
            return 0
        try:
            run_plan(plan, records, args, out)
        except KeyboardInterrupt:
            print(f"interrupted; finished runs are in {out} (continue with --resume)", file=sys.stderr)
            return 130
    result = render(records, report_dir, args.commit)
    if result is None:
        print(f"no records in {out}; nothing to render")
        return 0
    print(result["table"])
    print(f"records: {out}\nreport: {os.path.join(report_dir, 'learning-suite.md')} "
          f"({len(result['files']) - 1} PNGs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
