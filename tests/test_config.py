"""Config loading and validation: every bad input gets one line naming key and choices."""
import subprocess
import sys

import pytest

from core import config as config_lib
from core.config import ConfigError, from_dict, load_config


def test_default_config_loads_typed():
    cfg = load_config()
    assert cfg.env.id == "CartPole-v1"
    assert cfg.agent.algo == "dqn"
    assert cfg.actors.precision == "int8-dynamic"
    assert cfg.executor == "dask"
    assert isinstance(cfg.agent.learning_rate, float)
    assert cfg.threads.tf_intra_op == 1


def test_overrides_parse_yaml_scalars():
    cfg = load_config(overrides=["agent.n_step=5", "agent.hidden=[32, 32]", "eval.stop_at_target=false",
                                 "agent.learning_rate=3e-4"])
    assert cfg.agent.n_step == 5
    assert cfg.agent.hidden == [32, 32]
    assert cfg.eval.stop_at_target is False
    assert cfg.agent.learning_rate == pytest.approx(3e-4)


@pytest.mark.parametrize("data, message", [
    ({"agent": {"nstep": 3}},
     "unknown config key 'agent.nstep'; valid keys: algo, hidden, gamma, n_step, double_q, learning_rate, "
     "batch_size, target_update_period, huber_delta, max_grad_norm, prioritized, epsilon"),
    ({"agent": {"n_step": "three"}}, "config key 'agent.n_step' must be an integer, got 'three'"),
    ({"agent": {"gamma": 1.5}}, "config key 'agent.gamma' = 1.5 is out of range; valid: 0..1"),
    ({"agent": {"algo": "ppo"}}, "config key 'agent.algo' = 'ppo' is not valid; valid: dqn, bc, vtrace, d4pg, r2d2"),
    ({"actors": {"precision": "int4"}},
     "config key 'actors.precision' = 'int4' is not valid; valid: fp32, fp16, int8-dynamic, int8-full"),
    ({"executor": "spark"}, "config key 'executor' = 'spark' is not valid; valid: local, dask, beam"),
    ({"eval": {"stop_at_target": "yes"}}, "config key 'eval.stop_at_target' must be true or false, got 'yes'"),
    ({"agent": {"hidden": []}}, "config key 'agent.hidden' = [] is out of range; valid: non-empty list of widths >= 1"),
])
def test_bad_values_are_rejected_with_exact_messages(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(data)
    assert str(err.value) == message


def test_yaml_off_is_the_choice_off_not_false():
    cfg = load_config(overrides=["carbon.backend=off"])
    assert cfg.carbon.backend == "off"


def test_unknown_env_id_suggests_close_matches():
    from core.envs import EnvError
    with pytest.raises(EnvError, match=r"unknown env id 'CartPol-v1'; did you mean CartPole-v1"):
        from_dict({"env": {"id": "CartPol-v1"}})


def test_missing_and_invalid_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML at line"):
        load_config(str(bad))


def test_resolved_config_round_trips_through_json():
    import json
    cfg = load_config(overrides=["seed=3"])
    again = from_dict(json.loads(config_lib.to_json(cfg)))
    assert again == cfg


@pytest.mark.parametrize("args, fragment", [
    (["--set", "agent.gamma=2"], "error: config key 'agent.gamma' = 2.0 is out of range; valid: 0..1"),
    (["--set", "env.id=NoSuchEnv-v0"], "error: unknown env id 'NoSuchEnv-v0'"),
    (["--config", "/nonexistent.yaml"], "error: config file '/nonexistent.yaml' does not exist"),
    (["--set", "bogus"], "error: override 'bogus' must look like key.sub=value"),
])
def test_train_cli_bad_input_exits_2_with_one_line(args, fragment):
    proc = subprocess.run([sys.executable, "-m", "pipelines.train", *args, "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(fragment), proc.stderr


def test_default_run_dir_never_reuses_an_earlier_run(tmp_path, monkeypatch):
    from pipelines.train import default_run_dir
    monkeypatch.chdir(tmp_path)
    assert default_run_dir("cartpole-dqn") == "runs/cartpole-dqn"
    for d in ("runs/cartpole-dqn", "runs/cartpole-dqn-2"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "config.json").write_text("{}")
    assert default_run_dir("cartpole-dqn") == "runs/cartpole-dqn-3"
