"""Reports from run directories: the ActorQ comparison (precisions x seeds), behind ``python -m pipelines.report``.

This package's ``__init__`` is the public surface; the work is in three modules of one concept each::

    run dirs --runs.load_runs--> [Run] --actorq--> report.md, rows.json, *.png
                 (plots with format.band_on_grid)

* :mod:`core.report.runs`: load run directories, group by task, refuse runs
  whose configs differ beyond ``actors.precision`` and ``seed`` (:class:`ReportError`);
* :mod:`core.report.actorq`: per task x precision over seeds, relative to fp32
  (time to target, speedup, final return, energy, CO2e, throughput) and its plots;
* :mod:`core.report.format`: curve bands on one grid, table cells, file-name slugs;
* :mod:`core.report.aggregate`: the field's statistics over seeds (IQM, stratified bootstrap CIs,
  probability of improvement, performance profiles), behind ``python -m pipelines.report sweep``.

The learning suite's report (configs x seeds), which only the benchmark studies
use, is :mod:`benchmarks.studies.suite_report`; it reads runs with
:func:`core.report.runs.load_run` and plots with :func:`core.report.format.band_on_grid`.

Example::

    runs = load_runs(["runs/a-fp32-s0", "runs/a-int8-s0", ...])
    rows = summarize(runs)
    write_report(runs, "report/")         # report.md, returns_*.png, speedup.png, carbon.png
"""
from __future__ import annotations

from core.report.actorq import (curves, markdown_table, plot_bars, plot_returns, ratio_bars, summarize,
                                write_report)
from core.report.format import band_on_grid
from core.report.runs import (VARYING_KEYS, ReportError, Run, check_comparable, group_by_task, load_run,
                              load_runs, save_report_record)

__all__ = [
    "VARYING_KEYS", "ReportError", "Run", "band_on_grid", "check_comparable", "curves",
    "group_by_task", "load_run", "load_runs", "markdown_table", "plot_bars", "ratio_bars",
    "plot_returns", "save_report_record", "summarize", "write_report",
]
