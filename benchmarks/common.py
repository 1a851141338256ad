"""Helpers every benchmark record shares: the checkout, its git state, the machine, run-directory names.

A study's record says which commit made it (:func:`git_state`), on which
machine (:func:`machine_info`) and, where it names folders after overrides,
uses the same file-name-safe spelling (:func:`slug`). Imports nothing from
``benchmarks``: studies and micro-benchmarks import it, never the other way.

Example::

    commit, dirty = git_state()
    record = {"git_commit": commit, "git_dirty": dirty, "machine": machine_info(with_load=False)}
    slug("learner.replay_ratio=0.125 --set x")   # 'learner.replay_ratio=0.125---set-x'
"""
from __future__ import annotations

import os
import platform
import subprocess
from typing import Any, Dict

#: the checkout's root (benchmarks/ is not an installed package: it runs from a checkout)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Pathspec of the learning suite's own outputs (records, table, PNGs), left out of the dirty check.
OWN_OUTPUT = "benchmarks/results/learning-suite*"


def slug(text: str) -> str:
    """``text`` with every character but letters, digits and ``._=`` turned into ``-``, ends stripped."""
    return "".join(c if c.isalnum() or c in "._=" else "-" for c in text).strip("-")


def git_state() -> tuple:
    """``(HEAD commit, whether the tree has uncommitted changes)``; ``("unknown", True)`` outside git."""
    try:
        sha = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        # the suite's own records and report change while it runs: they do not make a tree dirty
        dirty = bool(subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no", "--",
                                     ".", f":(exclude){OWN_OUTPUT}"],
                                    capture_output=True, text=True, check=True).stdout.strip())
        return sha, dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True


def machine_info(with_load: bool = True) -> Dict[str, Any]:
    """CPU model, core count, Python and platform, and (``with_load``) the load average now."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "loadavg": os.getloadavg()}
    if not with_load:
        info.pop("loadavg")
    return info
