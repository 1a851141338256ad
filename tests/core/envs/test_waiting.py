"""waiting:<shape>-<dtype>-<micros>us: ids, errors, a real seeded env, and a step that sleeps its time."""
import numpy as np
import pytest

from core.envs import EnvError, check_env_id, env_spec, make_env, make_vector_env
from core.envs import waiting


def test_ids_parse_into_shape_dtype_and_step_time():
    assert waiting.parse_env_id("waiting:4-float32-2000us") == ((4,), "float32", 2000)
    assert waiting.parse_env_id("waiting:84x84x4-uint8-0us") == ((84, 84, 4), "uint8", 0)
    spec = env_spec("waiting:84x84x4-uint8-0us")
    assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == ((84, 84, 4), "uint8", 2)


@pytest.mark.parametrize("bad, says", [("waiting:4-float32", "valid: waiting:<shape>"),
                                       ("waiting:4-float64-10us", "valid: float32, uint8"),
                                       ("waiting:0x4-uint8-10us", ">= 1"),
                                       ("waiting:4-float32-10000001us", "valid: 0..10000000 us")])
def test_malformed_ids_get_one_line_naming_the_valid_form(bad, says):
    with pytest.raises(EnvError) as e:
        check_env_id(bad)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_each_step_sleeps_the_ids_time_and_nothing_else(monkeypatch):
    slept = []
    monkeypatch.setattr(waiting.time, "sleep", slept.append)
    env = make_env("waiting:4-float32-2500us")
    env.reset(seed=0)
    for _ in range(3):
        env.step(1)
    assert slept == [0.0025] * 3
    env0 = make_env("waiting:4-float32-0us")
    env0.reset(seed=0)
    env0.step(0)
    assert slept == [0.0025] * 3       # a 0 us step does not call sleep


def test_rows_are_seeded_rewards_one_and_episodes_truncate(monkeypatch):
    monkeypatch.setattr(waiting.time, "sleep", lambda s: None)
    a, b = make_env("waiting:3x2-uint8-5us", max_episode_steps=4), make_env("waiting:3x2-uint8-5us")
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    np.testing.assert_array_equal(oa, ob)
    assert oa.dtype == np.uint8 and oa.shape == (3, 2)
    out = [a.step(0) for _ in range(4)]
    assert [r for _, r, _, _, _ in out] == [1.0] * 4
    assert [(term, trunc) for _, _, term, trunc, _ in out] == [(False, False)] * 3 + [(False, True)]
    np.testing.assert_array_equal(out[0][0], b.step(1)[0])    # the action does not matter
    c = make_env("waiting:4-float32-5us")
    c.reset(seed=0)
    steps = 0
    while not c.step(0)[3]:
        steps += 1
    assert steps + 1 == waiting.EPISODE_STEPS


def test_vectorized_like_any_gymnasium_env(monkeypatch):
    monkeypatch.setattr(waiting.time, "sleep", lambda s: None)
    envs, obs = make_vector_env("waiting:4-float32-1us", num_envs=3, seed=5)
    assert obs.shape == (3, 4) and obs.dtype == np.float32 and ((0 <= obs) & (obs < 1)).all()
    assert not np.array_equal(obs[0], obs[1])      # env i is seeded seed + i
    envs.close()
