"""How a DataBloom process ends: as Python's exit would, less the interpreter's module teardown.

Python's exit joins the non-daemon threads, runs the ``atexit`` handlers, flushes the
standard streams, and then finalizes every module and object. With TensorFlow loaded that
last part alone takes 1.05-1.18 s on a 2-core Zen 4 (``os._exit`` right after
``import tensorflow``: 0.06 s), after the process has printed its last line and settled its
exit status. Nothing of ours depends on it: stores, checkpoints, locks and metrics are
closed explicitly, and every clean-up that is registered runs.

* :func:`exit_now` ends a CLI (``if __name__ == "__main__": exit_now(main())``), and the
  DirectRunner's worker processes (:mod:`pipelines.beam.sdk_worker`, one per worker per
  pipeline, each waited for; :mod:`pipelines.beam.warm_workers`). It is called after ``main``
  returns, never from inside an ``atexit`` handler: running the handlers from inside one (to end
  after them) hung Beam's worker.

Example::

    if __name__ == "__main__":
        exit_now(main())
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn, Optional


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):    # closed, a broken pipe, or None: nothing left to say
            pass


def exit_now(code: Optional[int]) -> NoReturn:
    """End the process with ``code`` (``None``: 0), keeping what Python's exit does for it, in its order:
    non-daemon threads joined, ``atexit`` handlers run, output flushed. A ``code`` that is not an int or
    None (``sys.exit("text")``) takes Python's own way out."""
    if code is not None and not isinstance(code, int):
        sys.exit(code)
    shutdown = getattr(threading, "_shutdown", None)     # what Py_FinalizeEx calls first
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    _flush()
    os._exit(code or 0)
