"""Shared CLI plumbing: one-line errors with exit status 2, and plain tables.

Bad input (configs, paths, env ids, corrupted or too-new stores) raises one
of DataBloom's user-error classes; :func:`cli_errors` prints it as a single
``error: ...`` line on stderr and exits 2. Anything else is a bug and keeps
its traceback.
"""
from __future__ import annotations

import functools
import os
import sys
import warnings

# Quiet TensorFlow's C++ start-up chatter before anything imports TF.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", message="Statistics for quantized inputs were expected")
from typing import Callable, List, Sequence, Tuple, Type


def user_errors() -> Tuple[Type[BaseException], ...]:
    """Exception classes that mean bad input, not a bug."""
    from core.config import ConfigError
    from core.envs import EnvError
    from core.urls import LocationError
    errors: list = [ConfigError, EnvError, LocationError, FileNotFoundError]
    try:
        from core.replay import ReplayError
        errors.append(ReplayError)
    except ImportError:
        pass
    try:
        from core.checkpoint import CheckpointError
        errors.append(CheckpointError)
    except ImportError:
        pass
    return tuple(errors)


def cli_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a CLI ``main``: user errors -> one line on stderr, exit code 2."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except user_errors() as e:
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"error: {msg}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    return wrapper


def print_table(header: Sequence[str], rows: List[Sequence[object]], file=None) -> None:
    """Print a markdown-style table (readable in a terminal, pasteable into docs)."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]]
    print("\n".join(out), file=file or sys.stdout)
