"""DatasetError: bad input to a dataset operation (one line naming what is wrong and what is valid)."""
from __future__ import annotations

from core.replay.schema import ReplayError


class DatasetError(ReplayError):
    """A dataset operation cannot run on this input (CLIs print it as one line, exit 2)."""
