"""Unit tests for core.policy.LiteRTPolicy: outputs, batching, version swaps."""
import pickle
import threading

import numpy as np
import pytest

from core.networks import mlp
from core.policy import LiteRTPolicy
from core.quantize import PolicyQuantizer


@pytest.fixture(scope="module")
def nets():
    return mlp(4, (64, 64), 2, name="q", seed=0), mlp(4, (64, 64), 2, name="q", seed=10)


@pytest.fixture(scope="module")
def payloads(nets):
    quantizer = PolicyQuantizer("fp32")
    return quantizer.quantize(nets[0], version=1), quantizer.quantize(nets[1], version=2)


def obs(n, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size, n", [(8, 8), (8, 3), (8, 20), (1, 1), (1, 5)])
def test_outputs_equal_keras_for_any_row_count(nets, payloads, batch_size, n):
    policy = LiteRTPolicy(payloads[0], batch_size=batch_size)
    x = obs(n, seed=n)
    out = policy(x)
    assert out.shape == (n, 2) and out.dtype == np.float32
    np.testing.assert_allclose(out, nets[0](x).numpy(), atol=1e-5)
    assert policy.batch_size == batch_size  # padding/chunking never reallocates


def test_fixed_batch_result_is_a_copy(payloads):
    policy = LiteRTPolicy(payloads[0], batch_size=4)
    first = policy(obs(4, seed=1))
    kept = first.copy()
    policy(obs(4, seed=2))
    np.testing.assert_array_equal(first, kept)


def test_resize(nets, payloads):
    policy = LiteRTPolicy(payloads[0], batch_size=2)
    policy.resize(32)
    x = obs(32, seed=3)
    assert policy.batch_size == 32
    np.testing.assert_allclose(policy(x), nets[0](x).numpy(), atol=1e-5)


def test_update_swaps_version_and_outputs(nets, payloads):
    policy = LiteRTPolicy(payloads[0], batch_size=8)
    x = obs(8, seed=4)
    assert policy.version == 1
    assert policy.update(payloads[1]) is True
    assert policy.version == 2
    np.testing.assert_allclose(policy(x), nets[1](x).numpy(), atol=1e-5)
    assert policy.update(payloads[1]) is False  # same payload: nothing rebuilt


def test_update_from_another_thread_never_mixes_versions(nets, payloads):
    policy = LiteRTPolicy(payloads[0], batch_size=8)
    x = obs(8, seed=5)
    expected = [nets[0](x).numpy(), nets[1](x).numpy()]
    seen, errors, stop = [], [], threading.Event()

    def act():
        while not stop.is_set():
            out = policy(x)
            matches = [i for i, e in enumerate(expected) if np.allclose(out, e, atol=1e-5)]
            (seen.extend(matches) if matches else errors.append(out))

    actor = threading.Thread(target=act)
    actor.start()
    for i in range(10):
        policy.update(payloads[(i + 1) % 2])
        calls = len(seen) + len(errors)
        while len(seen) + len(errors) < calls + 2:  # let the actor act on this version
            stop.wait(0.001)
    stop.set()
    actor.join()
    assert not errors and set(seen) == {0, 1}


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors(payloads):
    policy = LiteRTPolicy(payloads[0], batch_size=8)
    with pytest.raises(ValueError, match=r"\[B, 4\].*\(8, 5\)"):
        policy(np.zeros((8, 5), np.float32))
    with pytest.raises(ValueError, match="batch_size"):
        LiteRTPolicy(payloads[0], batch_size=0)
    other = PolicyQuantizer("fp32").quantize(mlp(3, (8,), 2, seed=0), version=3)
    with pytest.raises(ValueError, match="dims"):
        policy.update(other)


def test_unpickled_int8_payload_runs_and_reports_precision(nets):
    payload = PolicyQuantizer("int8-dynamic").quantize(nets[0], version=4)
    policy = LiteRTPolicy(pickle.loads(pickle.dumps(payload)), batch_size=16)
    x = obs(16, seed=6)
    assert (policy.version, policy.precision) == (4, "int8-dynamic")
    np.testing.assert_allclose(policy(x), nets[0](x).numpy(), atol=0.02)
    np.testing.assert_array_equal(policy.greedy(x), policy(x).argmax(-1))


def test_a_uniform_payload_outputs_zeros_and_any_real_payload_replaces_it(nets, payloads):
    from core.quantize import PolicyPayload
    stand_in = pickle.loads(pickle.dumps(PolicyPayload.uniform(1, 4, 2)))
    assert (stand_in.has_network, stand_in.nbytes, payloads[0].has_network) == (False, 0, True)
    policy = LiteRTPolicy(stand_in, batch_size=8)
    assert policy.version is None and policy.precision == "uniform"   # never equal to a learner version
    np.testing.assert_array_equal(policy(obs(3)), np.zeros((3, 2), np.float32))
    assert policy.update(payloads[0]) is True and policy.version == 1
    x = obs(8, seed=7)
    np.testing.assert_allclose(policy(x), nets[0](x).numpy(), atol=1e-5)
