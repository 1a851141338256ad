"""Bad input to every CLI: one ``error:`` line, exit 2, nothing written; Ctrl-C: one line, exit 130.

Table-driven over the cases of issue 13 items 7 and 8. Most cases call a CLI's
``main()`` in-process (cheap); a few run the real ``python -m`` entry points to
check exit codes and that no traceback reaches stderr. Checks that must come
before long work (``evaluate --export``, ``report --out``, ``collect``
options) are given a RUN_DIR that is not a run: had the check come after the
long work, the error would name the RUN_DIR instead.

Read-only file system: we run as root, which chmod does not stop, so the
``read_only`` fixture bind-mounts a directory read-only (root can), falls back
to chmod 0555 for other users, then to ``/sys`` (sysfs refuses new files even
to root: a container's root without mount rights), and skips only when none holds.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pipelines import cli

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = {**os.environ, "PYTHONPATH": ROOT}


def _writable(path):
    try:
        with open(os.path.join(path, ".w"), "w"):
            pass
        os.unlink(os.path.join(path, ".w"))
        return True
    except OSError:
        return False


@pytest.fixture
def read_only(tmp_path):
    """A directory on which writes fail with EROFS (bind mount) or EACCES (chmod, non-root)."""
    path = tmp_path / "ro"
    path.mkdir()
    mounted = False
    if os.geteuid() == 0:
        try:
            proc = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True)
            mounted = proc.returncode == 0
            if mounted and _writable(str(path)):   # old kernels ignore ro on the first bind: remount
                subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True)
        except OSError:   # no mount(8)
            pass
    else:
        path.chmod(0o555)
    try:
        if not _writable(str(path)):
            yield str(path)
        elif os.path.isdir("/sys") and not _writable("/sys"):
            yield "/sys"
        else:
            pytest.skip("no way to make a read-only directory here (root without mount, no sysfs)")
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], capture_output=True)
        path.chmod(0o755)


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("not a directory")
    return str(f)


def _one_error(capsys):
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def _main(module):
    import importlib
    return importlib.import_module(f"pipelines.{module}").main


# -- item 7: config values are range-checked before anything is written -----------------------------
@pytest.mark.parametrize("override, expected", [
    ("env.max_episode_steps=-1", "config key 'env.max_episode_steps' = -1 is out of range; "
                                 "valid: null (the env's own time limit) or >= 1"),
    ("env.max_episode_steps=-5", "config key 'env.max_episode_steps' = -5 is out of range; "
                                 "valid: null (the env's own time limit) or >= 1"),
    ("env.max_episode_steps=0", "config key 'env.max_episode_steps' = 0 is out of range; "
                                "valid: null (the env's own time limit) or >= 1"),
    ("checkpoint.keep_every=0", "config key 'checkpoint.keep_every' = 0 is out of range; "
                                "valid: null (none kept beyond keep_last) or >= 1"),
    ("dask.address=foo://x", "config key 'dask.address' = 'foo://x' is out of range; valid: null (a LocalCluster) "
                             "or a scheduler address such as tcp://HOST:PORT (schemes: tcp, tls, ws, wss, ucx)"),
    ("replay.min_size=2000", "config keys 'replay.min_size' = 2000 and 'replay.capacity' = 1000 are inconsistent; "
                             "valid: replay.min_size <= replay.capacity (the cache never holds more, so learning "
                             "would never start)"),
    ("seed=-1", "config key 'seed' = -1 is out of range; valid: 0..1000000000"),
])
def test_train_rejects_bad_config_values_before_writing(tmp_path, capsys, override, expected):
    run_dir = tmp_path / "run"
    extra = ["--set", "replay.capacity=1000"] if override.startswith("replay.min_size") else []
    assert _main("train")(["--run-dir", str(run_dir), "--set", override, *extra, "--no-progress"]) == 2
    assert _one_error(capsys) == f"error: {expected}"
    assert not run_dir.exists()


# -- item 8: one error line, exit 2 ------------------------------------------------------------------
def test_list_shaped_yaml_with_seed(tmp_path, capsys):
    bad = tmp_path / "list.yaml"
    bad.write_text("- total_env_steps: 10\n- seed: 1\n")
    assert _main("train")(["--config", str(bad), "--seed", "3", "--run-dir", str(tmp_path / "r")]) == 2
    assert _one_error(capsys) == ("error: a config must be a mapping at top level, got list; "
                                  "valid: YAML of 'key: value' lines (see configs/default.yaml)")
    assert not (tmp_path / "r").exists()


def test_train_dask_address_flag_is_checked(tmp_path, capsys):
    assert _main("train")(["--dask-address", "foo://x", "--run-dir", str(tmp_path / "r")]) == 2
    assert _one_error(capsys).startswith("error: config key 'dask.address' = 'foo://x' is out of range")
    assert not (tmp_path / "r").exists()


RUN_DIR_VALID = "valid: a writable directory, or a path where one can be created"


@pytest.mark.parametrize("where, reason", [
    ("file", "it is a file"),
    ("under-file", "Not a directory"),
    ("read-only", None),
])
def test_run_dir_that_cannot_be_written(tmp_path, capsys, a_file, request, where, reason):
    if where == "file":
        run_dir = a_file
    elif where == "under-file":
        run_dir = os.path.join(a_file, "run")
    else:
        run_dir = os.path.join(request.getfixturevalue("read_only"), "run")
    assert _main("train")(["--executor", "local", "--run-dir", run_dir, "--no-progress"]) == 2
    line = _one_error(capsys)
    assert line.startswith(f"error: run directory {run_dir} cannot be written: ") and line.endswith(RUN_DIR_VALID)
    if reason:
        assert f": {reason}; " in line
    else:
        assert any(r in line for r in ("Read-only file system", "Permission denied", "Operation not permitted")), line


def test_run_dir_with_an_unsupported_scheme(capsys):
    assert _main("train")(["--executor", "local", "--run-dir", "foo://x/run", "--no-progress"]) == 2
    assert _one_error(capsys) == ("error: --run-dir 'foo://x/run' has the unsupported URL scheme 'foo' (supported: "
                                  "file://, memory://, gs://, gcs://, s3://); valid: a local path, file:///ABS/PATH, "
                                  "memory://NAME, s3://BUCKET/PATH or gs://BUCKET/PATH")


@pytest.mark.parametrize("where, fragment", [
    ("dir", "is a directory; valid: a file path"),
    ("under-file", "is not a directory; valid: a path in an existing directory"),
    ("read-only", "cannot be written ("),
])
def test_evaluate_export_is_checked_before_evaluating(tmp_path, capsys, a_file, request, where, fragment):
    export = {"dir": str(tmp_path), "under-file": os.path.join(a_file, "p.tflite")}.get(where)
    if where == "read-only":
        export = os.path.join(request.getfixturevalue("read_only"), "p.tflite")
    not_a_run = str(tmp_path / "no-run")   # evaluating it would fail: the export check must come first
    assert _main("evaluate")([not_a_run, "--export", export]) == 2
    line = _one_error(capsys)
    assert line.startswith(f"error: --export {export!r}") and fragment in line, line


@pytest.mark.parametrize("flag", ["--plot", "--json"])
@pytest.mark.parametrize("where, fragment", [
    ("dir", "is a directory; valid: a file path"),
    ("under-file", "is not a directory; valid: a path in an existing directory"),
    ("read-only", "cannot be written ("),
])
def test_process_stats_outputs_are_checked_before_reading_the_store(tmp_path, capsys, a_file, request, flag,
                                                                    where, fragment):
    out = {"dir": str(tmp_path), "under-file": os.path.join(a_file, "out")}.get(where)
    if where == "read-only":
        out = os.path.join(request.getfixturevalue("read_only"), "out")
    no_store = str(tmp_path / "no-store")   # reading it would fail: the output check must come first
    assert _main("process")(["stats", no_store, "--executor", "local", flag, out]) == 2
    line = _one_error(capsys)
    assert line.startswith(f"error: {flag} {out!r}") and fragment in line, line
    assert sorted(os.listdir(tmp_path)) == ["a-file"] + (["ro"] if where == "read-only" else [])  # nothing written


def test_process_stats_default_plot_path_is_checked(tmp_path, capsys, monkeypatch):
    """No --plot: the histogram goes to ./<store name>-returns.png, checked like --plot."""
    (tmp_path / "replay-returns.png").mkdir()
    monkeypatch.chdir(tmp_path)
    assert _main("process")(["stats", str(tmp_path / "run" / "replay"), "--executor", "local"]) == 2
    assert _one_error(capsys) == "error: --plot 'replay-returns.png' is a directory; valid: a file path"


@pytest.mark.parametrize("where, fragment", [
    ("file", "is a file; valid: a directory (existing or new)"),
    ("under-file", "is under the file "),
    ("read-only", "cannot be written ("),
])
def test_report_out_is_checked_before_reading_runs(tmp_path, capsys, a_file, request, where, fragment):
    out = {"file": a_file, "under-file": os.path.join(a_file, "report")}.get(where)
    if where == "read-only":
        out = os.path.join(request.getfixturevalue("read_only"), "report")
    assert _main("report")([str(tmp_path / "no-run"), "--out", out]) == 2
    line = _one_error(capsys)
    assert line.startswith(f"error: --out {out!r}") and fragment in line, line
    assert not os.path.isdir(out)   # nothing created for a report that was refused


@pytest.mark.parametrize("flag, value, valid", [
    ("--num-envs", "0", "1..4096"),
    ("--steps-per-task", "0", ">= 1"),
    ("--num-actors", "0", ">= 1"),
    ("--episodes", "0", ">= 1"),
    ("--epsilon", "1.5", "0..1"),
    ("--seed", "-3", "0..1000000000"),
])
def test_collect_options_are_range_checked(tmp_path, capsys, flag, value, valid):
    args = [str(tmp_path / "no-run"), "--episodes", "5", "--out", str(tmp_path / "out"), flag, value]
    assert _main("collect")(args) == 2
    assert _one_error(capsys) == f"error: {flag} {float(value) if flag == '--epsilon' else int(value)} " \
                                 f"is out of range; valid: {valid}"
    assert not (tmp_path / "out").exists()


def test_collect_out_under_a_file_is_checked_first(tmp_path, capsys, a_file):
    out = os.path.join(a_file, "store")
    assert _main("collect")([str(tmp_path / "no-run"), "--episodes", "5", "--out", out]) == 2
    assert _one_error(capsys) == f"error: --out {out!r} is under the file {a_file!r}; " \
                                 "valid: a directory (existing or new)"


def test_collect_out_read_only_is_checked_first(tmp_path, capsys, read_only):
    out = os.path.join(read_only, "store")
    assert _main("collect")([str(tmp_path / "no-run"), "--episodes", "5", "--out", out]) == 2
    assert _one_error(capsys).startswith(f"error: --out {out!r} cannot be written (")


def test_process_dask_address(tmp_path, capsys):
    assert _main("process")(["stats", str(tmp_path / "store"), "--executor", "dask",
                             "--dask-address", "foo://x"]) == 2
    assert _one_error(capsys) == ("error: --dask-address 'foo://x' is not a Dask scheduler address (unknown scheme "
                                  "'foo'); valid: tcp://HOST:PORT (schemes: tcp, tls, ws, wss, ucx), or none for a "
                                  "LocalCluster")


@pytest.mark.parametrize("address, problem", [
    ("tcp://", "it is not HOST:PORT with a port 1..65535"),
    ("tcp://host", "it is not HOST:PORT with a port 1..65535"),
    ("tcp://host:0", "it is not HOST:PORT with a port 1..65535"),
    ("tcp://host:99999", "it is not HOST:PORT with a port 1..65535"),
    ("inproc://x", "unknown scheme 'inproc'"),
    ("", "it is empty"),
    ("tcp://10.0.0.5:8786", None),
    ("10.0.0.5:8786", None),
    ("tls://[::1]:8786", None),
])
def test_dask_address_problems(address, problem):
    from core.config import dask_address_problem
    assert dask_address_problem(address) == problem


# -- the shared wrapper: the property, once for every CLI --------------------------------------------
def _wrapped(exc):
    @cli.cli_errors
    def main():
        raise exc
    return main


@pytest.mark.parametrize("exc, line", [
    (PermissionError(13, "Permission denied", "/data/x"), "error: Permission denied: /data/x"),
    (OSError(30, "Read-only file system", "/ro/f"), "error: Read-only file system: /ro/f"),
    (IsADirectoryError(21, "Is a directory", "/tmp"), "error: Is a directory: /tmp"),
    (OSError("Timed out trying to connect to tcp://h:1 after 20 s"),
     "error: Timed out trying to connect to tcp://h:1 after 20 s"),
    (FileNotFoundError("no complete checkpoint under r/checkpoints\nmore"),
     "error: no complete checkpoint under r/checkpoints"),
])
def test_every_os_error_is_one_line_exit_2(capsys, exc, line):
    assert _wrapped(exc)() == 2
    assert _one_error(capsys) == line


def test_a_bug_keeps_its_traceback():
    with pytest.raises(ZeroDivisionError):
        _wrapped(ZeroDivisionError("bug"))()


def test_interrupt_prints_one_line_exit_130(capsys):
    import signal as sig
    previous = sig.getsignal(sig.SIGINT)
    try:
        assert _wrapped(cli.Interrupted("interrupted; resume with: X"))() == 130
        assert capsys.readouterr().err == "interrupted; resume with: X\n"
        assert _wrapped(KeyboardInterrupt())() == 130
        assert capsys.readouterr().err == "interrupted\n"
    finally:
        sig.signal(sig.SIGINT, previous)


def test_every_cli_main_is_wrapped():
    for module in ("train", "evaluate", "collect", "process", "report"):
        assert getattr(_main(module), "__wrapped__", None) is not None, module


# -- real processes: exit codes and no tracebacks ----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("argv, fragment", [
    (["pipelines.train", "--config", "{list_yaml}", "--seed", "3"], "error: a config must be a mapping"),
    (["pipelines.process", "stats", "{tmp}/store", "--executor", "dask", "--dask-address", "foo://x"],
     "error: --dask-address 'foo://x' is not a Dask scheduler address"),
    (["pipelines.collect", "{tmp}/no-run", "--episodes", "3", "--out", "{tmp}/out", "--num-actors", "0"],
     "error: --num-actors 0 is out of range; valid: >= 1"),
    (["pipelines.evaluate", "{tmp}/no-run", "--export", "{tmp}"], "is a directory; valid: a file path"),
    (["pipelines.train", "--run-dir", "{a_file}/run", "--executor", "local"], "cannot be written: Not a directory"),
])
def test_real_cli_processes_exit_2_with_one_line(tmp_path, a_file, argv, fragment):
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    subs = {"list_yaml": str(tmp_path / "list.yaml"), "tmp": str(tmp_path), "a_file": a_file}
    argv = [a.format(**subs) for a in argv]
    proc = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, env=ENV)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr


def _latest_step(url):
    """The newest complete checkpoint, or None (also while the trainer is still creating the root)."""
    from core.checkpoint import CheckpointError, Checkpointer
    if not os.path.isdir(url):
        return None
    try:
        with Checkpointer(url) as ckpt:
            return ckpt.latest_step()
    except CheckpointError:
        return None


def _foreground_sigint():
    """In the child: SIGINT as in a terminal's foreground job. A shell without job control starts
    background jobs (``cmd &``) with SIGINT ignored, which children inherit; then Python installs
    no KeyboardInterrupt handler and Ctrl-C is (rightly) ignored, which is not what this test is about."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_during_dask_training_exits_130_with_the_resume_command(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C: driver and Dask workers all get it."""
    from core.run_lock import RunLock
    run_dir = str(tmp_path / "run")
    p = subprocess.Popen([sys.executable, "-m", "pipelines.train", "--run-dir", run_dir,
                          "--set", "total_env_steps=1000000", "--set", "checkpoint.every_steps=50",
                          "--set", "replay.min_size=256"],
                         cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=_foreground_sigint)
    err = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: p.stderr.read(1), "")), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 300
        ckpt = os.path.join(run_dir, "checkpoints")
        while p.poll() is None and time.time() < deadline:
            progressed = "step/s" in "".join(err)   # the progress bar has shown env steps
            if progressed and _latest_step(ckpt) is not None:
                break
            time.sleep(0.5)
        assert p.poll() is None, "".join(err)
        os.killpg(p.pid, signal.SIGINT)
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    reader.join(10)
    stderr = "".join(err)
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    last = [l for l in stderr.replace("\r", "\n").splitlines() if l.strip()][-1]
    assert last.startswith("interrupted at checkpoint step ") and \
        last.endswith(f"; resume with: python -m pipelines.train --resume {run_dir}"), stderr
    step = int(last.split("checkpoint step ")[1].split(";")[0])
    assert _latest_step(os.path.join(run_dir, "checkpoints")) >= step
    RunLock(run_dir).acquire().release()    # released on Ctrl-C


def test_interrupt_message_names_resume_only_when_a_checkpoint_exists(tmp_path):
    import numpy as np
    from core.checkpoint import Checkpointer
    from pipelines.train import interrupt_message
    run_dir = str(tmp_path / "run")
    assert interrupt_message(run_dir) == (f"interrupted before the first complete checkpoint; nothing to resume in "
                                          f"{run_dir}: start again with a new --run-dir")
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        ckpt.save(64, {"w": np.zeros(3, np.float32)})
    assert interrupt_message(run_dir) == ("interrupted at checkpoint step 64; resume with: "
                                          f"python -m pipelines.train --resume {run_dir}")
