"""When this process started, on the wall clock: the zero of every "from process start" figure.

``psutil.Process.create_time()`` adds a process's start, in clock ticks since boot, to the boot time in
``/proc/stat``, which is a whole number of seconds: every process looks up to 1 s older than it is (0.87 s
on 2026-12-06's machine). So the time to target, the start-up and "since process start" of a summary, and
the SB3 runs timed beside DataBloom's, all carried up to 1 s that no process spent. The boot time is taken
here from ``/proc/uptime`` (to the hundredth) instead; without ``/proc/uptime`` or psutil, psutil's
figure or this module's import time serves.

Example::

    from core.process_clock import process_start_time
    time_to_target_s = time.time() - process_start_time()
"""
from __future__ import annotations

import os
import time
from typing import Optional

_IMPORT_TIME = time.time()


def process_start_time(pid: Optional[int] = None) -> float:
    """Wall-clock start of process ``pid`` (this one by default)."""
    try:
        import psutil
    except ImportError:
        return _IMPORT_TIME
    proc = psutil.Process(os.getpid() if pid is None else pid)
    try:
        with open("/proc/uptime") as f:
            boot = time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return proc.create_time()
    return proc.create_time() - psutil.boot_time() + boot
