"""SEED central inference: wire format, batching bounds, faults, server-side unrolls, learning."""
import os
import signal
import threading
import time
import uuid

import numpy as np
import pytest

from core.inference import protocol
from core.inference.batching import DynamicBatcher
from core.rollout import ActorSpec


@pytest.fixture(scope="module")
def payload():
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("int8-dynamic").quantize(mlp(4, [16], 2, name="policy", seed=0), version=1)


@pytest.fixture(scope="module")
def spec():
    from core.envs import env_spec
    return env_spec("CartPole-v1")


def _sock() -> str:
    return f"unix:///tmp/dbinf-test-{uuid.uuid4().hex[:10]}.sock"


def _server(payload, spec, address=None, **kw):
    from core.inference.server import InferenceServer
    return InferenceServer(address or _sock(), payload, spec, unroll_length=16, **kw).start()


# -- protocol -----------------------------------------------------------------------

def test_protocol_round_trip_keeps_dtypes_and_shapes():
    arrays = {"observation": np.arange(12, dtype=np.uint8).reshape(3, 2, 2), "reward": np.ones(3, np.float32),
              "terminated": np.array([True, False, True])}
    header, out = protocol.decode(protocol.encode({"kind": "step", "x": 1}, arrays))
    assert header == {"kind": "step", "x": 1}
    for k, v in arrays.items():
        assert out[k].dtype == v.dtype
        np.testing.assert_array_equal(out[k], v)


GOOD = protocol.encode({"kind": "step"}, {"a": np.zeros(4, np.float32)})


@pytest.mark.parametrize("data, reason", [
    (b"", "shorter than its length prefix"),
    (b"\xff\xff\xff\x00junk", "header length"),
    (b"\x03\x00\x00\x00abc", "not valid JSON"),
    (GOOD[:-1], "needs 16 bytes"),
    (GOOD + b"\x00", "trailing bytes"),
    (b"\x2d\x00\x00\x00" + b'{"kind":"step","arrays":[["a","object",[1]]]}', "dtype 'object'"),
])
def test_protocol_rejects_malformed_messages_with_a_reason(data, reason):
    with pytest.raises(protocol.ProtocolError, match=reason):
        protocol.decode(data)


def test_protocol_rejects_oversized_messages():
    with pytest.raises(protocol.ProtocolError, match="exceeds the limit of 100 bytes"):
        protocol.decode(protocol.encode({"kind": "step"}, {"a": np.zeros(64, np.float32)}), max_bytes=100)


# -- batching -----------------------------------------------------------------------

def test_partial_batch_is_released_by_the_wait_timeout():
    calls = []
    batcher = DynamicBatcher(lambda x: (calls.append(len(x)), x * 2)[1], max_batch_size=64, max_wait_s=0.05)
    t0 = time.perf_counter()
    fut = batcher.submit(np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(fut.result(timeout=5), np.full((3, 2), 2.0))
    waited = time.perf_counter() - t0
    batcher.close()
    assert 0.04 <= waited < 2.0 and calls == [3] and batcher.stats()["timeouts"] == 1


def test_full_batch_runs_without_waiting_and_results_split_per_request():
    batcher = DynamicBatcher(lambda x: x + 1, max_batch_size=8, max_wait_s=30.0)
    t0 = time.perf_counter()
    futs = [batcher.submit(np.full((4, 1), i, np.float32)) for i in range(2)]
    outs = [f.result(timeout=5) for f in futs]
    assert time.perf_counter() - t0 < 5.0
    np.testing.assert_array_equal(outs[0], np.full((4, 1), 1.0))
    np.testing.assert_array_equal(outs[1], np.full((4, 1), 2.0))
    s = batcher.stats()
    batcher.close()
    assert s["batches"] == 1 and s["rows"] == 8 and s["mean_fill"] == 1.0 and s["timeouts"] == 0


def test_batch_closes_early_when_every_client_is_in_it():
    batcher = DynamicBatcher(lambda x: x, max_batch_size=64, max_wait_s=30.0, expected_requests=lambda: 1)
    t0 = time.perf_counter()
    batcher.submit(np.zeros((2, 1), np.float32)).result(timeout=5)
    batcher.close()
    assert time.perf_counter() - t0 < 5.0


# -- server + env-only actors ---------------------------------------------------------

def _run_actor(address, actor_id, steps, out, **kw):
    from core.inference.client import run_env_actor_task
    try:
        out[actor_id] = run_env_actor_task(address, ActorSpec("t", "CartPole-v1", 4, 0, actor_id),
                                           max_env_steps=steps, **kw)
    except Exception as e:  # noqa: BLE001
        out[actor_id] = e


def test_server_unrolls_follow_the_rlds_contract(payload, spec):
    server = _server(payload, spec)
    out = {}
    _run_actor(server.address, 3, 4 * 300, out)
    batches = server.drain()
    episodes = server.pop_episodes()
    server.stop()
    assert out[3]["env_steps"] == 1200 and len(batches) == 299 // 16    # the 300th row waits for its reward
    b = batches[0]
    assert b.reward.shape == (16, 4) and b.extras["logits"].shape == (16, 4, 2)
    rows = {k: np.concatenate([getattr(x, k) for x in batches]) for k in
            ("action", "reward", "terminated", "truncated", "step", "episode_id", "discount")}
    last = rows["terminated"] | rows["truncated"]
    assert (rows["action"][last] == 0).all() and (rows["reward"][last] == 0).all()
    t, e = np.nonzero(last[:-1])
    assert (rows["step"][t + 1, e] == 0).all() and (rows["episode_id"][t + 1, e] != rows["episode_id"][t, e]).all()
    same = rows["episode_id"][1:] == rows["episode_id"][:-1]
    assert (rows["step"][1:][same] == rows["step"][:-1][same] + 1).all()
    np.testing.assert_array_equal(rows["discount"] == 0.0, rows["terminated"])
    assert set(np.unique(rows["episode_id"] >> 32)) == {12, 13, 14, 15}      # actor 3 x 4 envs
    assert episodes and all(r == float(l) for r, l in episodes)             # CartPole: return == length


def test_malformed_and_oversized_requests_are_rejected_and_others_keep_being_served(payload, spec):
    import grpc
    server = _server(payload, spec, max_message_bytes=1 << 16)
    out = {}
    good = threading.Thread(target=_run_actor, args=(server.address, 0, 4 * 2000, out))
    good.start()
    with grpc.insecure_channel(server.address) as ch:
        call = ch.stream_stream(protocol.METHOD)
        hello = protocol.encode({"kind": "hello", "actor_id": 9, "num_envs": 2, "obs_shape": [4]})
        cases = [
            ([b"garbage"], grpc.StatusCode.INVALID_ARGUMENT, "header length"),
            ([hello, protocol.encode({"kind": "step"}, {"observation": np.zeros((2, 3), np.float32)})],
             grpc.StatusCode.INVALID_ARGUMENT, "lacks array|shape"),
            ([protocol.encode({"kind": "hello", "actor_id": 1, "num_envs": 2, "obs_shape": [84, 84]})],
             grpc.StatusCode.INVALID_ARGUMENT, "does not match"),
            ([hello, b"\x00" * (1 << 17)], grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        ]
        for msgs, code, pattern in cases:
            with pytest.raises(grpc.RpcError) as err:
                for _ in call(iter(msgs), timeout=10):
                    pass
            assert err.value.code() == code, err.value
            assert not pattern or __import__("re").search(pattern, err.value.details())
    good.join(60)
    stats = server.stats()
    server.stop()
    assert out[0]["env_steps"] == 8000 and out[0]["reconnects"] == 0
    assert stats["rejected"] >= 3


def test_killed_actor_does_not_disturb_the_server(payload, spec):
    import multiprocessing
    from pipelines.central import _actor_process
    server = _server(payload, spec)
    proc = multiprocessing.get_context("spawn").Process(
        target=_actor_process, args=(server.address, ActorSpec("t", "CartPole-v1", 4, 0, 1)), daemon=True)
    proc.start()
    deadline = time.time() + 60
    while server.env_steps < 2000 and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    deadline = time.time() + 10
    while server.active_streams and time.time() < deadline:
        time.sleep(0.05)
    assert server.active_streams == 0
    out = {}
    _run_actor(server.address, 2, 400, out)                 # a new actor is served as before
    server.stop()
    assert out[2]["env_steps"] == 400


def test_actor_survives_a_server_restart_with_fresh_episodes(payload, spec):
    address = _sock()
    first = _server(payload, spec, address)
    out = {}
    actor = threading.Thread(target=_run_actor, args=(address, 0, 4 * 3000, out), kwargs={"give_up_s": 30})
    actor.start()
    while first.env_steps < 1000:
        time.sleep(0.01)
    first.stop(grace=0)
    time.sleep(0.3)                                     # actor is retrying with backoff meanwhile
    second = _server(payload, spec, address, first_connection=1000)
    actor.join(60)
    batches = second.drain()
    second.stop()
    assert out[0]["env_steps"] == 12000 and out[0]["reconnects"] >= 1, out[0]
    # the new connection starts fresh episodes (step 0) with ids of connection >= 1000
    assert (batches[0].step[0] == 0).all()
    assert ((batches[0].episode_id[0] & 0xFFFFFFFF) >> 20 >= 1000).all()


def test_unreachable_address_fails_after_backoff_with_one_line_error():
    from core.inference.client import InferenceUnavailable, run_env_actor_task
    t0 = time.perf_counter()
    with pytest.raises(InferenceUnavailable) as err:
        run_env_actor_task("unix:///tmp/databloom-nobody-listens.sock", ActorSpec("t", "CartPole-v1", 2, 0, 0),
                           give_up_s=1.0, connect_timeout_s=0.2)
    msg = str(err.value)
    assert time.perf_counter() - t0 < 10 and "\n" not in msg
    assert "unix:///tmp/databloom-nobody-listens.sock unreachable" in msg


def test_central_with_beam_is_a_config_error(tmp_path):
    from core.config import ConfigError, load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"), ["executor=beam", "inference=central"])
    with pytest.raises(ConfigError, match="inference 'central' runs on executor local or dask"):
        train(cfg, str(tmp_path / "r"), progress=False)


# -- training ------------------------------------------------------------------------

@pytest.mark.timeout(240)
def test_vtrace_learns_cartpole_with_central_inference(tmp_path):
    """Learning regression (SEED mode): env-only actor processes + batched int8 inference, >= 200."""
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=local", "inference=central", "total_env_steps=200000",
                       "eval.target_return=200", "eval.confirm_episodes=20"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["best_eval_return"] >= 200, summary
    assert summary["inference"]["batches"] > 0 and summary["inference"]["rejected"] == 0


@pytest.mark.timeout(180)
def test_central_mode_runs_env_actors_as_dask_tasks(tmp_path):
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=dask", "inference=central", "total_env_steps=12000", "actors.num_actors=2",
                       "dask.n_workers=2", "eval.every_env_steps=100000"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["env_steps"] >= 12000 and summary["inference"]["connections"] >= 2
    assert summary["learner_steps"] > 0
