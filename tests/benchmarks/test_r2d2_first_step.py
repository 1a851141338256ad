"""benchmarks/micro/r2d2_first_step.py: a checkout that is not one is refused in one line; a short run of this
checkout against itself prints both rows and the ratio."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "benchmarks", "micro", "r2d2_first_step.py")


def test_a_base_that_is_not_a_checkout_is_one_line_and_exit_2(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "--base", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith(
        f"{tmp_path} has no configs/pomdp-cartpole-r2d2.yaml: --base and --tree are checkouts of this repository")


def test_a_bad_override_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, SCRIPT, "--base", ".", "--tree-set", "agent.jit_compile=maybe"], cwd=REPO,
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].endswith(
        "error: config key 'agent.jit_compile' must be true or false, got 'maybe'"), out.stderr


@pytest.mark.slow
def test_this_checkout_against_itself_prints_both_rows_with_equal_losses():
    out = subprocess.run([sys.executable, SCRIPT, "--base", ".", "--tree", ".", "--repeats", "1", "--steps", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith(("| base", "| tree"))]
    assert len(rows) == 2 and rows[0].split("|")[-2] == rows[1].split("|")[-2], rows   # the same losses
    assert "tree / base: first step" in out.stdout
