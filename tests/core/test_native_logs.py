"""TensorFlow's and LiteRT's start-up notices stay off the terminal (core.native_logs); every other line of
stderr still reaches it, in order."""
import os
import subprocess
import sys

import pytest

from core import native_logs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
ONEDNN = "I0000 00:00:1796667637.047852    2690 port.cc:153] oneDNN custom operations are on. You may see ..."
XNNPACK = "INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


def test_the_notices_are_dropped_and_every_other_line_passes_in_order(capfd):
    os.write(2, b"before\n")
    with native_logs.notices_dropped():
        os.write(2, f"{ABSL}\nfirst\n{ONEDNN}\n".encode())
        os.write(2, b"second\n")
        os.write(2, f"{XNNPACK}\nthird, no newline".encode())
    os.write(2, b"\nafter\n")
    assert capfd.readouterr().err == "before\nfirst\nsecond\nthird, no newline\nafter\n"


def test_stderr_is_itself_again_after_the_block_also_when_it_raises(capfd):
    with pytest.raises(RuntimeError):
        with native_logs.notices_dropped():
            raise RuntimeError("in the block")
    os.write(2, f"{XNNPACK}\n".encode())        # outside a block nothing is dropped
    assert capfd.readouterr().err == f"{XNNPACK}\n"


_PROBE = """
import sys
{hook}
import tensorflow
print("still here", file=sys.stderr)
"""


def _probe_stderr(hook: str) -> str:
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(hook=hook)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


@pytest.mark.slow
def test_a_tools_process_imports_tensorflow_without_its_notices():
    """The tools' module installs the hook: TensorFlow's import prints none of the notices, and what the
    process prints itself still arrives. Without the hook TensorFlow 2.21 prints them in spite of
    TF_CPP_MIN_LOG_LEVEL=2 (if a release stops, this test says the module can go)."""
    quiet = _probe_stderr("import pipelines.cli")
    assert quiet.splitlines() == ["still here"], quiet
    loud = _probe_stderr("")
    assert "oneDNN custom operations are on." in loud and ABSL in loud, loud


@pytest.mark.slow
def test_the_quickstarts_run_prints_none_of_the_notices(tmp_path):
    """The default config on its embedded Dask cluster: the driver imports TensorFlow, and the actors' first
    LiteRT interpreters (in the workers) log LiteRT's XNNPACK notice unless core.policy drops it (three
    such lines in a 4,096-step run without it)."""
    out = subprocess.run([sys.executable, "-m", "pipelines.train", "--run-dir", str(tmp_path / "run"),
                          "--no-progress", "--set", "total_env_steps=2048", "--set", "carbon.backend=off"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    noticed = native_logs.notices_in(out.stdout + out.stderr)
    assert not noticed, noticed


def test_a_second_thread_does_not_wait_for_a_running_block_and_its_notices_are_dropped_by_it(capfd):
    import threading
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait()
        with native_logs.notices_dropped():          # returns at once: the first block is running
            os.write(2, f"{XNNPACK}\nfrom the other thread\n".encode())
        done.set()
    t = threading.Thread(target=other)
    t.start()
    with native_logs.notices_dropped():
        inside.set()
        assert done.wait(10)                         # it finished while this block still runs
    t.join()
    assert capfd.readouterr().err == "from the other thread\n"
