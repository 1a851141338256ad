"""Learner state as nested dicts of host arrays, under names that do not depend on build order.

Checkpoints store each learner variable under a key derived from its Keras
path without the owning model's or optimizer's name (``q/dense_0/kernel`` ->
``dense_0.kernel``; ``adam_2/q_dense_0_kernel_momentum`` ->
``003_q_dense_0_kernel_momentum``). Online and target networks therefore
share keys, and a learner built second in a process (whose optimizer Keras
names ``adam_1``) restores what the first one saved.

Example::

    state = {"params": named(q.weights), "optimizer": optimizer_state(opt)}
    assign(q_copy.weights, state["params"])
    restore_optimizer(opt, state["optimizer"])
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

import numpy as np


def _key(variable, prefix: str = "") -> str:
    name = variable.path.split("/", 1)[-1].replace("/", ".")
    return f"{prefix}.{name}" if prefix else name


def named(variables, prefix: str = "") -> Dict[str, np.ndarray]:
    """``{key: host copy}`` for ``variables`` (keys optionally prefixed ``prefix.``)."""
    return {_key(v, prefix): np.array(v.numpy()) for v in variables}


def assign(variables, values: Dict[str, np.ndarray], prefix: str = "", strict: bool = True) -> None:
    """Assign ``values[key]`` to each variable; a missing key is an error when ``strict``."""
    for v in variables:
        key = _key(v, prefix)
        if key in values:
            v.assign(values[key])
        elif strict:
            raise KeyError(f"checkpoint has no value for variable {key!r}; it has {sorted(values)[:8]}...")


def _optimizer_vars(optimizer, prefix: str) -> List[Tuple[str, object]]:
    lead = f"{prefix}_" if prefix else ""
    return [(f"{lead}{i:03d}_{_key(v)}", v) for i, v in enumerate(optimizer.variables)]


def optimizer_state(optimizer, prefix: str = "") -> Dict[str, np.ndarray]:
    """The optimizer's slots and counters as ``{key: host copy}`` (index keeps their order)."""
    return {key: np.array(v.numpy()) for key, v in _optimizer_vars(optimizer, prefix)}


def restore_optimizer(optimizer, values: Dict[str, np.ndarray], prefix: str = "", strict: bool = False) -> None:
    """Load :func:`optimizer_state` output into ``optimizer``.

    Keys written with the optimizer's per-process name (``000_adam_3.iteration``, R2D2's and BC's
    checkpoints before this helper) are read as their name-free twins (``000_iteration``). With
    ``strict`` a key the optimizer has and ``values`` lacks, or a ``values`` key under ``prefix`` the
    optimizer lacks, is a one-line ``ValueError``; otherwise keys it does not hold are left as they are.
    """
    values = {_LEGACY.sub(r"\1\2", key): value for key, value in values.items()}
    wanted = _optimizer_vars(optimizer, prefix)
    if strict:
        lead = re.compile(rf"{re.escape(prefix)}_\d{{3}}_" if prefix else r"\d{3}_")
        keys = {key for key, _ in wanted}
        missing = sorted(keys - set(values))
        unexpected = sorted(k for k in values if lead.match(k) and k not in keys)
        if missing or unexpected:
            raise ValueError(f"optimizer state does not match the optimizer: missing {_few(missing)}, "
                             f"unexpected {_few(unexpected)}")
    for key, v in wanted:
        if key in values:
            v.assign(values[key])


#: ``000_adam_3.iteration`` -> ``000_iteration`` (a name-free key never holds a dot).
_LEGACY = re.compile(r"^(.*?\d{3}_)[^.]*\.(.*)$")


def _few(keys: List[str]) -> str:
    return f"{len(keys)} {keys[:3]}{'...' if len(keys) > 3 else ''}"
