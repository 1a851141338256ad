"""The DirectRunner's SDK worker process: Beam's own worker, ended without the interpreter's teardown.

In ``multi_processing`` mode the DirectRunner starts one worker process per
``--direct_num_workers`` for every pipeline and waits for each to exit before
the pipeline counts as done (a training run's rounds use warm processes
instead, :mod:`pipelines.beam.warm_workers`; dataset passes and Beam sweeps use
these). Beam's worker (``python -m apache_beam.runners.worker.sdk_worker_main``)
returns when the runner closes its control stream; with TensorFlow loaded,
Python's module teardown after that took ~1.7 s, with nothing of ours left to
do (stores, checkpoints and records are closed by the stages).

This module runs the same ``sdk_worker_main.main`` and then ends through
:func:`core.fast_exit.exit_now` (threads joined, ``atexit`` handlers run,
output flushed, then ``os._exit``). An exception out of the worker takes
Python's own way out (traceback, exit 1), as with Beam's module.
:func:`pipelines.executors.beam.runner_for` names it as the worker command
(:data:`pipelines.executors.beam.WORKER_COMMAND`).

Example (what the DirectRunner runs, with the control and logging addresses in
the environment)::

    python -m pipelines.beam.sdk_worker
"""
from __future__ import annotations

import sys

if __name__ == "__main__":
    from apache_beam.runners.worker import sdk_worker_main

    from core.fast_exit import exit_now
    from core.native_logs import quiet_tensorflow_import
    quiet_tensorflow_import()
    sdk_worker_main.main(sys.argv)
    exit_now(0)
