"""A planned stop of a Beam run: SIGTERM on the launcher (or SIGINT on its process group, a terminal's
Ctrl-C) ends the current round, exits 130, and ``--resume`` ends the run bit-identically to the
uninterrupted (local) one; ``metrics.jsonl`` has one ``commit`` record per block across the stop, as a
Dask run's.

The launcher runs as the CLI does (``python -m pipelines.train``) in a child process; the signal goes to
that process (or its process group) once its first round record exists (rounds of one block); the
resumed launcher runs the remaining blocks as one round. About 20-40 s each.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("apache_beam")

from test_beam_identity import DIRECT, TINY, _rounds, tiny_local_run  # noqa: E402,F401
from test_determinism import _assert_same_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(blocks_per_round, *args):
    sets = [a for kv in TINY for a in ("--set", kv)]
    return [sys.executable, "-m", "pipelines.train", "--executor", "beam", "--no-progress", *sets,
            *DIRECT, "--blocks_per_round", str(blocks_per_round), *args]


def _foreground_sigint():
    """In the child: SIGINT as in a terminal's foreground job (a shell without job control starts
    background jobs with SIGINT ignored, which children inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("how", ["SIGTERM to the launcher", "SIGINT to the process group"])
def test_a_planned_stop_ends_after_the_round_and_resume_equals_the_uninterrupted_run(tiny_local_run, tmp_path,
                                                                                       how):
    """SIGINT to the process group is a terminal's Ctrl-C: it reaches the round's warm worker process too,
    which ignores it, so the round in flight still finishes (pipelines.beam.warm_workers)."""
    run_dir = str(tmp_path / "beam")
    group = how.endswith("process group")
    child = subprocess.Popen(_cli(1, "--run-dir", run_dir), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=group,
                             preexec_fn=_foreground_sigint if group else None)
    first_round = os.path.join(run_dir, "rounds", "r000000.json")
    deadline = time.time() + 600
    while not os.path.exists(first_round) and child.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    if group:
        os.killpg(child.pid, signal.SIGINT)
    else:
        child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 130, out[-2000:]
    assert f"resume with: python -m pipelines.train --resume {run_dir}" in out, out[-2000:]
    stopped = _rounds(run_dir)
    assert stopped == [[b] for b in range(len(stopped))] and 1 <= len(stopped) < 16, stopped
    assert not os.path.exists(os.path.join(run_dir, "summary.json"))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [(r["signal"], r["block"]) for r in records if r.get("kind") == "stopped"] == \
        [(how.split()[0], len(stopped))]

    # The rest in one round: a round's fixed cost (~10 s) dominates a TINY block, and the round size never
    # changes a run (test_beam_identity), so one round of the remaining blocks stands for any split of them.
    resumed = subprocess.run(_cli(16, "--resume", run_dir), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert _rounds(run_dir) == [*stopped, list(range(len(stopped), 16))]
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    _assert_same_run(tiny_local_run, (summary, run_dir), f"local vs beam stopped by {how} and resumed")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    commits = [r for r in records if r["kind"] == "commit"]     # one per block, as the driver logs them
    assert [(r["block"], r["shards"], r["rows"]) for r in commits] == [(b, 1, 128) for b in range(16)]
    assert [r["step"] for r in commits] == [128 * (b + 1) for b in range(16)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_process_killed_during_a_round_ends_the_run_with_one_line_and_resume_finishes_it(tmp_path):
    import psutil
    run_dir = str(tmp_path / "beam")
    child = subprocess.Popen(_cli(2, "--run-dir", run_dir), cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    block_2 = os.path.join(run_dir, "blocks", "b00000002-learn.json")   # round 1 learned block 2, not yet 3
    deadline = time.time() + 300
    while not os.path.exists(block_2) and child.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    workers = [p for p in psutil.Process(child.pid).children()
               if "pipelines.beam.warm_workers" in " ".join(p.cmdline())]
    assert len(workers) == 2, workers              # --direct_num_workers 2: one of them runs the round
    for worker in workers:
        worker.kill()                              # during round 1 (rounds of 2 blocks)
    out, err = child.communicate(timeout=300)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("I0000", "WARNING: All"))]
    assert child.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    pids = "|".join(str(w.pid) for w in workers)
    assert re.match(rf"error: a Beam worker process \(pid ({pids})\) died during a round \(exit status -9\): "
                    r"that round is lost; stopped after Beam round 0 ", lines[-1]), err[-3000:]
    assert lines[-1].endswith(f"resume with: python -m pipelines.train --resume {run_dir}"), err[-3000:]
    resumed = subprocess.run(_cli(16, "--resume", run_dir), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert os.path.exists(os.path.join(run_dir, "summary.json"))
