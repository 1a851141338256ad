"""TensorFlow's and LiteRT's start-up notices, kept off the terminal; every other line still reaches it.

Importing TensorFlow 2.21 writes, from C++ and once per shared library that links it (twice)::

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:1796667637.047852    2690 port.cc:153] oneDNN custom operations are on. You may see ...

and LiteRT's first interpreter in a process writes ``INFO: Created TensorFlow Lite XNNPACK delegate for
CPU.``. They are the first lines a user sees of a run, a "WARNING" among them, and none is news: the
oneDNN notice is logged as the shared library loads, before TensorFlow reads ``TF_CPP_MIN_LOG_LEVEL``
(which silences its other notices), and neither library has a switch for them (measured: TF_CPP_MIN_LOG_LEVEL
2 and 3, GLOG_minloglevel, ABSL_MIN_LOG_LEVEL; ``TF_ENABLE_ONEDNN_OPTS=1`` still logs it, and ``=0`` would
change the learner's kernels).

:func:`notices_dropped` points the process's stderr (file descriptor 2, which C++ writes to) at a pipe
while a block runs; a thread forwards each line to the real stderr as it arrives, except the lines in
:data:`NOTICES`. Nothing else is held back or lost, also if the process dies in the block.
:func:`quiet_tensorflow_import` runs the first ``import tensorflow`` of a process in that block.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import threading
from typing import Iterator, List, Optional

#: Substrings of the start-up notices dropped (each a whole line of its own).
NOTICES = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "oneDNN custom operations are on.",
    "Created TensorFlow Lite XNNPACK delegate for CPU.",
)
_NOTICE_BYTES = tuple(n.encode() for n in NOTICES)
_lock = threading.RLock()     # one block at a time per process (a nested block in the same thread is fine)


def _is_notice(line: bytes) -> bool:
    return any(n in line for n in _NOTICE_BYTES)


def notices_in(text: str) -> List[str]:
    """The lines of ``text`` (a process's captured output or log) that are start-up notices."""
    return [line for line in text.splitlines() if _is_notice(line.encode())]


def _forward(read_fd: int, out_fd: int) -> None:
    """Copy lines from ``read_fd`` to ``out_fd`` until end of file, leaving out :data:`NOTICES`; closes both."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe, os.fdopen(out_fd, "wb", buffering=0) as out:
        pending = b""
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if not _is_notice(line))
            if kept:
                out.write(kept)
        if pending and not _is_notice(pending):
            out.write(pending)


#: How long the end of a block waits for the forwarder to pass the block's last lines on. A child process
#: started in the block keeps the pipe open: the forwarder then goes on forwarding its lines.
DRAIN_S = 2.0


@contextlib.contextmanager
def notices_dropped() -> Iterator[None]:
    """Run the block with :data:`NOTICES` lines kept off stderr (fd 2); every other line passes at once.

    One block at a time per process. A thread that enters while another thread's block runs does not wait
    for it (an actor's first interpreter must not wait for TensorFlow's import): its lines already pass
    through that block's filter while it lasts.
    """
    if not _lock.acquire(blocking=False):
        yield
        return
    try:
        sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:           # no stderr at all (a daemon's fd 2 closed): nothing to keep clean
            yield
            return
        read_fd, write_fd = os.pipe()
        forwarder = threading.Thread(target=_forward, args=(read_fd, os.dup(2)), name="native-notices",
                                     daemon=True)
        forwarder.start()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)          # closes the pipe's last write end: the forwarder drains it and ends
            os.close(saved)
            forwarder.join(DRAIN_S)
    finally:
        _lock.release()


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, and runs its module's import inside :func:`notices_dropped`."""

    def find_spec(self, name: str, path, target=None) -> Optional[importlib.machinery.ModuleSpec]:
        if name != "tensorflow":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)          # once: the real finders find it
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def quiet_exec_module(module) -> None:
            with notices_dropped():
                exec_module(module)
        spec.loader.exec_module = quiet_exec_module
        return spec


def quiet_tensorflow_import() -> None:
    """The process's first ``import tensorflow``, wherever it happens, runs in :func:`notices_dropped`."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowImport())
