"""The learner's TF thread pools are the config's, or the run says they are not (pipelines.run.learner_stage).

TensorFlow fixes its pools at its first op in a process. A run in a fresh
process gets the config's ``threads.tf_intra_op``/``tf_inter_op``; a run in a
process where TF already ran with other pools cannot, so it warns and its
placement record names the pools that ran. Each case runs in a fresh
interpreter (this suite's own processes pin TF's pools, tests/conftest.py).
"""
import json
import os
import subprocess
import sys

import pytest

tf = pytest.importorskip("tensorflow")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

PROBE = """
import json, sys, warnings
if sys.argv[1] == "tf-ran-first":
    import tensorflow as tf
    tf.constant(1.0) + 1                     # TF's default pools are now fixed in this process
from core.config import load_config
from pipelines.run.learner_stage import configure_threads
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    pools = configure_threads(load_config(overrides=["threads.tf_intra_op=1", "threads.tf_inter_op=1"]))
print(json.dumps({"pools": pools, "warnings": [str(w.message) for w in caught if w.category is RuntimeWarning]}))
"""


def _probe(case):
    out = subprocess.run([sys.executable, "-c", PROBE, case], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_fresh_process_runs_the_configs_pools():
    assert _probe("fresh") == {"pools": {"intra_op": 1, "inter_op": 1, "as_configured": True}, "warnings": []}


@pytest.mark.slow
def test_a_process_where_tf_already_ran_warns_and_reports_the_pools_it_has():
    got = _probe("tf-ran-first")
    assert got["pools"] == {"intra_op": 0, "inter_op": 0, "as_configured": False}
    (warning,) = got["warnings"]
    assert "threads.tf_intra_op=1 (TF has its default)" in warning
    assert "threads.tf_inter_op=1 (TF has its default)" in warning


def test_the_suite_pins_the_default_configs_pools():
    """What makes a run in a test process comparable with one in a fresh process (tests/conftest.py)."""
    from core.config import load_config
    threads = load_config().threads
    assert tf.config.threading.get_intra_op_parallelism_threads() == threads.tf_intra_op == 1
    assert tf.config.threading.get_inter_op_parallelism_threads() == threads.tf_inter_op == 1
