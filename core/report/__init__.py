"""Reports from run directories: the ActorQ comparison (precisions x seeds) and the learning suite (configs x seeds).

This module is the public surface; the work is in four modules of one concept each::

    run dirs --report_runs.load_runs--> [Run] --report_actorq--> report.md, rows.json, *.png
    run dir  --report_suite.suite_record--> record --report_suite--> learning-suite.md, <config>.png
                 (both plot with report_format.band_on_grid)

* :mod:`core.report_runs`: load run directories, group by task, refuse runs
  whose configs differ beyond ``actors.precision`` and ``seed`` (:class:`ReportError`);
* :mod:`core.report_actorq`: per task x precision over seeds, relative to fp32
  (time to target, speedup, final return, energy, CO2e, throughput) and its plots;
* :mod:`core.report_suite`: one JSON record per run and one row and plot per config label;
* :mod:`core.report_format`: curve bands on one grid, table cells, file-name slugs.

Example::

    runs = load_runs(["runs/a-fp32-s0", "runs/a-int8-s0", ...])
    rows = summarize(runs)
    write_report(runs, "report/")         # report.md, returns_*.png, speedup.png, carbon.png

    records = [dict(suite_record(d), label="configs/default.yaml", seed=s) for s, d in enumerate(dirs)]
    write_suite_report(records, "suite/")  # learning-suite.md, configs-default-yaml.png
"""
from __future__ import annotations

from core.report_actorq import (curves, markdown_table, plot_bars, plot_returns, ratio_bars, summarize,
                                write_report)
from core.report_format import band_on_grid
from core.report_runs import (VARYING_KEYS, ReportError, Run, check_comparable, group_by_task, load_run,
                              load_runs, save_report_record)
from core.report_suite import (first_hit, median_to_target, plot_suite_curves, suite_markdown_table,
                               suite_record, suite_rows, training_curve, write_suite_report)

__all__ = [
    "VARYING_KEYS", "ReportError", "Run", "band_on_grid", "check_comparable", "curves", "first_hit",
    "group_by_task", "load_run", "load_runs", "markdown_table", "median_to_target", "plot_bars", "ratio_bars",
    "plot_returns", "plot_suite_curves", "save_report_record", "suite_markdown_table", "suite_record",
    "suite_rows", "summarize",
    "training_curve", "write_report", "write_suite_report",
]
