"""Our options of a Beam training run, taken out of the pipeline options before Beam sees them.

``--blocks_per_round N``: plan blocks per round pipeline (default :data:`BLOCKS_PER_ROUND`). Every
other option passes through to Beam untouched (:func:`pipelines.executors.beam.pipeline_options`).

Example::

    args, blocks_per_round = blocks_per_round_arg(["--runner", "DirectRunner", "--blocks_per_round", "8"])
    # args == ["--runner", "DirectRunner"], blocks_per_round == 8
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

#: Plan blocks per round pipeline. Measured (16,384 env steps of the default config = 16 blocks of 1,024 rows,
#: DirectRunner multi_processing, 2 shared cores): 298 env steps/s with 8 per round, 363 with 16 (one
#: pipeline); a round of 16 blocks is a ~0.8 MB job graph (Dataflow caps a request at 20 MB).
BLOCKS_PER_ROUND = 16


def blocks_per_round_arg(pipeline_args: Sequence[str]) -> Tuple[List[str], int]:
    """``--blocks_per_round N`` (ours, not Beam's) taken out of the pipeline options; default the launcher's.

    Raises:
        ConfigError: N is not an integer >= 1.
    """
    from core.config import ConfigError
    args, value, i = list(pipeline_args), None, 0
    while i < len(args):
        a = args[i]
        if a == "--blocks_per_round" or a.startswith("--blocks_per_round="):
            if "=" in a:
                value = a.split("=", 1)[1]
                del args[i]
            else:
                value = args[i + 1] if i + 1 < len(args) else ""
                del args[i:i + 2]
            continue
        i += 1
    if value is None:
        return args, BLOCKS_PER_ROUND
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"--blocks_per_round {value!r} is not valid; valid: an integer >= 1 "
                          f"(plan blocks per round pipeline, default {BLOCKS_PER_ROUND})")
    return args, int(value)
