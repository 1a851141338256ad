"""benchmarks/micro/startup.py: the first-env-step hook records one line per process, and changes nothing else."""
import os
import subprocess
import sys

from benchmarks.micro import startup

_STEP_TWICE = """
import os
import numpy as np
from core.envs import make_vector_env
envs, _ = make_vector_env("CartPole-v1", 2, seed=0)
out = [envs.step(np.zeros(2, np.int64))[0] for _ in range(2)]
print(os.getpid(), repr(out[1].tolist()))
"""


def _run(tmp_path, hook: bool) -> subprocess.CompletedProcess:
    (tmp_path / "hook").mkdir(exist_ok=True)
    (tmp_path / "hook" / "sitecustomize.py").write_text(startup.FIRST_STEP_HOOK)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(([str(tmp_path / "hook")] if hook else []) + [repo])}
    env["DATABLOOM_FIRST_STEP_FILE"] = str(tmp_path / "first_step")
    return subprocess.run([sys.executable, "-c", _STEP_TWICE], env=env, capture_output=True, text=True, check=True)


def test_the_hook_records_the_first_env_step_once_and_the_steps_are_unchanged(tmp_path):
    hooked = _run(tmp_path, hook=True)
    pid, observations = hooked.stdout.split(" ", 1)
    lines = (tmp_path / "first_step").read_text().splitlines()
    assert len(lines) == 1 and lines[0].split()[0] == pid          # one process, its first step only
    assert float(lines[0].split()[1]) > 0
    (tmp_path / "first_step").unlink()
    plain = _run(tmp_path, hook=False)
    assert plain.stdout.split(" ", 1)[1] == observations           # the same env steps without the hook
    assert not (tmp_path / "first_step").exists()


def test_a_process_start_time_is_not_up_to_a_second_early():
    """core.process_clock (the summary's and this script's clock): psutil's create_time() rests on
    /proc/stat's whole-second boot time (up to 1 s early); a child's start lies between the parent's clock
    before it started the child and the child's own first reading."""
    import time
    code = "import time; t = time.time(); from core.process_clock import process_start_time; " \
           "print(t, process_start_time())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))).stdout
    child_now, started = map(float, out.split())
    assert before - 0.02 <= started <= child_now


def test_peers_option_names_the_valid_values_on_a_bad_one():
    import pytest
    assert startup.peers_of("none") == []
    with pytest.raises(SystemExit, match=r"^error: --peers sb3-a2c invalid; valid: auto, none, or a list of "
                                         r"sb3-ppo, sb3-dqn$"):
        startup.peers_of("sb3-ppo,sb3-a2c")
