"""Our options of a Beam training run, taken out of the pipeline options before Beam sees them.

``--blocks_per_round N``: plan blocks per round pipeline (default: sized to the runner,
:mod:`pipelines.beam.round_size`). ``--round_startup_s S``: a job's start-up in seconds, for that sizing
(default :data:`pipelines.beam.round_size.STARTUP_S`, then measured). ``--show-rounds``: print the round
plan and exit, submitting nothing. Every other option passes through to Beam untouched
(:func:`pipelines.executors.beam.pipeline_options`).

Example::

    args, ours = round_options(["--runner", "DirectRunner", "--blocks_per_round", "8"])
    # args == ["--runner", "DirectRunner"], ours.blocks_per_round == 8, ours.startup_s is None
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class RoundOptions:
    blocks_per_round: Optional[int] = None     # None: sized to the runner
    startup_s: Optional[float] = None          # None: the runner's default, then measured
    show: bool = False                         # --show-rounds


def _take(args: List[str], flag: str, has_value: bool = True) -> Optional[str]:
    """Remove every ``flag [value]`` / ``flag=value`` from ``args``; the last value (or "" for a bare flag)."""
    value, i = None, 0
    while i < len(args):
        a = args[i]
        if a == flag or a.startswith(flag + "="):
            if "=" in a or not has_value:
                value = a.split("=", 1)[1] if "=" in a else ""
                del args[i]
            else:
                value = args[i + 1] if i + 1 < len(args) else ""
                del args[i:i + 2]
            continue
        i += 1
    return value


def round_options(pipeline_args: Sequence[str]) -> Tuple[List[str], RoundOptions]:
    """Our options taken out of ``pipeline_args`` (module docstring).

    Raises:
        ConfigError: ``--blocks_per_round`` is not an integer >= 1, or ``--round_startup_s`` not a number >= 0.
    """
    from core.config import ConfigError
    args = list(pipeline_args)
    blocks, startup = _take(args, "--blocks_per_round"), _take(args, "--round_startup_s")
    show = _take(args, "--show-rounds", has_value=False) is not None
    if blocks is not None and (not blocks.isdigit() or int(blocks) < 1):
        raise ConfigError(f"--blocks_per_round {blocks!r} is not valid; valid: an integer >= 1 "
                          "(plan blocks per round pipeline; default: sized so job start-up stays <= 10%)")
    seconds = None
    if startup is not None:
        try:
            seconds = float(startup)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0 or seconds == float("inf"):
            raise ConfigError(f"--round_startup_s {startup!r} is not valid; valid: a number of seconds >= 0 "
                              "(a round job's start-up; default 8 for the DirectRunner, 180 for Dataflow)")
    return args, RoundOptions(int(blocks) if blocks is not None else None, seconds, show)
