"""The learning suite: every shipped config x several seeds as one sweep -> one JSON, a table and curves.

``python -m benchmarks.studies.learning_suite`` runs ``configs/sweeps/learning-suite.yml`` (every shipped
config, 5 seeds, ``configs/default.yaml`` 10, the V-trace central-inference variant) through the product's
sweep (:mod:`benchmarks.studies.suite_runs`: resumable, on the local, dask or beam executor; one run at a
time by default), then upserts one record per run into ``benchmarks/results/learning-suite.json``.

What a record holds: the config and its overrides (its ``label``: the config path plus them, the table
row it belongs to), seed, executor, ``reached``, ``env_steps_to_target``, ``time_to_target_s`` (from the
train process's start), ``final_return`` (best evaluated version, re-evaluated at the actors' precision),
``best_confirmed_return``, the evaluation curve, git commit, date, machine and the run's command. See
:func:`benchmarks.studies.suite_report.suite_record` and :func:`benchmarks.studies.suite_runs.run_record`.

Then it renders ``<report dir>/learning-suite.md`` (one table row per config label: target, solved k/N,
median env steps and time to target, median final return) and one PNG per label (median return and
min-max band over seeds, vs env steps and vs wall time) with :mod:`benchmarks.studies.suite_report`.

The sweep directory is ``RUNS_DIR/<commit>-<spec digest>``: the same commit and selection continue the
same sweep (``--resume``). Runs in a sweep use the local executor and one TensorFlow thread: the records
written before 2026-12-05 (the old one-subprocess-at-a-time loop) used each config's own executor.

Usage::

    python -m benchmarks.studies.learning_suite --quick       # configs/sweeps/learning-suite-quick.yml
    python -m benchmarks.studies.learning_suite               # configs/sweeps/learning-suite.yml
    python -m benchmarks.studies.learning_suite --resume      # continue the sweep of this commit and selection
    python -m benchmarks.studies.learning_suite --configs 'configs/actorq/*' --seeds 3 --workers 2
    python -m benchmarks.studies.learning_suite --render-only # table and PNGs from the JSON, no training
"""
from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import sys
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:   # run as a script or imported by tests: this checkout's core/pipelines/benchmarks
    sys.path.insert(0, REPO)

from benchmarks.common import git_state  # noqa: E402
from benchmarks.studies import suite_runs  # noqa: E402
from pipelines.cli import cli_errors  # noqa: E402

DEFAULT_CONFIG = "configs/default.yaml"
DEFAULT_SPEC = os.path.join("configs", "sweeps", "learning-suite.yml")
QUICK_SPEC = os.path.join("configs", "sweeps", "learning-suite-quick.yml")
DEFAULT_OUT = os.path.join("benchmarks", "results", "learning-suite.json")
QUICK_OUT = os.path.join("benchmarks", "results", "learning-suite-quick.json")
PRUNED = ("replay", "checkpoints", "best", "tb")

EPILOG = f"""
spec and seeds:
  The runs are {DEFAULT_SPEC} (--quick: {QUICK_SPEC}; --spec: another sweep spec file).
  --seeds N runs seeds 0..N-1 of every config, {DEFAULT_CONFIG} included unless --default-seeds N says
  otherwise; without them each entry keeps the spec's seeds (the suite: 5, {DEFAULT_CONFIG} 10).

selection:
  --configs and --exclude take shell-style patterns matched against an entry's config path
  ('configs/actorq/*', '*vtrace*'), its file name ('default.yaml'), its name in the spec
  ('cartpole-vtrace-central') or its label ('configs/cartpole-vtrace.yaml inference=central').

records and resume:
  A record's label is its config path plus its overrides (the entry's set, the spec's set, --set), so
  runs with different overrides are different rows. A new record replaces one of the same commit + label
  + seed. The sweep directory is RUNS_DIR/<commit>-<digest of the spec>; --resume continues it (finished
  runs are not run again, stopped ones continue from their checkpoint, failed ones run again); without
  --resume an existing one is refused. python -m pipelines.sweep --resume DIR continues it as well.

examples:
  python -m benchmarks.studies.learning_suite --quick
  python -m benchmarks.studies.learning_suite --resume --prune --workers 2
  python -m benchmarks.studies.learning_suite --configs configs/default.yaml --seeds 1 --set total_env_steps=2048
  python -m benchmarks.studies.learning_suite --exclude configs/pong-vtrace.yaml --dry-run
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.learning_suite",
                                description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", metavar="YML", help=f"sweep spec file (default {DEFAULT_SPEC})")
    p.add_argument("--configs", nargs="+", metavar="PATTERN", help="run only these entries (see selection)")
    p.add_argument("--exclude", nargs="+", metavar="PATTERN", default=[], help="leave these entries out")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per config: 0..N-1 (default: the spec's)")
    p.add_argument("--default-seeds", type=int, metavar="N", help=f"seeds for {DEFAULT_CONFIG} (see seeds)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run, applied after the spec's (repeatable)")
    p.add_argument("--quick", action="store_true", help=f"the quick subset: {QUICK_SPEC}")
    p.add_argument("--out", metavar="JSON", help=f"records file (default {DEFAULT_OUT}; --quick {QUICK_OUT})")
    p.add_argument("--report-dir", metavar="DIR",
                   help="where learning-suite.md and the PNGs go (default: --out without .json)")
    p.add_argument("--runs-dir", metavar="DIR", default=os.path.join("runs", "learning-suite"),
                   help="parent of the sweep directories (default runs/learning-suite)")
    p.add_argument("--resume", action="store_true", help="continue this commit's sweep of this selection")
    p.add_argument("--render-only", action="store_true", help="render the table and PNGs from --out; run nothing")
    p.add_argument("--commit", metavar="SHA",
                   help="render the records of this commit (default: per config label, HEAD's if recorded, else its newest "
                        "record's commit)")
    p.add_argument("--dry-run", action="store_true", help="print the planned runs and their commands; run nothing")
    p.add_argument("--prune", action="store_true",
                   help=f"after the sweep, delete each finished run's {', '.join(PRUNED)}/ (curves and summary stay)")
    p.add_argument("--run-timeout", type=float, metavar="S", help=argparse.SUPPRESS)
    suite_runs.add_sweep_options(p)
    return p


# -- the spec: selection, seeds, overrides ----------------------------------------------------------------------------
def _entry_label(entry) -> str:
    return " ".join([entry.config, *entry.overrides])


def _matches(entry, pattern: str) -> bool:
    names = (entry.config, os.path.basename(entry.config), entry.label, _entry_label(entry))
    return any(fnmatch.fnmatchcase(name, pattern) for name in names)


def study_spec(args: argparse.Namespace):
    """The spec file's :class:`SweepSpec`, narrowed by --configs/--exclude, with --seeds and --set applied."""
    from core.config import ConfigError
    from pipelines.sweeps.spec import ConfigEntry, read_spec
    spec = read_spec(os.path.join(REPO, args.spec or (QUICK_SPEC if args.quick else DEFAULT_SPEC)))
    entries = spec.entries()
    if args.configs:
        chosen: List[ConfigEntry] = []
        for pat in args.configs:
            found = [e for e in entries if _matches(e, pat)]
            if not found and pat.endswith((".yaml", ".yml")) and os.path.isfile(os.path.join(REPO, pat)):
                found = [ConfigEntry(os.path.relpath(os.path.join(REPO, pat), REPO).replace(os.sep, "/"))]
            if not found:
                raise ConfigError(f"--configs {pat!r} matches no config of the spec; its configs: "
                                  f"{', '.join(sorted({e.config for e in entries}))}")
            chosen += [e for e in found if e not in chosen]
        entries = chosen
    entries = [e for e in entries if not any(_matches(e, pat) for pat in args.exclude)]
    if not entries:
        raise ConfigError("--exclude leaves no config to run; valid: patterns that leave at least one")
    for n in (args.seeds, args.default_seeds):
        if n is not None and n < 1:
            raise ConfigError(f"--seeds / --default-seeds must be >= 1 (got {n})")
    seeds = list(range(args.seeds)) if args.seeds is not None else None
    default = list(range(args.default_seeds)) if args.default_seeds is not None else seeds
    for i, e in enumerate(entries):
        own = default if e.config == DEFAULT_CONFIG else seeds
        if own is not None:
            entries[i] = dataclasses.replace(e, seeds=own)
    spec.configs = [dataclasses.replace(e, config=os.path.join(REPO, e.config)) for e in entries]  # any cwd
    spec.overrides = spec.overrides + list(args.overrides)
    return spec


def sweep_dir(runs_dir: str, commit: str, spec) -> str:
    """``RUNS_DIR/<commit12>-<spec digest>``: one sweep per commit and selection."""
    digest = hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
    return os.path.abspath(os.path.join(runs_dir, f"{commit[:12]}-{digest}"))


def suite_records(sweep, runs, commit: str, dirty: bool) -> List[Dict[str, Any]]:
    """One record per run that ended: :func:`suite_runs.run_record` plus the suite's fields."""
    from benchmarks.studies.suite_report import suite_record
    from core.config import load_config
    out = []
    for run in runs:
        rec = suite_runs.run_record(sweep, run, commit, dirty)
        if rec is None:
            continue
        rec["label"] = " ".join([rec["config"], *rec["overrides"]])
        if rec["status"] == "ok":
            rec.update(suite_record(rec["run_dir"]))
        else:
            cfg = load_config(run.config, list(run.overrides))
            rec.update(executor="local", target_return=float(cfg.eval.target_return), reached=False,
                       env_steps_to_target=None, time_to_target_s=None, final_return=None, ended_at_target=False,
                       best_confirmed_return=None, curve=[])
        out.append(rec)
    return out


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
def _print_plan(spec, runs_dir: str, commit: str) -> None:
    from pipelines.sweeps.spec import expand
    root = sweep_dir(runs_dir, commit, spec)
    runs = expand(spec)
    for run in runs:
        args = run.train_args(os.path.join(root, "runs", run.name))
        print(shlex.join(["python", "-m", "pipelines.train", *args]))
    print(f"{len(runs)} runs -> {root}")


def _run(args: argparse.Namespace, records: List[Dict[str, Any]], out: str) -> int:
    """Run (or continue) the suite's sweep and upsert its records into ``out``; the sweep's exit status."""
    from core.config import ConfigError
    spec = study_spec(args)
    commit, dirty = git_state()
    if args.dry_run:
        _print_plan(spec, args.runs_dir, commit)
        return 0
    root = sweep_dir(args.runs_dir, commit, spec)
    exists = os.path.exists(os.path.join(root, "sweep.json"))
    if exists and not args.resume:
        raise ConfigError(f"this commit's sweep of this selection is in {root}; valid: --resume to continue it, "
                          f"or another --runs-dir")
    sweep, runs, result = suite_runs.run_study(spec, root, args, resume=exists)
    for rec in suite_records(sweep, runs, commit, dirty):
        upsert(records, rec)
        if args.prune and rec["status"] == "ok":
            for name in PRUNED:
                shutil.rmtree(os.path.join(rec["run_dir"], name), ignore_errors=True)
    save_records(out, records)
    return suite_runs.print_outcome(sweep, runs, result)


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.run_timeout is not None:
        from core.config import ConfigError
        raise ConfigError("--run-timeout is gone: the suite runs through python -m pipelines.sweep, which stops "
                          "runs only by signal; valid: a smaller --set total_env_steps=N, or Ctrl-C then --resume")
    out = args.out or os.path.join(REPO, QUICK_OUT if args.quick else DEFAULT_OUT)
    report_dir = args.report_dir or (out[:-5] if out.endswith(".json") else out + "-report")
    records = load_records(out)
    if not args.render_only:
        code = _run(args, records, out)
        if args.dry_run or code == suite_runs.STOPPED:
            return code
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
