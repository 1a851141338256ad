"""Agent config ranges (issue 13, item 7): every ``agent.*`` value is range-checked before anything is written.

Each algorithm's ``core/agents/<algo>/config.py`` holds a ``RANGES`` table
(checked by ``core.config.validate``). The property: every field of every
agent config has a range there, unless its type is one already (a bool, a
Literal); and every range has a bad value below that fails with the exact
one-line message.
"""
import dataclasses
import importlib
import typing

import pytest

from core.agents import registry
from core.config import ConfigError, from_dict, load_config

#: algo -> {dotted key: a value out of its range}; its keys must equal the algorithm's RANGES.
BAD_VALUES = {
    "dqn": {"gamma": 1.5, "n_step": 0, "learning_rate": 0.0, "batch_size": 0, "target_update_period": 0,
            "huber_delta": 0.0, "max_grad_norm": 0.0, "hidden": [], "epsilon.start": 1.1, "epsilon.end": -0.1,
            "epsilon.decay_steps": 0},
    "bc": {"learning_rate": 1.0, "batch_size": 0, "hidden": [0], "n_step": 0, "gamma": -0.1,
           "max_grad_norm": -1.0},
    "d4pg": {"gamma": 2.0, "n_step": 101, "num_atoms": 1, "v_min": float("-inf"), "v_max": float("inf"),
             "policy_learning_rate": 0.0, "critic_learning_rate": 1.0, "batch_size": 0, "tau": 0.0,
             "target_update_period": 0, "max_grad_norm": 0.0, "sigma": -0.1, "sigma_min": -0.1,
             "noise_ladder": -1, "policy_hidden": [], "critic_hidden": [16, 0]},
    "r2d2": {"torso": [0], "frame_stack": 0, "lstm_size": 0, "head": [-1], "gamma": 1.01, "n_step": 0, "sequence_length": 1,
             "burn_in": -1, "value_rescaling_eps": 0.0, "learning_rate": 0.0, "adam_eps": 0.0, "batch_size": 0,
             "target_update_period": 0, "max_grad_norm": 0.0, "priority_eta": 1.5, "priority_exponent": -0.5,
             "importance_exponent": 2.0, "epsilon.base": 1.5, "epsilon.alpha": -1.0, "epsilon.num_actors": 0},
    "vtrace": {"hidden": [], "frame_stack": 0, "gamma": -1.0, "unroll_length": 0, "td_lambda": 1.5,
               "rho_bar": 0.0, "c_bar": 0.0, "pg_rho_bar": -1.0, "learning_rate": 2.0, "batch_size": 0,
               "entropy_cost": -0.01, "baseline_cost": -0.5, "max_grad_norm": 0.0,
               "learning_rate_decay_steps": -1, "learning_rate_end": 1.0},
}


def _ranges(algo):
    return importlib.import_module(registry.config_class(algo).__module__).RANGES


def _leaf_fields(cls, prefix=""):
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_leaf_fields(tp, f"{prefix}{f.name}."))
        else:
            out[prefix + f.name] = tp
    return out


def _agent(algo, key, value):
    data = {"algo": algo}
    node = data
    *parents, last = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return {"agent": data}


def test_the_table_covers_every_algorithm():
    assert set(BAD_VALUES) == set(registry.algorithms())


@pytest.mark.parametrize("algo", sorted(BAD_VALUES))
def test_every_agent_config_field_has_a_range_or_a_type_that_is_one(algo):
    leaves = _leaf_fields(registry.config_class(algo))
    by_type = {k for k, tp in leaves.items() if tp is bool or typing.get_origin(tp) is typing.Literal}
    assert set(leaves) - by_type == set(_ranges(algo)), algo
    assert set(BAD_VALUES[algo]) == set(_ranges(algo))


@pytest.mark.parametrize("algo, key", [(a, k) for a in sorted(BAD_VALUES) for k in sorted(BAD_VALUES[a])])
def test_every_out_of_range_agent_value_is_one_line_naming_key_value_and_range(algo, key):
    value = BAD_VALUES[algo][key]
    with pytest.raises(ConfigError) as err:
        from_dict(_agent(algo, key, value))
    _, desc = _ranges(algo)[key]
    assert str(err.value) == f"config key 'agent.{key}' = {value!r} is out of range; valid: {desc}"


@pytest.mark.parametrize("override, value", [
    ("agent.huber_delta=1e-6", 1e-6), ("agent.max_grad_norm=1e-6", 1e-6), ("agent.max_grad_norm=1e9", 1e9),
])
def test_new_dqn_range_edges_are_accepted(override, value):
    cfg = load_config(overrides=[override])
    assert getattr(cfg.agent, override.split("=")[0].split(".")[1]) == value


def test_bc_max_grad_norm_edge_is_accepted():
    assert from_dict({"agent": {"algo": "bc", "max_grad_norm": 1e-6}}).agent.max_grad_norm == 1e-6


def test_d4pg_v_bounds_are_finite_and_ordered():
    with pytest.raises(ConfigError, match=r"'agent.v_min' = 5.0 and 'agent.v_max' = 5.0 are out of range; "
                                          r"valid: v_min < v_max"):
        from_dict({"agent": {"algo": "d4pg", "v_min": 5.0, "v_max": 5.0}, "env": {"id": "Pendulum-v1"}})
    cfg = from_dict({"agent": {"algo": "d4pg", "v_min": -1e6, "v_max": 1e6}, "env": {"id": "Pendulum-v1"}})
    assert (cfg.agent.v_min, cfg.agent.v_max) == (-1e6, 1e6)
