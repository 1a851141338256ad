"""Compare runs across precisions: ``python -m pipelines.report RUN_DIR... --out DIR``.

Writes ``DIR/report.md`` (one row per task x precision: time to target,
speedup vs fp32, final return vs fp32, energy, CO2e, carbon ratio),
``DIR/rows.json``, ``DIR/returns-<task>.png`` (return vs wall-clock and vs
env steps, one curve per precision, mean and min-max band over seeds) and
``DIR/speedup.png`` / ``DIR/carbon.png``. The logic is in :mod:`core.report`.

``python -m pipelines.report sweep SWEEP_DIR`` reports a sweep (:mod:`pipelines.sweeps.report`):
per config x setting, solved k/N, env steps and time to target (median, IQM), final return IQM with a
95% stratified bootstrap CI, the probability of improvement between settings, learning curves and
performance profiles, written next to ``sweep.json`` (``report.md``, ``report.json``, PNGs).

Example::

    python -m pipelines.report runs/cp-fp32-s0 runs/cp-fp32-s1 runs/cp-int8-s0 runs/cp-int8-s1 --out report/
    python -m pipelines.report sweep sweeps/precision
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from core.fast_exit import exit_now
from pipelines.cli import check_creatable_dir, check_locations, cli_errors


def sweep_main(argv: List[str]) -> int:
    """``python -m pipelines.report sweep SWEEP_DIR``: the sweep's report, written beside its sweep.json."""
    p = argparse.ArgumentParser(prog="python -m pipelines.report sweep",
                                description="Report a sweep (python -m pipelines.sweep): IQM, bootstrap CIs, "
                                            "probability of improvement, curves; files go next to sweep.json.")
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a directory written by python -m pipelines.sweep")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0: the same runs, the same CIs)")
    args = p.parse_args(argv)
    check_locations(("SWEEP_DIR", args.sweep_dir), probe=False)
    from pipelines.sweeps.report import write_sweep_report
    result = write_sweep_report(args.sweep_dir, seed=args.seed)
    print(result["table"])
    print(f"wrote {len(result['files'])} files to {args.sweep_dir}")
    return 0


@cli_errors
def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["sweep"]:        # a run directory named "sweep" is given as ./sweep
        return sweep_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m pipelines.report", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (local paths or URLs)")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory for report.md and PNGs")
    args = p.parse_args(argv)
    check_locations(*(("RUN_DIR", run_dir) for run_dir in args.run_dirs))
    check_creatable_dir(args.out, "--out")   # before reading every run
    from core import report as report_lib
    try:
        result = report_lib.write_report(report_lib.load_runs(args.run_dirs), args.out)
    except report_lib.ReportError as e:
        from core.config import ConfigError
        raise ConfigError(str(e)) from None   # one line, exit 2 (pipelines.cli)
    print(result["table"])
    print(f"wrote {len(result['files'])} files to {args.out}")
    return 0


if __name__ == "__main__":
    exit_now(main())
