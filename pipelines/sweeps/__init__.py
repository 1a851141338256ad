"""Sweeps: seeds x configs x settings as one batch job, behind ``python -m pipelines.sweep``.

One concept per module::

    spec (YAML or flags) --spec.expand--> [RunSpec] --spec.validate_runs--> (every config built once)
        --record.SweepDir.create--> sweep.json, status/<run>.json
        --runner.run_sweep(backend)--> each run: python -m pipelines.train ... --run-dir SWEEP_DIR/runs/<run>
        --report--> report.md, rows.json, *.png next to sweep.json (python -m pipelines.report sweep)

* :mod:`pipelines.sweeps.spec`: the spec, seed ranges, grids, run names, validation;
* :mod:`pipelines.sweeps.record`: the sweep directory and its JSON records;
* :mod:`pipelines.sweeps.launch`: a run's command and environment, the local backend (processes);
* :mod:`pipelines.sweeps.dask_runner`: the Dask backend (a run per task, embedded cluster or address);
* :mod:`pipelines.sweeps.beam_runner`: the Beam backend (one pipeline whose elements are runs);
* :mod:`pipelines.sweeps.runner`: the driver loop: resume decisions, outcomes, stop, progress;
* :mod:`pipelines.sweeps.job`: a sweep as one call (start or continue SWEEP_DIR under its lock), used by
  ``python -m pipelines.sweep`` and by the studies in ``benchmarks/studies``;
* :mod:`pipelines.sweeps.report`: the sweep's report (IQM, bootstrap CIs, probability of improvement).

Example::

    spec = SweepSpec(configs=["configs/default.yaml"], seeds=[0, 1], grid={"actors.precision": ["fp32"]})
    runs = expand(spec); validate_runs(runs)
    sweep = SweepDir("sweeps/a"); sweep.create(spec, runs)
    run_sweep(sweep, runs, LocalBackend(workers=2))
"""
from pipelines.sweeps.launch import LocalBackend
from pipelines.sweeps.record import Status, SweepDir
from pipelines.sweeps.runner import run_sweep
from pipelines.sweeps.spec import (ConfigEntry, RunSpec, SweepSpec, expand, parse_grid, parse_seeds, read_spec,
                                   validate_runs)

__all__ = ["ConfigEntry", "LocalBackend", "RunSpec", "Status", "SweepDir", "SweepSpec", "expand", "parse_grid",
           "parse_seeds", "read_spec", "run_sweep", "validate_runs"]
