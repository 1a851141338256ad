"""Shared CLI plumbing: one-line errors with exit status 2, Ctrl-C, output checks, plain tables.

Every CLI's ``main`` is wrapped by :func:`cli_errors`, once:

* bad input (configs, paths, env ids, corrupted or too-new stores, a run
  directory in use) raises one of DataBloom's user-error classes, and every
  ``OSError`` (a file in the way, a read-only file system, a scheduler that
  does not answer) is the environment's, not a bug: both print as a single
  ``error: ...`` line on stderr, exit status 2;
* Ctrl-C prints one line, exit status 130: the :class:`Interrupted` message
  (``pipelines.train`` names the resume command there) or ``interrupted``;
* anything else is a bug and keeps its traceback.

A CLI ends through :func:`core.fast_exit.exit_now` (``if __name__ == "__main__":
exit_now(main())``): the interpreter's teardown of every module, ~1 s once TensorFlow is
loaded, comes after the summary and the exit status are settled, and is skipped.

Output locations are checked before long work (:func:`check_output_file`,
:func:`check_creatable_dir`), so an unwritable ``--export`` fails in a second,
not after the evaluation. Every run directory, store or dataset argument goes
through :func:`check_locations` first: a malformed one (``gs://``, ``s3:/b``,
``hdfs://x``) is refused before anything slow is imported or anything written,
and an object store that cannot be used is refused within
``core.urls.PROBE_TIMEOUT_S``.

Example::

    @cli_errors
    def main(argv=None) -> int:
        args = parser.parse_args(argv)
        check_output_file(args.export, "--export")   # before the long work
        ...
"""
from __future__ import annotations

import functools
import os
import sys
import uuid
import warnings

# Quiet TensorFlow's C++ start-up chatter before anything imports TF: its notices below WARNING, and the
# two it logs before reading that setting (core.native_logs), wherever this process first imports it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
from core.native_logs import quiet_tensorflow_import  # noqa: E402
quiet_tensorflow_import()
warnings.filterwarnings("ignore", message="Statistics for quantized inputs were expected")
from typing import Callable, List, Optional, Sequence, Tuple, Type


class Interrupted(KeyboardInterrupt):
    """Ctrl-C with a one-line message for the user (e.g. how to resume)."""


#: (module, class) of DataBloom's bad-input errors; OSError is the environment's.
_USER_ERRORS = (("core.config", "ConfigError"), ("core.envs", "EnvError"), ("core.urls", "LocationError"),
                ("core.replay", "ReplayError"), ("core.checkpoint", "CheckpointError"))


def user_errors() -> Tuple[Type[BaseException], ...]:
    """Exception classes that mean bad input, not a bug: OSError and the error classes of those of
    DataBloom's modules that are loaded. A class whose module was never imported cannot have been
    raised, and importing core.checkpoint only to name its class would cost tensorstore's import
    (~1 s) on every one-line error, such as a malformed ``--run-dir``."""
    errors: list = [OSError]
    for module_name, class_name in _USER_ERRORS:
        error_class = getattr(sys.modules.get(module_name), class_name, None)
        if error_class is not None:
            errors.append(error_class)
    return tuple(errors)


def error_line(e: BaseException) -> str:
    """The one-line message of a user error (OSError: what failed, and on which path)."""
    if isinstance(e, OSError) and e.strerror and e.filename is not None:
        where = f"{e.filename}" + (f" -> {e.filename2}" if e.filename2 is not None else "")
        return f"{e.strerror}: {where}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _quiet_second_interrupt() -> None:
    """A second Ctrl-C while the first is being reported must not print a traceback."""
    import signal
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:   # not the main thread (a main() called from a thread, in tests)
        pass


def cli_errors(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a CLI ``main``: user and OS errors -> one ``error:`` line, exit 2; Ctrl-C -> one line, exit 130."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except user_errors() as e:
            print(f"error: {error_line(e)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:
            _quiet_second_interrupt()
            print(str(e) if isinstance(e, Interrupted) and str(e) else "interrupted", file=sys.stderr)
            return 130
    return wrapper


def _probe_write(directory: str, what: str, path: str) -> None:
    """Create and delete a file in ``directory``: the only check that holds for root and read-only mounts."""
    from core.config import ConfigError
    probe = os.path.join(directory, f".databloom-probe-{uuid.uuid4().hex}")
    try:
        with open(probe, "xb"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{what} {path!r} cannot be written ({e.strerror or type(e).__name__}); "
                          "valid: a path in a writable directory") from None


def check_output_file(path: Optional[str], what: str) -> None:
    """Raise a one-line ConfigError unless the local file ``path`` can be written (None: nothing to check)."""
    from core.config import ConfigError
    if path is None:
        return
    if os.path.isdir(path):
        raise ConfigError(f"{what} {path!r} is a directory; valid: a file path")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        reason = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise ConfigError(f"{what} {path!r}: {parent!r} {reason}; valid: a path in an existing directory")
    _probe_write(parent, what, path)


def check_creatable_dir(path: str, what: str) -> None:
    """Check that the local directory ``path`` exists or can be created there, writing nothing that stays.

    A URL, or a path that looks like one (``gs:/x``), is refused: this output is local only.
    """
    from core import urls
    from core.config import ConfigError
    check_locations((what, path), probe=False)
    if urls.scheme_of(urls.parse(path)) != "file":
        raise ConfigError(f"{what} {path!r} is a URL; valid: a local directory")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{what} {path!r} is a file; valid: a directory (existing or new)")
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise ConfigError(f"{what} {path!r} is under the file {ancestor!r}; valid: a directory (existing or new)")
    _probe_write(ancestor, what, path)


def check_locations(*named: Tuple[str, Optional[str]], probe: bool = True) -> None:
    """Refuse each malformed ``(what, location)`` at once, then (``probe``) each unusable object store.

    Every location is parsed (:func:`core.urls.parse`) before any is probed, so a typo costs no
    network wait; ``None`` means not given. Errors are one-line ``LocationError``s naming ``what``.

    Example::

        check_locations(("--run-dir", args.run_dir), ("--resume", args.resume), probe=False)
    """
    from core import urls
    given = [(what, value) for what, value in named if value is not None]
    for check in (urls.parse, urls.probe) if probe else (urls.parse,):
        for what, value in given:
            try:
                check(value)
            except urls.LocationError as e:
                raise urls.LocationError(f"{what} {e}") from None


def parse_with_pipeline_args(parser, argv: Optional[Sequence[str]] = None):
    """``(args, pipeline_args)``: ``parser``'s options, and the rest for Beam (``--runner``, ``--project``, ...),
    untouched except a shell-style ``--`` separator (``... -- --runner X``). Beam's own parser reads every
    option after a ``--`` as a positional and drops it without a word: the run would go to another runner."""
    args, rest = parser.parse_known_args(argv)
    return args, [a for a in rest if a != "--"]


def print_table(header: Sequence[str], rows: List[Sequence[object]], file=None) -> None:
    """Print a markdown-style table (readable in a terminal, pasteable into docs)."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]]
    print("\n".join(out), file=file or sys.stdout)
