"""The shipped sweep specs (configs/sweeps/*.yml) and config entries: exact runs, names, overrides, errors."""
import json
import os

import pytest

from core.config import ConfigError
from pipelines.sweeps import SweepDir, SweepSpec, expand, validate_runs
from pipelines.sweeps.spec import ConfigEntry, read_spec

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SPECS = os.path.join(REPO, "configs", "sweeps")
TASKS = ("cartpole-dqn", "pendulum-d4pg", "dmc-cartpole-balance-d4pg")


def _names(spec_file):
    return [r.name for r in expand(read_spec(os.path.join(SPECS, spec_file)))]


def _grid(tasks, precisions, seeds):
    return [f"{t}__actors.precision={p}__s{s}" for t in tasks for p in precisions for s in seeds]


def test_every_shipped_spec_is_listed_here():
    assert sorted(os.listdir(SPECS)) == sorted(list(EXPECTED) + ["learning-suite.yml"])


@pytest.mark.slow
def test_each_run_of_every_shipped_spec_builds_a_valid_config():
    for name in os.listdir(SPECS):
        validate_runs(expand(read_spec(os.path.join(SPECS, name))))


EXPECTED = {
    "actorq-study.yml": _grid(TASKS, ("fp32", "int8-dynamic"), range(3)),
    "actorq-study-quick.yml": _grid(TASKS, ("fp32", "int8-dynamic"), [0]),
    "actorq-study-actor-bound.yml": _grid(TASKS[:1], ("fp32", "int8-dynamic"), range(3)),
    "actorq-study-small.yml": _grid(TASKS, ("fp32", "int8-dynamic"), range(3)),
    "actorq-ratio.yml": [f"cartpole-dqn-r{r}__s{s}" for r in ("0.25", "0.125", "0.0625", "0.03125") for s in range(3)],
    "learning-suite-quick.yml": ["default__s0", "default__s1", "cartpole-vtrace__s0", "cartpole-vtrace__s1"],
    "default-candidates.yml": [f"{c}__s{s}" for c in ("base", "h128", "h64", "rr025", "h128-rr025", "h64-rr1",
                                                       "h128-eval2k", "h128-bp100", "h128-eps4k") for s in range(10)],
    "default-candidates-eps.yml": [f"{c}__s{s}" for c in ("base", "eps4k", "eps4k-rr025") for s in range(10)],
    "default-candidates-rr.yml": [f"{c}__s{s}" for c in ("base", "rr0375", "rr025", "rr0125") for s in range(10)],
}


@pytest.mark.parametrize("spec_file", sorted(EXPECTED))
def test_a_shipped_spec_expands_to_exactly_its_runs(spec_file):
    assert _names(spec_file) == EXPECTED[spec_file]


def test_the_learning_suite_spec_has_100_runs_default_with_10_seeds():
    names = _names("learning-suite.yml")
    assert len(names) == 100 and len(set(names)) == 100
    assert names[:10] == [f"default__s{s}" for s in range(10)]
    assert names[10:20] == [f"cartpole-vtrace__s{s}" for s in range(5)] + [f"cartpole-vtrace-central__s{s}"
                                                                         for s in range(5)]
    assert "actorq-pendulum-d4pg__s4" in names and "pendulum-d4pg__s4" in names


def test_budgets_and_settings_reach_each_run_in_order():
    ratio = {r.name: r for r in expand(read_spec(os.path.join(SPECS, "actorq-ratio.yml")))}
    assert ratio["cartpole-dqn-r0.0625__s2"].overrides == [
        "threads.tf_intra_op=1", "threads.tf_inter_op=1", "replay.write_threads=1", "checkpoint.write_threads=1", "learner.replay_ratio=0.0625",
        "total_env_steps=400000",
        "actors.precision=fp32", "carbon.backend=process-time"]
    study = {r.name: r for r in expand(read_spec(os.path.join(SPECS, "actorq-study.yml")))}
    run = study["pendulum-d4pg__actors.precision=int8-dynamic__s1"]
    assert run.overrides[4:] == ["total_env_steps=4000", "carbon.backend=process-time", "actors.precision=int8-dynamic"]
    assert (run.label, run.setting, os.path.relpath(run.config, REPO)) == (
        "pendulum-d4pg", {"actors.precision": "int8-dynamic"}, "configs/actorq/pendulum-d4pg.yaml")


def test_a_spec_with_entries_round_trips_through_the_sweep_record(tmp_path):
    spec = read_spec(os.path.join(SPECS, "learning-suite-quick.yml"))
    spec = SweepSpec.from_dict(dict(spec.to_dict(), configs=[
        {"config": os.path.join(REPO, "configs", "default.yaml"), "name": "d", "seeds": [3], "set": ["eval.episodes=2"]},
        os.path.join(REPO, "configs", "default.yaml")]))
    runs = expand(spec)
    assert [r.name for r in runs] == ["d__s3", "default__s0", "default__s1"]
    sweep = SweepDir(str(tmp_path / "s"))
    sweep.create(spec, runs)
    assert sweep.load() == (spec, runs)
    data = json.load(open(sweep.record_path))       # a record written before entries had names
    for r in data["runs"]:
        del r["group"]
    json.dump(data, open(sweep.record_path, "w"))
    assert [r.label for r in sweep.load()[1]] == ["default", "default", "default"]


@pytest.mark.parametrize("entry, message", [
    ({"config": "configs/default.yaml", "seed": 1}, "has unknown key 'seed'; valid keys: config, name, seeds, set"),
    ({"name": "x"}, "must be a config file path or a mapping with 'config: PATH'"),
    ({"config": "configs/default.yaml", "name": "a/b"}, "name 'a/b' is not valid"),
    ({"config": "configs/default.yaml", "seeds": "3-1"}, "is an empty range"),
    ({"config": "configs/default.yaml", "set": {"seed": 4}}, "is set by the sweep itself"),
])
def test_a_bad_config_entry_is_one_line(entry, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SweepSpec.from_dict({"configs": [entry], "seeds": "0"})


def test_two_entries_with_one_name_are_refused():
    spec = SweepSpec(configs=[ConfigEntry(os.path.join(REPO, "configs", "default.yaml")),
                              ConfigEntry(os.path.join(REPO, "configs", "cartpole-vtrace.yaml"), name="default")],
                     seeds=[0])
    with pytest.raises(ConfigError, match="two runs would share the directory name 'default__s0'"):
        expand(spec)
