"""Algorithm registry: algo name -> config dataclass and builder (lazily imported).

Importing this module is cheap (no TensorFlow): configs are validated before
any learner is built, and actors never import learners.
"""
from __future__ import annotations

import importlib
from typing import Dict, Tuple

#: algo -> ("module:ConfigClass", "module:BuilderClass")
AGENTS: Dict[str, Tuple[str, str]] = {
    "dqn": ("core.agents.dqn.config:DQNConfig", "core.agents.dqn.builder:DQNBuilder"),
    "bc": ("core.agents.bc.config:BCConfig", "core.agents.bc.builder:BCBuilder"),
    "vtrace": ("core.agents.vtrace.config:VTraceConfig", "core.agents.vtrace.builder:VTraceBuilder"),
    "d4pg": ("core.agents.d4pg.config:D4PGConfig", "core.agents.d4pg.builder:D4PGBuilder"),
    "r2d2": ("core.agents.r2d2.config:R2D2Config", "core.agents.r2d2.builder:R2D2Builder"),
}


def _load(target: str):
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def algorithms() -> Tuple[str, ...]:
    return tuple(AGENTS)


def config_class(algo: str):
    """The agent config dataclass for ``algo`` (caller has checked the name)."""
    return _load(AGENTS[algo][0])


def get_builder(algo: str):
    """An :class:`~core.agents.base.AgentBuilder` instance for ``algo``."""
    if algo not in AGENTS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: {', '.join(AGENTS)}")
    return _load(AGENTS[algo][1])()
