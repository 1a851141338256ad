"""The sweep's Beam backend: one pipeline whose elements are runs (DirectRunner).

The fast test drives it with a stand-in trainer (outcomes, a failing run, resume); the slow one runs two
real tiny runs as a Beam sweep and checks that each ends with the parameters of the same run started alone.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from pipelines.sweeps import SweepDir, SweepSpec, expand, run_sweep
from pipelines.sweeps.beam_runner import BeamBackend
from test_sweep import DEFAULT, ENV, FAKE_TRAIN, REPO, TINY, _params, _summaries, _sweep


@pytest.mark.timeout(300)
def test_a_beam_sweep_records_each_run_and_resume_tries_only_the_failed_ones(tmp_path):
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)          # seed 1 fails with one error line, the others write summary.json
    spec = SweepSpec(configs=[DEFAULT], seeds=[0, 1, 2])
    runs = expand(spec)
    sweep = SweepDir(str(tmp_path / "s"))
    sweep.create(spec, runs)
    backend = BeamBackend(2, [sys.executable, str(script)])
    try:
        result = run_sweep(sweep, runs, backend, progress=False)
    finally:
        backend.close()
    names = [r.name for r in runs]
    assert sorted(result["done"]) == [names[0], names[2]] and result["failed"] == [names[1]], result
    failed = sweep.read_status(names[1])
    assert (failed.state, failed.returncode, failed.error) == ("failed", 2, "error: the env exploded at step 7")
    backend = BeamBackend(1, [sys.executable, str(script)])
    try:
        again = run_sweep(sweep, runs, backend, progress=False)
    finally:
        backend.close()
    assert again["failed"] == [names[1]] and sorted(again["done"]) == [names[0], names[2]]
    assert [sweep.read_status(n).attempts for n in names] == [1, 2, 1]


def test_a_stopped_beam_backend_starts_no_run(tmp_path):
    backend = BeamBackend(1, [sys.executable, "-c", "raise SystemExit(0)"])
    backend.start("a__s0", ["--seed", "0"], str(tmp_path / "logs" / "a__s0.log"))
    backend.stop()
    ended = []
    while not ended:
        ended = backend.wait(1.0)
    backend.close()
    assert ended == [("a__s0", 130)] and not (tmp_path / "logs").exists()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_run_of_a_beam_sweep_ends_with_the_parameters_of_the_run_alone(tmp_path):
    out = str(tmp_path / "sweep")
    proc = _sweep("--configs", DEFAULT, "--seeds", "0-1", *[a for s in TINY for a in ("--set", s)],
                  "--executor", "beam", "--workers", "2", "--out", out, "--no-progress", timeout=800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = SweepDir(out)
    _, runs = sweep.load()
    assert [sweep.read_status(r.name).state for r in runs] == ["done", "done"]
    assert all(len(_summaries(sweep.run_dir(r.name))) == 1 for r in runs)
    run = runs[1]
    alone = str(tmp_path / "alone")
    proc = subprocess.run([sys.executable, "-m", "pipelines.train", *run.train_args(alone)], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _params(alone), _params(sweep.run_dir(run.name))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
