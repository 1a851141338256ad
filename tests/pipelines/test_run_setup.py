"""The run set-up the driver and the Beam launcher share (pipelines.run.setup): exact values."""
import os

import pytest

from core import config as config_lib
from core.config import ConfigError
from pipelines.run import setup as run_setup


def _cfg(**overrides):
    data = {"name": "tiny", "seed": 7, "env": {"num_envs": 3}, "actors": {"num_actors": 2}}
    data.update(overrides)
    return config_lib.from_dict(data)


def test_a_new_run_is_refused_where_a_run_is_and_a_resume_is_not(tmp_path):
    run_dir = str(tmp_path / "run")
    run_setup.check_run_dir(run_dir, resume=False)                  # nothing there: fine
    with pytest.raises(FileNotFoundError, match="no run under"):
        run_setup.check_run_dir(run_dir, resume=True, resume_needs_config=True)
    run_setup.check_run_dir(run_dir, resume=True)                   # the driver's resume: refused later
    os.makedirs(run_dir)
    run_setup.write_config(run_dir, _cfg(), resume=False)
    with pytest.raises(ConfigError, match=f"^{run_dir} already holds a run; valid: --resume {run_dir}, or a new"):
        run_setup.check_run_dir(run_dir, resume=False)
    run_setup.check_run_dir(run_dir, resume=True, resume_needs_config=True)


def test_run_ids_keep_each_executors_form():
    cfg = _cfg()
    assert run_setup.run_id(cfg) == "tiny-7"                        # the Beam launcher's
    driver = run_setup.run_id(cfg, "runs/a")
    assert driver == f"tiny-7-{abs(hash('runs/a')) % 10**8}"        # the driver's: distinct per run dir
    assert driver != run_setup.run_id(cfg, "runs/b")


def test_actor_specs_are_built_one_way():
    cfg = _cfg(agent={"algo": "dqn"})
    specs = run_setup.actor_specs(cfg, "tiny-7", "epsilon_greedy", first_task=12)
    assert [s.actor_id for s in specs] == [0, 1]
    s = specs[1]
    assert (s.run_id, s.env_id, s.num_envs, s.seed, s.max_episode_steps, s.litert_threads, s.selector,
            s.first_task, s.frame_stack) == ("tiny-7", cfg.env.id, 3, 7, cfg.env.max_episode_steps,
                                             cfg.threads.litert, "epsilon_greedy", 12, 1)


def test_config_json_is_rewritten_on_resume_only_when_it_changed(tmp_path):
    run_dir = str(tmp_path)
    path = os.path.join(run_dir, "config.json")
    run_setup.write_config(run_dir, _cfg(), resume=False)
    os.utime(path, (1, 1))
    run_setup.write_config(run_dir, _cfg(), resume=True)            # same config: untouched
    assert os.stat(path).st_mtime == 1
    run_setup.write_config(run_dir, _cfg(seed=8), resume=True)      # --set seed=8: written
    with open(path) as f:
        assert f.read() == config_lib.to_json(_cfg(seed=8))


def test_no_progress_bar_when_disabled_and_the_shared_postfix():
    from pipelines.run.flight import LoopState
    assert run_setup.progress_bar(False, 100, 0, "step", "tiny") is None
    loop = LoopState(env_steps=0, policy_version=3)
    assert run_setup.progress_postfix(loop, 5, start=0.0, recent_returns=[]) == {
        "sps": "0", "learn": 5, "ret": "-", "best": "-", "v": 3}
    loop.best_return, loop.best_version = 199.6, 2
    out = run_setup.progress_postfix(loop, 5, 0.0, [10.0, 20.0])
    assert (out["ret"], out["best"]) == ("15", "200")
