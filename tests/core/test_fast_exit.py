"""``core.fast_exit.exit_now``: a CLI ends as Python's exit would (threads, atexit, output, exit status), less
the module teardown."""
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tmp_path, body):
    script = tmp_path / "cli.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})


def test_exit_now_joins_threads_runs_atexit_flushes_and_keeps_the_code(tmp_path):
    out = _run(tmp_path, f"""
        import atexit, sys, threading, time
        from core.fast_exit import exit_now
        def write_late():
            time.sleep(0.3)
            open({str(tmp_path / "thread")!r}, "w").write("done")
        threading.Thread(target=write_late).start()            # non-daemon: the exit waits for it
        atexit.register(lambda: print("atexit ran", file=sys.stderr))
        sys.stdout.write("unflushed line")                      # no newline, no flush
        exit_now(3)
        print("never")
    """)
    assert out.returncode == 3, out.stderr
    assert out.stdout == "unflushed line"
    assert out.stderr.strip().splitlines()[-1] == "atexit ran"
    assert (tmp_path / "thread").read_text() == "done"


def test_exit_now_of_none_is_0_and_of_text_is_pythons_exit(tmp_path):
    assert _run(tmp_path, "from core.fast_exit import exit_now\nexit_now(None)\n").returncode == 0
    out = _run(tmp_path, "from core.fast_exit import exit_now\nexit_now('bad thing')\n")
    assert out.returncode == 1 and out.stderr.strip() == "bad thing"


def test_a_cli_error_still_exits_2_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pipelines.train", "--run-dir", str(tmp_path / "r"), "--set",
                          "total_env_steps=-1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: ")
