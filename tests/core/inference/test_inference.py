"""SEED central inference: wire format, batching bounds, faults, server-side unrolls, learning."""
import os
import signal
import threading
import time

import numpy as np
import pytest

from core.inference import protocol
from core.inference.batching import DynamicBatcher
from core.actor import ActorSpec


@pytest.fixture(scope="module")
def payload():
    from core.networks import mlp
    from core.quantize import PolicyQuantizer
    return PolicyQuantizer("int8-dynamic").quantize(mlp(4, [16], 2, name="policy", seed=0), version=1)


@pytest.fixture(scope="module")
def spec():
    from core.envs import env_spec
    return env_spec("CartPole-v1")


_PLANS = []


def _sock() -> str:
    """A unix socket in a private directory (removed at the end of the module)."""
    from core.inference.endpoint import private_unix_socket
    _PLANS.append(private_unix_socket())
    return _PLANS[-1].bind


@pytest.fixture(scope="module", autouse=True)
def _remove_socket_dirs():
    yield
    for plan in _PLANS:
        plan.cleanup()


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


def test_protocol_framing_is_exact_bytes_for_every_dtype_and_shape():
    """The message is the header then each array's raw C-order bytes; decode gives views of them back."""
    arrays = {"b": np.array([True, False, True]), "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
              "i16": np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2],          # not contiguous
              "f64": np.array(2.5), "empty": np.zeros((0, 3), np.float32),           # 0-d and empty keep shape
              "i64": np.array([-1, 2**40], np.int64)}
    msg = protocol.encode({"kind": "k", "n": [1, 2]}, arrays)
    (hlen,) = np.frombuffer(msg[:4], "<u4")
    head = b'{"kind":"k","n":[1,2],"arrays":[["b","bool",[3]],["u8","uint8",[2,3]],["i16","int16",[3,2]],' \
           b'["f64","float64",[]],["empty","float32",[0,3]],["i64","int64",[2]]]}'
    assert msg[4:4 + hlen] == head and hlen == len(head)
    assert msg[4 + hlen:] == b"".join(np.ascontiguousarray(v).tobytes() for v in arrays.values())
    header, out = protocol.decode(msg)
    assert header == {"kind": "k", "n": [1, 2]} and list(out) == list(arrays)
    for k, v in arrays.items():
        assert out[k].dtype == v.dtype and out[k].shape == v.shape and out[k].tobytes() == v.tobytes()
    assert not out["u8"].flags.writeable and not out["u8"].flags.owndata       # a view of the message


@pytest.mark.parametrize("spec, reason", [
    ('[["a","float32",[-1]]]', "negative dimension"),
    ('[["a","float32"]]', "must be \\[name, dtype, shape\\]"),
    ('{"a":1}', "'arrays' must be a list"),
    ('[["a","float32",[2]]]', "needs 8 bytes; only 4 left"),
])
def test_protocol_rejects_bad_array_specs_with_a_reason(spec, reason):
    head = ('{"kind":"step","arrays":%s}' % spec).encode()
    with pytest.raises(protocol.ProtocolError, match=reason):
        protocol.decode(len(head).to_bytes(4, "little") + head + b"\x00" * 4)


def test_protocol_rejects_a_header_that_is_not_utf8_or_not_an_object():
    with pytest.raises(protocol.ProtocolError, match="not valid JSON"):
        protocol.decode(b"\x02\x00\x00\x00\xff\xfe")
    with pytest.raises(protocol.ProtocolError, match="JSON object with a string 'kind'"):
        protocol.decode(b"\x02\x00\x00\x00[]")


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


def test_adaptive_wait_waits_only_while_requests_arrive_faster_than_a_call():
    from core.inference.batching import adaptive_wait
    assert adaptive_wait(None, None, 0.002) == 0.002            # nothing measured yet: the configured bound
    assert adaptive_wait(0.004, None, 0.002) == 0.002
    assert adaptive_wait(0.0003, 0.001, 0.002) == 0.001         # next request due before a call ends: wait a call
    assert adaptive_wait(0.0003, 0.005, 0.002) == 0.002         # ... never past the bound
    assert adaptive_wait(0.003, 0.0006, 0.002) == 0.0           # gaps longer than a call: run what is queued
    assert adaptive_wait(0.001, 0.001, 0.002) == 0.0


def test_adaptive_batcher_stops_waiting_once_it_has_seen_slow_arrivals():
    threads = []
    batcher = DynamicBatcher(lambda x: (threads.append(threading.current_thread().name), x)[1],
                             max_batch_size=64, max_wait_s=0.3, adaptive=True)
    t0 = time.perf_counter()
    batcher.submit(np.zeros((2, 1), np.float32)).result(timeout=5)
    first = time.perf_counter() - t0                            # no rates known: waits the bound
    t1 = time.perf_counter()
    batcher.submit(np.zeros((2, 1), np.float32)).result(timeout=5)
    second = time.perf_counter() - t1                           # gap ~0.3 s >> a call of microseconds
    s = batcher.stats()
    batcher.close()
    assert first >= 0.29 and second < 0.2, (first, second)
    assert s["timeouts"] == 1 and s["wait_ms"] == 0.0 and s["gap_ms"] >= 290 and s["call_ms"] < 50
    # the second ran on the submitting thread (caller runs), the first on the batcher's
    assert threads == ["inference-batcher", threading.current_thread().name] and s["inline"] == 1


def test_adaptive_batcher_merges_requests_when_calls_cost_more_than_the_gaps():
    calls = []

    def slow(x):
        calls.append(len(x))
        time.sleep(0.2)                                         # a costly call (an accelerator's launch)
        return x

    batcher = DynamicBatcher(slow, max_batch_size=64, max_wait_s=1.0, adaptive=True)
    batcher.gap_s, batcher.call_s = 0.001, 0.2                  # as measured after a warm-up: waits 0.2 s
    futs = []
    for _ in range(4):
        futs.append(batcher.submit(np.zeros((1, 1), np.float32)))
        time.sleep(0.005)                                       # arrivals 5 ms apart, inside one call's wait
    for f in futs:
        f.result(timeout=5)
    batcher.close()
    assert calls == [4]


def test_caller_runs_never_overlaps_two_policy_calls():
    """Many threads submitting with no wait: some run inline, some on the batcher; never two calls at once."""
    running, overlaps, lock = [0], [0], threading.Lock()

    def fn(x):
        with lock:
            running[0] += 1
            overlaps[0] += running[0] > 1
        time.sleep(0.001)
        with lock:
            running[0] -= 1
        return x * 3

    batcher = DynamicBatcher(fn, max_batch_size=64, max_wait_s=0.0, adaptive=True)
    batcher.gap_s, batcher.call_s = 1.0, 0.001                   # slow arrivals: wait 0, caller runs
    results = {}

    def client(i):
        results[i] = [batcher.submit(np.full((2, 1), i * 100 + k, np.float32)).result(timeout=10)
                      for k in range(20)]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    s = batcher.stats()
    batcher.close()
    assert overlaps[0] == 0 and s["requests"] == 80 and s["rows"] == 160 and s["inline"] > 0
    for i in range(4):
        for k, out in enumerate(results[i]):
            np.testing.assert_array_equal(out, np.full((2, 1), 3.0 * (i * 100 + k)))


def test_batch_closes_early_when_every_client_is_in_it():
    batcher = DynamicBatcher(lambda x: x, max_batch_size=64, max_wait_s=30.0, expected_requests=lambda: 1)
    t0 = time.perf_counter()
    batcher.submit(np.zeros((2, 1), np.float32)).result(timeout=5)
    batcher.close()
    assert time.perf_counter() - t0 < 5.0


# -- inference runners ---------------------------------------------------------------

def test_best_chunk_is_the_lowest_time_per_row():
    from core.inference.runners import best_chunk, power_of_two_sizes
    assert power_of_two_sizes(1) == [1] and power_of_two_sizes(16) == [1, 2, 4, 8, 16]
    assert power_of_two_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert best_chunk({1: 0.12, 16: 1.45, 32: 10.6}) == 16       # the CNN at fp32: 32 rows spill the cache
    assert best_chunk({1: 0.002, 16: 0.003, 32: 0.004}) == 32    # an MLP: the call overhead dominates
    assert best_chunk({8: 0.8, 16: 1.6}) == 16                   # a tie: fewer calls


def test_litert_runner_matches_the_policy_row_for_row_at_every_split(payload):
    from core.inference.runners import LiteRTRunner
    from core.policy import LiteRTPolicy
    reference = LiteRTPolicy(payload, batch_size=1)
    x = np.random.default_rng(0).normal(size=(21, 4)).astype(np.float32)
    want = np.concatenate([reference(x[i:i + 1]) for i in range(len(x))])
    runner = LiteRTRunner(payload, max_batch_size=21, chunk_rows=8)
    for n in (1, 3, 8, 13, 21):
        np.testing.assert_allclose(runner(x[:n]), want[:n], rtol=1e-6, atol=1e-6)
    # 21 rows = 2 calls of 8 + 5 rows on the 8-row interpreter; 3 rows on the 4-row one; never 21 padded rows
    assert sorted(runner._policies) == [1, 4, 8]
    calibrated = LiteRTRunner(payload, max_batch_size=21, calibration_reps=2)
    assert sorted(calibrated.calibration) == [1, 2, 4, 8, 16, 21]
    assert calibrated.chunk_rows in calibrated.calibration and all(v > 0 for v in calibrated.calibration.values())
    with pytest.raises(ValueError, match="valid: max_batch_size >= 1, 1 <= chunk_rows <= max_batch_size"):
        LiteRTRunner(payload, max_batch_size=4, chunk_rows=8)


def test_server_runs_its_policy_through_the_runner_it_is_given(payload, spec):
    from core.inference.runners import LiteRTRunner

    class Counting(LiteRTRunner):
        rows = 0

        def __call__(self, x):
            Counting.rows += len(x)
            return super().__call__(x)

    server = _server(payload, spec, runner=Counting(payload, max_batch_size=64, chunk_rows=4))
    out = {}
    _run_actor(server.endpoint(), 0, 4 * 50, out)
    stats = server.stats()
    server.stop()
    assert out[0]["env_steps"] == 200 and Counting.rows == 200 and stats["chunk_rows"] == 4


# -- server + env-only actors ---------------------------------------------------------

def _run_actor(endpoint, actor_id, steps, out, **kw):
    from core.inference.client import run_env_actor_task
    try:
        out[actor_id] = run_env_actor_task(endpoint, ActorSpec("t", "CartPole-v1", 4, 0, actor_id),
                                           max_env_steps=steps, **kw)
    except Exception as e:  # noqa: BLE001
        out[actor_id] = e


def test_server_unrolls_follow_the_rlds_contract(payload, spec):
    server = _server(payload, spec)
    out = {}
    _run_actor(server.endpoint(), 3, 4 * 300, out)
    batches = server.drain()
    episodes = server.pop_episodes()
    stats = server.stats()
    server.stop()
    assert out[3]["env_steps"] == 1200 and len(batches) == 299 // 16    # the 300th row waits for its reward
    # the step profile: every server phase and the actor's side, per request, and they nest
    from core.inference.server import PHASES
    assert list(stats["step_ms"]) == list(PHASES) and all(v >= 0 for v in stats["step_ms"].values())
    assert set(out[3]["step_ms"]) == {"encode", "round_trip", "env_step", "env_cpu", "cpu"}
    assert 0 < out[3]["step_ms"]["env_cpu"] < out[3]["step_ms"]["cpu"]        # the envs are part of the CPU
    # the handler runs between the actor's send (its encode opens it: the server may start decoding before
    # the actor's coroutine resumes after the send) and the reply's arrival
    assert sum(stats["step_ms"].values()) < out[3]["step_ms"]["encode"] + out[3]["step_ms"]["round_trip"]
    assert stats["step_ms"]["batched_inference"] >= stats["queued_ms_mean"] > 0
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


def test_adaptive_server_serves_two_actors_with_complete_unrolls(payload, spec):
    """adaptive_wait: slow arrivals run at once (caller runs); every unroll still has each actor's rows."""
    server = _server(payload, spec, adaptive_wait=True, max_wait_s=0.05, max_batch_size=8)
    out = {}
    actors = [threading.Thread(target=_run_actor, args=(server.endpoint(), a, 4 * 160, out)) for a in (0, 1)]
    for t in actors:
        t.start()
    for t in actors:
        t.join(60)
    batches = server.drain()
    stats = server.stats()
    server.stop()
    assert out[0]["env_steps"] == out[1]["env_steps"] == 640
    assert stats["requests"] == 320 and stats["rows"] == 1280 and stats["inline"] > 0
    assert sorted(b.actor_id for b in batches) == [0] * (159 // 16) + [1] * (159 // 16)
    assert all(b.reward.shape == (16, 4) for b in batches)


@pytest.mark.slow
def test_malformed_and_oversized_requests_are_rejected_and_others_keep_being_served(payload, spec):
    import grpc
    server = _server(payload, spec, max_message_bytes=1 << 16)
    out = {}
    good = threading.Thread(target=_run_actor, args=(server.endpoint(), 0, 4 * 2000, out))
    good.start()
    with grpc.insecure_channel(server.address) as ch:
        call = ch.stream_stream(protocol.METHOD)
        hello = protocol.encode({"kind": "hello", "actor_id": 9, "num_envs": 2, "obs_shape": [4],
                                 "obs_dtype": "float32"})
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
                for _ in call(iter(msgs), timeout=10, metadata=server.endpoint().metadata):
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
    from pipelines.run.central import _actor_process
    server = _server(payload, spec)
    proc = multiprocessing.get_context("spawn").Process(
        target=_actor_process, args=(server.endpoint(), ActorSpec("t", "CartPole-v1", 4, 0, 1), os.getpid()),
        daemon=True)
    proc.start()
    deadline = time.time() + 60
    while server.env_steps < 200 and time.time() < deadline:     # streaming: killed mid-stream
        time.sleep(0.05)
    assert server.env_steps >= 200 and server.active_streams == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    deadline = time.time() + 10
    while server.active_streams and time.time() < deadline:
        time.sleep(0.05)
    assert server.active_streams == 0
    out = {}
    _run_actor(server.endpoint(), 2, 400, out)                 # a new actor is served as before
    server.stop()
    assert out[2]["env_steps"] == 400


@pytest.mark.slow
def test_actor_survives_a_server_restart_with_fresh_episodes(payload, spec):
    address = _sock()
    first = _server(payload, spec, address)
    out = {}
    actor = threading.Thread(target=_run_actor, args=(first.endpoint(), 0, 4 * 3000, out), kwargs={"give_up_s": 30})
    actor.start()
    while first.env_steps < 1000:
        time.sleep(0.01)
    first.stop(grace=0)
    time.sleep(0.3)                                     # actor is retrying with backoff meanwhile
    second = _server(payload, spec, address, first_connection=1000, token=first.token)
    actor.join(60)
    batches = second.drain()
    second.stop()
    assert out[0]["env_steps"] == 12000 and out[0]["reconnects"] >= 1, out[0]
    # the new connection starts fresh episodes (step 0) whose stream ids carry incarnation >= 1000
    # (bits 21.. of the stream, core.inference.unrolls), so they never reuse the first server's ids
    assert (batches[0].step[0] == 0).all()
    assert (((batches[0].episode_id[0] >> 32) >> 21) >= 1000).all()
    before = {int(i) for b in first.drain() for i in np.unique(b.episode_id)}
    assert before and not before & {int(i) for b in batches for i in np.unique(b.episode_id)}


def test_unreachable_address_fails_after_backoff_with_one_line_error():
    from core.inference.client import InferenceUnavailable, run_env_actor_task
    from core.inference.endpoint import ServerEndpoint
    t0 = time.perf_counter()
    with pytest.raises(InferenceUnavailable) as err:
        run_env_actor_task(ServerEndpoint("unix:///tmp/databloom-nobody-listens.sock", "t"),
                           ActorSpec("t", "CartPole-v1", 2, 0, 0),
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


# -- security: token, observation validation, addresses, TLS -----------------------------

def _raw_call(server, msgs, metadata):
    """One raw stream of ``msgs``; returns the RpcError it ends with (None if it ends cleanly)."""
    import grpc
    with grpc.insecure_channel(server.address) as ch:
        try:
            for _ in ch.stream_stream(protocol.METHOD)(iter(msgs), timeout=10, metadata=metadata):
                pass
        except grpc.RpcError as err:
            return err
    return None


def _hello(**kw):
    return protocol.encode({"kind": "hello", "actor_id": 9, "num_envs": 2, "obs_shape": [4],
                            "obs_dtype": "float32", **kw})


def _step(obs):
    return protocol.encode({"kind": "step"}, {"observation": obs, "reward": np.zeros(2, np.float32),
                                              "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool)})


def test_token_check_is_exact():
    from core.inference.endpoint import TOKEN_METADATA, new_token, token_matches
    token = new_token()
    assert len(token) == 43 and token != new_token()                     # 32 random bytes, base64
    assert token_matches([("x", "1"), (TOKEN_METADATA, token)], token)
    assert token_matches([(TOKEN_METADATA, token.encode())], token)
    assert not token_matches([(TOKEN_METADATA, token[:-1])], token)
    assert not token_matches([(TOKEN_METADATA, token + "x")], token)
    assert not token_matches([("x", token)], token) and not token_matches(None, token)


def test_wrong_or_missing_token_is_refused(payload, spec):
    import grpc
    from core.inference.endpoint import ServerEndpoint
    server = _server(payload, spec)
    good_steps = _step(np.zeros((2, 4), np.float32))
    for metadata in [(), (("databloom-token", "not-the-token"),), (("databloom-token", server.token[:-1]),)]:
        err = _raw_call(server, [_hello(), good_steps], metadata)
        assert err is not None and err.code() == grpc.StatusCode.UNAUTHENTICATED, err
        assert "missing or wrong run token" in err.details()
    out = {}
    t0 = time.perf_counter()
    _run_actor(ServerEndpoint(server.address, "forged"), 5, 400, out)
    assert time.perf_counter() - t0 < 10                                  # refused at once, no retry loop
    assert isinstance(out[5], RuntimeError) and "UNAUTHENTICATED" in str(out[5]) and "\n" not in str(out[5])
    _run_actor(server.endpoint(), 6, 400, out)                           # the run's own token works
    stats = server.stats()
    server.stop()
    assert out[6]["env_steps"] == 400
    # 3 raw streams + the forged actor's. gRPC's asyncio client sometimes sees a stream end as INTERNAL
    # ("Internal error from Core": its hello write races the server's abort), which is retryable, so the
    # forged actor may be refused more than once (twice, or under load three times, as measured) before
    # it reads UNAUTHENTICATED; the 10 s bound above caps those retries. Every refusal is the token's.
    assert stats["unauthenticated"] >= 4 and stats["rejected"] == stats["unauthenticated"]
    assert stats["connections"] == 1


@pytest.mark.slow
def test_wrong_dtype_is_refused_while_another_actor_keeps_streaming(payload, spec):
    import grpc
    server = _server(payload, spec)
    out = {}
    good = threading.Thread(target=_run_actor, args=(server.endpoint(), 0, 4 * 3000, out))
    good.start()
    deadline = time.time() + 60
    while server.env_steps < 400 and time.time() < deadline:
        time.sleep(0.01)
    md = server.endpoint().metadata
    cases = [
        ([_hello(), _step(np.zeros((2, 4), np.float64))], "'observation' has dtype float64, expected float32"),
        ([_hello(), _step(np.zeros((2, 4), np.int32))], "'observation' has dtype int32, expected float32"),
        ([_hello(obs_dtype="float64")], "obs_dtype 'float64' does not match the server's 'float32'"),
        ([_hello(), _step(np.zeros((2, 5), np.float32))], r"'observation' has shape \[2, 5\], expected \[2, 4\]"),
    ]
    for msgs, pattern in cases:
        assert server.active_streams == 1                                 # the good actor is mid-stream
        err = _raw_call(server, msgs, md)
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert __import__("re").search(pattern, err.details()), err.details()
    at_reject = server.env_steps
    good.join(120)
    batches = server.drain()
    stats = server.stats()
    server.stop()
    assert out[0]["env_steps"] == 12000 and out[0]["reconnects"] == 0 and at_reject < 12000
    assert stats["rejected"] == 4 and stats["unauthenticated"] == 0
    assert batches and all(b.observation.dtype == np.float32 and b.actor_id == 0 for b in batches)


def _listening_hosts(port: int):
    """Local addresses of the sockets listening on TCP ``port`` (Linux /proc/net/tcp{,6})."""
    import ipaddress
    hosts = []
    for name in ("tcp", "tcp6"):
        path = f"/proc/net/{name}"
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, p = local.split(":")
                if int(p, 16) != port or state != "0A":                   # 0A = LISTEN
                    continue
                raw = bytes.fromhex(addr)
                raw = raw[::-1] if len(raw) == 4 else b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                ip = ipaddress.ip_address(raw)
                hosts.append(str(getattr(ip, "ipv4_mapped", None) or ip))   # gRPC listens v4-mapped
    return hosts


def test_bound_address_is_not_a_wildcard_in_the_dask_setup(payload, spec):
    from core.config import load_config
    from core.inference.endpoint import is_wildcard, listen_plan
    from pipelines.run.central import server_listen_plan
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"), ["executor=dask", "inference=central"])
    local_cluster = server_listen_plan(cfg)
    assert (local_cluster.bind, local_cluster.dial_host) == ("127.0.0.1:0", "127.0.0.1")
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=dask", "inference=central", "dask.address=tcp://127.0.0.1:8786"])
    assert server_listen_plan(cfg).bind == "127.0.0.1:0"
    # A remote scheduler: the interface that routes to it (TEST-NET-1 stands in for a remote host).
    try:
        remote = listen_plan("dask", "tcp://192.0.2.1:8786", None)
    except ValueError as e:
        pytest.skip(f"no route on this machine: {e}")
    assert not is_wildcard(remote.dial_host) and remote.bind == f"{remote.dial_host}:0"
    # An explicit wildcard listens everywhere, but actors still get the routed address.
    wild = listen_plan("dask", "tcp://127.0.0.1:8786", "0.0.0.0")
    assert wild.bind == "0.0.0.0:0" and wild.dial_address(1234) == "127.0.0.1:1234"
    # And the kernel agrees: the listening socket is on 127.0.0.1 only.
    server = _server(payload, spec, address=local_cluster.bind)
    try:
        assert server.address == f"127.0.0.1:{server.port}" and server.port > 0
        hosts = _listening_hosts(server.port)
        if hosts:                                                         # /proc/net is Linux only
            assert hosts == ["127.0.0.1"], hosts
        out = {}
        _run_actor(server.endpoint(local_cluster.dial_address(server.port)), 1, 400, out)
        assert out[1]["env_steps"] == 400
    finally:
        server.stop()


def test_a_bind_host_of_another_machine_is_a_one_line_error(payload, spec, tmp_path):
    from core.config import ConfigError, load_config
    from pipelines.train import train
    with pytest.raises(OSError, match="could not bind '192.0.2.1:0'"):
        _server(payload, spec, address="192.0.2.1:0")                     # TEST-NET-1: never local
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=local", "inference=central", "inference_server.bind_host=192.0.2.1"])
    with pytest.raises(ConfigError, match="valid: inference_server.bind_host = an address of this host") as err:
        train(cfg, str(tmp_path / "r"), progress=False)
    assert "\n" not in str(err.value)


def test_unix_socket_lives_in_a_private_directory(payload, spec):
    import stat
    from core.config import load_config
    from pipelines.run.central import server_listen_plan
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"), ["executor=local", "inference=central"])
    plan = server_listen_plan(cfg)
    try:
        assert plan.bind.startswith("unix://") and plan.dial_address(0) == plan.bind
        assert stat.S_IMODE(os.stat(plan.socket_dir).st_mode) == 0o700
        server = _server(payload, spec, address=plan.bind)
        path = plan.bind[len("unix://"):]
        assert os.path.dirname(path) == plan.socket_dir and stat.S_ISSOCK(os.stat(path).st_mode)
        out = {}
        _run_actor(server.endpoint(), 1, 400, out)
        server.stop()
        assert out[1]["env_steps"] == 400
    finally:
        plan.cleanup()
    assert not os.path.exists(plan.socket_dir)


def _self_signed(tmp_path, name="localhost", ip="127.0.0.1"):
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name),
                                                        x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


@pytest.mark.slow
def test_tls_round_trip_and_plaintext_is_refused(payload, spec, tmp_path):
    from core.inference.client import InferenceUnavailable
    from core.inference.endpoint import ServerEndpoint, load_tls
    cert, key = _self_signed(tmp_path)
    server = _server(payload, spec, address="127.0.0.1:0", tls=load_tls(cert, key))
    try:
        out = {}
        _run_actor(server.endpoint(), 1, 800, out)                        # trusts the server's certificate
        assert out[1]["env_steps"] == 800 and server.stats()["tls"]
        _run_actor(ServerEndpoint(server.address, server.token), 2, 400, out, give_up_s=1.0,
                   connect_timeout_s=0.3)                                 # plaintext to a TLS port
        assert isinstance(out[2], InferenceUnavailable), out[2]
        other_cert, _ = _self_signed(tmp_path, name="other")
        with open(other_cert, "rb") as f:
            _run_actor(ServerEndpoint(server.address, server.token, f.read()), 3, 400, out, give_up_s=1.0,
                       connect_timeout_s=0.3)                             # a certificate it does not trust
        assert isinstance(out[3], InferenceUnavailable), out[3]
        assert server.stats()["connections"] == 1
    finally:
        server.stop()


def test_tls_config_errors_are_one_line(tmp_path):
    from core.config import ConfigError, load_config
    cert, key = _self_signed(tmp_path)
    base = [os.path.join("configs", "cartpole-vtrace.yaml"), ["inference=central"]]
    cfg = load_config(base[0], base[1] + [f"inference_server.tls_cert={cert}", f"inference_server.tls_key={key}"])
    assert cfg.inference_server.tls_cert == cert
    (tmp_path / "plain.txt").write_text("not a certificate")
    for overrides, message in [
        ([f"inference_server.tls_cert={tmp_path}/missing.crt", f"inference_server.tls_key={key}"],
         "inference_server.tls_cert '.*missing.crt' cannot be read"),
        ([f"inference_server.tls_cert={cert}"], "inference_server.tls_key is not set; TLS needs both"),
        ([f"inference_server.tls_cert={cert}", f"inference_server.tls_key={tmp_path}/plain.txt"],
         "tls_key '.*plain.txt' is not a PEM file"),
        (["inference_server.bind_host=' '"], "inference_server.bind_host is empty"),
    ]:
        with pytest.raises(ConfigError, match=message) as err:
            load_config(base[0], base[1] + overrides)
        assert "\n" not in str(err.value)


# -- training ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_vtrace_learns_cartpole_with_central_inference(tmp_path):
    """Learning regression (SEED mode): env-only actor processes + batched int8 inference, >= 300.

    Central runs follow the training plan (tests/pipelines/test_central_plan.py), so a
    seed gives one run. Before that (timing-dependent runs), best evaluation
    within 200k env steps, shipped config (lr 5e-4), learning-suite central
    sweeps of 2026-12-01, seeds 0-4 twice: 497, 478, 348, 500, 500 and 497,
    500, 500, 493, 487 (every seed of the second sweep reached 475 by 76k).
    The test runs seed 0 and stops at the first evaluation >= 300 confirmed on
    20 episodes.
    """
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=local", "inference=central", "total_env_steps=200000",
                       "eval.target_return=300", "eval.confirm_episodes=20"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["best_eval_return"] >= 300, summary
    assert summary["inference"]["batches"] > 0 and summary["inference"]["rejected"] == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_min_size_above_a_round_of_tasks_never_starves_the_learner(tmp_path):
    """min_size above one round of tasks: the plan's blocks still fill replay before the learner starts.

    2 actors x 4 envs x 20-step unrolls (160 rows a round), blocks of 4 rounds (640 rows),
    min_size 600. (The step budget that central mode used before the plan stalled here
    with 560 committed rows; the plan's grants replaced it.)
    """
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=local", "inference=central", "total_env_steps=2400", "env.num_envs=4",
                       "actors.num_actors=2", "actors.steps_per_task=20", "replay.min_size=600",
                       "learner.replay_ratio=0.01", "eval.every_env_steps=1000000"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["env_steps"] >= 2400 and summary["learner_steps"] > 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_central_mode_runs_env_actors_as_dask_tasks(tmp_path):
    from core.config import load_config
    from pipelines.train import train
    cfg = load_config(os.path.join("configs", "cartpole-vtrace.yaml"),
                      ["executor=dask", "inference=central", "total_env_steps=12000", "actors.num_actors=2",
                       "dask.n_workers=2", "eval.every_env_steps=100000"])
    summary = train(cfg, str(tmp_path / "run"), progress=False)
    assert summary["env_steps"] >= 12000 and summary["inference"]["connections"] >= 2
    assert summary["inference"]["address"].startswith("127.0.0.1:")       # not a wildcard
    assert summary["inference"]["unauthenticated"] == 0
    assert summary["learner_steps"] > 0
