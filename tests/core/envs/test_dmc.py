"""dm_control adapter: flattening, action repeat, seeding, episode ends, one-line errors."""
import numpy as np
import pytest

from core.envs import EnvError
from core.envs import dmc as dmc_adapter


@pytest.mark.parametrize("versions, match", [
    ({"dm-control": None, "mujoco": "3.17.0"}, "dm_control is not installed"),
    ({"dm-control": "1.0.50", "mujoco": None}, "mujoco is not installed"),
    ({"dm-control": "1.0.50", "mujoco": "4.0.0"}, r"mujoco 4.0.0 is not supported.*valid: mujoco>=3.17,<4"),
    ({"dm-control": "1.0.50", "mujoco": "3.3.7"}, r"mujoco 3.3.7 is not supported"),
    ({"dm-control": "1.0.20", "mujoco": "3.17.0"}, r"dm_control 1.0.20 is too old"),
])
def test_dependency_errors_are_one_line(versions, match):
    with pytest.raises(EnvError, match=match) as e:
        dmc_adapter.check_dependencies(versions)
    assert "\n" not in str(e.value)


def test_dependency_ok_versions():
    dmc_adapter.check_dependencies({"dm-control": "1.0.50", "mujoco": "3.17.0"})
    dmc_adapter.check_dependencies({"dm-control": "1.1.0", "mujoco": "3.99.1rc1"})


@pytest.mark.parametrize("env_id, expected", [
    ("dmc:cartpole-balance", ("cartpole", "balance", 1)),
    ("dmc:finger-turn_hard?repeat=2", ("finger", "turn_hard", 2)),
    ("dmc:ball_in_cup-catch", ("ball_in_cup", "catch", 1)),
])
def test_parse_env_id(env_id, expected):
    assert dmc_adapter.parse_env_id(env_id) == expected


@pytest.mark.parametrize("env_id, match", [
    ("dmc:cartpole", "must look like dmc:<domain>-<task>"),
    ("dmc:walker-stand?repeat=0", "valid: \\?repeat=R"),
])
def test_malformed_ids(env_id, match):
    with pytest.raises(EnvError, match=match):
        dmc_adapter.parse_env_id(env_id)


def test_unknown_domain_and_task_name_valid_ones():
    pytest.importorskip("dm_control")
    from core.envs import check_env_id
    with pytest.raises(EnvError, match="unknown dm_control domain 'cartpol'.*did you mean cartpole"):
        check_env_id("dmc:cartpol-balance")
    with pytest.raises(EnvError, match="unknown dm_control task 'run'.*valid: cartpole-balance"):
        check_env_id("dmc:cartpole-run")


def test_unknown_task_is_one_line_cli_error(tmp_path, capsys):
    pytest.importorskip("dm_control")
    from pipelines.train import main
    code = main(["--config", "configs/dmc-cartpole-balance-d4pg.yaml", "--set", "env.id=dmc:walker-fly",
                 "--run-dir", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: unknown dm_control task 'fly'") and "\n" not in err


def test_spec_flattening_repeat_and_time_limit():
    pytest.importorskip("dm_control")
    from core.envs import env_spec, make_env
    spec = env_spec("dmc:walker-stand")
    assert spec.obs_shape == (24,) and spec.action_shape == (6,) and spec.action_low == (-1.0,) * 6
    env1, env4 = make_env("dmc:cartpole-balance"), make_env("dmc:cartpole-balance?repeat=4")
    o1, _ = env1.reset(seed=3)
    o4, _ = env4.reset(seed=3)
    assert o1.dtype == np.float32 and o1.shape == (5,)   # position (3) + velocity (2)
    np.testing.assert_array_equal(o1, o4)                 # same seed, same initial state
    total1, steps1, total4, steps4 = 0.0, 0, 0.0, 0
    a = np.zeros(1, np.float32)
    while True:
        o, r, term, trunc, _ = env1.step(a)
        total1, steps1 = total1 + r, steps1 + 1
        if term or trunc:
            break
    assert (steps1, term, trunc) == (1000, False, True)   # the suite's time limit is a truncation
    while True:
        o, r, term, trunc, _ = env4.step(a)
        total4, steps4 = total4 + r, steps4 + 1
        if term or trunc:
            break
    assert steps4 == 250 and trunc
    assert total4 == pytest.approx(total1, rel=1e-9)      # repeat sums all control-step rewards
    env5 = make_env("dmc:cartpole-balance", max_episode_steps=5)
    env5.reset(seed=0)
    ends = [env5.step(a)[3] for _ in range(5)]
    assert ends == [False] * 4 + [True]


def test_vector_env_and_rollout_smoke():
    pytest.importorskip("dm_control")
    from core.envs import make_vector_env
    envs, obs = make_vector_env("dmc:reacher-hard", 2, seed=0)
    assert obs.shape == (2, 6)
    obs, r, term, trunc, _ = envs.step(np.zeros((2, 2), np.float32))
    assert obs.dtype == np.float32 and r.shape == (2,)
    envs.close()


# -- learning regression -----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_d4pg_learns_dmc_cartpole_balance(tmp_path):
    """D4PG (int8 actors, local executor) balances dm_control's cartpole within a small budget.

    The run follows the deterministic plan, so it reproduces per seed. The
    shipped config (its learner step XLA-compiled), learning suite 2026-12-07
    (seeds 0-4): 900 confirmed at 4,096, 2,048, 4,096, 8,192 and 2,048 env
    steps, final (int8) returns 996.5, 999.7, 976.5, 996.0, 964.3; this test
    runs seed 1, one of the two quickest (the claim is the 5 seeds), to keep CI
    short. Measured without learning (5
    episodes, seeds 0-4): uniform random actions score 261-336, the zero action
    706-774, so 900 needs a learned balance.
    """
    pytest.importorskip("dm_control")
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config("configs/dmc-cartpole-balance-d4pg.yaml",
                      ["executor=local", "total_env_steps=8192", "carbon.backend='off'", "eval.stop_at_target=true",
                       "seed=1"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["best_eval_return"] >= 900, summary
    assert summary["final_eval"]["int8-dynamic"]["mean"] >= 900, summary
