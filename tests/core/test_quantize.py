"""Unit tests for core.quantize: the int8 rule, payloads, real int8 models, patching, async.

Networks are fixed by seed (core.networks.mlp), observations by a seeded RNG,
so every bound below is deterministic. Budget: ~15 s (conversions dominate).
"""
import json
import pickle
import time

import numpy as np
import pytest

from core.networks import mlp
from core.quantize import (PATCHABLE_PRECISIONS, PRECISIONS, AsyncQuantizer, FlatbufferPatcher,
                           PolicyPayload, PolicyQuantizer, action_agreement, dequantize,
                           quantize_symmetric, weight_quantization_error)

FC_OP = "FULLY_CONNECTED"


def cartpole_net(seed=0):
    return mlp(4, (256, 256), 2, name="q", seed=seed)


def cartpole_obs(n=1000, seed=0):
    return np.random.default_rng(seed).uniform(-2.4, 2.4, size=(n, 4)).astype(np.float32)


def interpreter_for(payload):
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_content=payload.data, num_threads=1)
    interp.allocate_tensors()
    return interp


def run_payload(payload, obs):
    from core.policy import LiteRTPolicy
    return LiteRTPolicy(payload, batch_size=len(obs))(obs)


@pytest.fixture(scope="module")
def net():
    """The CartPole-size net with slightly 'trained' (nonzero) biases, so none is folded away."""
    model = cartpole_net()
    model.set_weights([w if w.ndim == 2 else np.random.default_rng(1).normal(0, 0.05, w.shape)
                       .astype(np.float32) for w in model.get_weights()])
    return model


@pytest.fixture(scope="module")
def payloads(net):
    obs = cartpole_obs(500, seed=1)
    return {p: PolicyQuantizer(p).quantize(net, version=7, calibration_obs=obs) for p in PRECISIONS}


# ---------------------------------------------------------------------- the rule

@pytest.mark.parametrize("w, axis, q, scale", [
    # per output channel (Keras kernel [in, out]: axis -1); 0.5*127 = 63.5 rounds away from 0
    ([[1.0, -2.0], [0.5, 1.0], [0.25, 0.01]], -1, [[127, -127], [64, 64], [32, 1]], [1 / 127, 2 / 127]),
    # per tensor: one scale = max|w| / 127 = 2 / 127
    ([[1.0, -2.0], [0.5, 1.0], [0.25, 0.01]], None, [[64, -127], [32, 64], [16, 1]], [2 / 127]),
    # an all-zero channel quantizes to 0 (the converter's range for it is +-5e-7)
    ([[0.0, 1.0], [0.0, -1.0]], -1, [[0, 127], [0, -127]], [5e-7 / 127, 1 / 127]),
])
def test_quantize_symmetric_exact_values(w, axis, q, scale):
    got_q, got_scale = quantize_symmetric(np.array(w, np.float32), axis=axis)
    np.testing.assert_array_equal(got_q, np.array(q, np.int8))
    np.testing.assert_allclose(got_scale, np.array(scale, np.float32), rtol=1e-7)
    assert got_q.dtype == np.int8 and got_scale.dtype == np.float32


@pytest.mark.parametrize("axis", [-1, None])
def test_dequantization_error_at_most_half_a_step(net, axis):
    """|w - scale*q| <= scale/2 for every weight of the fixed network (no clipping: |q| <= 127)."""
    for layer in net.layers:
        w = layer.get_weights()[0].astype(np.float64)
        q, scale = quantize_symmetric(w, axis=axis)
        err = np.abs(w - dequantize(q, scale, axis))
        half_step = np.broadcast_to(scale.astype(np.float64) / 2, w.shape)
        assert np.all(err <= half_step), layer.name
        assert np.abs(q).max() == 127  # the largest weight of each channel maps to +-127


def test_ties_round_half_away_from_zero_like_tflite():
    # 127 * 125 / 254 = 62.5 exactly: TFLite rounds to 63 (np.rint would give 62)
    q, scale = quantize_symmetric(np.array([[254.0], [125.0], [-125.0]], np.float32), axis=-1)
    np.testing.assert_array_equal(q[:, 0], [127, 63, -63])
    assert scale[0] == np.float32(2.0)


def test_weight_quantization_error_exact():
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, name="d")])
    model.layers[0].set_weights([np.array([[1.0], [0.5]], np.float32), np.zeros(1, np.float32)])
    # per-channel: scale 1/127, 0.5 -> 64/127; error 0.5/127 on one of two weights
    expected = (0.5 / 127) / np.sqrt(1.25)
    assert weight_quantization_error(model) == pytest.approx({"d": expected}, rel=1e-6)
    with pytest.raises(ValueError, match="per-channel, per-tensor"):
        weight_quantization_error(model, scheme="per-row")


def test_weight_quantization_error_per_layer_small(net):
    errors = weight_quantization_error(net)
    assert list(errors) == ["dense_0", "dense_1", "dense_2"]
    # uniform rounding noise is scale/sqrt(12) per weight: well under 1% of the weights' RMS
    assert all(0 < e < 0.01 for e in errors.values()), errors
    per_tensor = weight_quantization_error(net, scheme="per-tensor")
    assert all(per_tensor[k] >= errors[k] for k in errors)  # per-channel is never worse here


@pytest.mark.parametrize("a, b, discrete, expected", [
    ([[1, 2], [3, 0], [0, 1], [5, 4]], [[1, 2], [0, 3], [0, 1], [5, 4]], True, 0.75),
    ([[0.5, -1.0], [0.0, 0.25]], [[0.25, -1.0], [0.0, 0.75]], False, 0.1875),
])
def test_action_agreement_exact(a, b, discrete, expected):
    assert action_agreement(np.array(a), np.array(b), discrete=discrete) == expected


# ------------------------------------------------------------------- the payload

def test_bad_precision_names_valid_choices():
    with pytest.raises(ValueError) as err:
        PolicyQuantizer("int4")
    message = str(err.value)
    assert "'int4'" in message and all(p in message for p in PRECISIONS) and "\n" not in message


def test_int8_full_needs_calibration(net):
    with pytest.raises(ValueError, match="calibration_obs"):
        PolicyQuantizer("int8-full").quantize(net, version=1)
    with pytest.raises(ValueError, match=r"\[N, 4\]"):
        PolicyQuantizer("int8-full").quantize(net, version=1, calibration_obs=np.zeros((8, 5)))


@pytest.mark.slow
def test_payload_fields_pickle_and_json(payloads):
    p = payloads["int8-full"]
    assert (p.version, p.precision, p.input_dim, p.output_dim) == (7, "int8-full", 4, 2)
    assert isinstance(p.data, bytes) and p.nbytes == len(p.data) and p.convert_seconds > 0
    assert pickle.loads(pickle.dumps(p)) == p
    described = json.loads(json.dumps(p.describe()))
    assert described["nbytes"] == p.nbytes and "data" not in described


def test_fp32_payload_equals_keras(net, payloads):
    obs = cartpole_obs(64, seed=2)
    np.testing.assert_allclose(run_payload(payloads["fp32"], obs), net(obs).numpy(), atol=1e-5)


# (precision, max |out - fp32| / max |fp32|, min argmax agreement) on 1000 fixed observations;
# measured: fp16 6e-4 / 1.0, int8-dynamic 0.011 / 1.0, int8-full 0.040 / 0.996 (calibrated on
# 500 other observations of the same distribution).
QUALITY_BOUNDS = [("fp16", 0.002, 1.0), ("int8-dynamic", 0.02, 0.99), ("int8-full", 0.05, 0.95)]


@pytest.mark.parametrize("precision, rel_err, agreement", QUALITY_BOUNDS)
def test_quantized_outputs_and_actions_close_to_fp32(net, payloads, precision, rel_err, agreement):
    obs = cartpole_obs(1000, seed=0)
    ref = net(obs).numpy()
    out = run_payload(payloads[precision], obs)
    assert np.abs(out - ref).max() <= rel_err * np.abs(ref).max()
    assert action_agreement(ref, out) >= agreement


def tensor_types(payload):
    """(interpreter, {index: tensor detail}, FULLY_CONNECTED ops with weights resolved).

    An fp16 model feeds FULLY_CONNECTED from a DEQUANTIZE op; the stored
    constant is that op's input, so ``op["weights"]`` points there.
    """
    interp = interpreter_for(payload)
    details = {d["index"]: d for d in interp.get_tensor_details()}
    ops = interp._get_ops_details()
    dequantized = {op["outputs"][0]: op["inputs"][0] for op in ops if op["op_name"] == "DEQUANTIZE"}
    fc_ops = [dict(op, weights=dequantized.get(op["inputs"][1], op["inputs"][1]))
              for op in ops if op["op_name"] == FC_OP]
    return interp, details, fc_ops


def test_int8_dynamic_has_int8_weights(payloads):
    _, details, fc_ops = tensor_types(payloads["int8-dynamic"])
    weights = [details[op["weights"]] for op in fc_ops]
    # kernels with >= 1024 elements are int8 per-channel (256x4, 256x256); 2x256 stays fp32
    assert [w["dtype"] for w in weights] == [np.int8, np.int8, np.float32]
    assert len(weights[1]["quantization_parameters"]["scales"]) == 256
    assert not np.any(weights[1]["quantization_parameters"]["zero_points"])
    assert details[fc_ops[0]["inputs"][0]]["dtype"] == np.float32  # activations quantized at run time


def test_int8_full_is_integer_inside_float_outside(payloads):
    interp, details, fc_ops = tensor_types(payloads["int8-full"])
    assert len(fc_ops) == 3
    for op in fc_ops:
        assert details[op["inputs"][0]]["dtype"] == np.int8      # activations
        assert details[op["inputs"][1]]["dtype"] == np.int8      # weights
        assert details[op["inputs"][2]]["dtype"] == np.int32     # bias
        assert details[op["outputs"][0]]["dtype"] == np.int8
    assert interp.get_input_details()[0]["dtype"] == np.float32
    assert interp.get_output_details()[0]["dtype"] == np.float32


@pytest.mark.slow
def test_actorq_net_int8_payload_about_4x_smaller():
    big = mlp(64, (2048,) * 3, 18, name="actorq", seed=0)
    fp32 = PolicyQuantizer("fp32").quantize(big, version=1)
    int8 = PolicyQuantizer("int8-dynamic").quantize(big, version=1)
    assert 3.9 <= fp32.nbytes / int8.nbytes <= 4.0
    # 8.5M weights: 4 bytes each at fp32
    assert fp32.nbytes == pytest.approx(4 * sum(w.size for w in big.get_weights()), rel=0.01)


# ---------------------------------------------------------------------- patching

def perturbed(model, seed):
    rng = np.random.default_rng(seed)
    return [w + rng.normal(0, 0.05, w.shape).astype(np.float32) for w in model.get_weights()]


@pytest.mark.parametrize("precision", PATCHABLE_PRECISIONS)
def test_patched_payload_equals_fresh_conversion(precision):
    learner = cartpole_net(seed=3)
    patcher = FlatbufferPatcher(learner, precision)
    learner.set_weights(perturbed(learner, seed=4))   # "training" after the template was built
    patched = patcher.patch(learner.get_weights(), version=9)
    fresh = PolicyQuantizer(precision).quantize(learner, version=9)
    assert patched.method == "patch" and patched.nbytes == fresh.nbytes
    obs = cartpole_obs(256, seed=5)
    np.testing.assert_array_equal(run_payload(patched, obs), run_payload(fresh, obs))
    # the weight tensors themselves are bit-identical (int8 values and scales included)
    _, p_details, p_ops = tensor_types(patched)
    _, f_details, f_ops = tensor_types(fresh)
    p_interp, f_interp = interpreter_for(patched), interpreter_for(fresh)
    assert len(p_ops) == len(f_ops) == 3
    for p_op, f_op in zip(p_ops, f_ops):
        pw, fw = p_details[p_op["weights"]], f_details[f_op["weights"]]
        assert pw["dtype"] == fw["dtype"]
        np.testing.assert_array_equal(p_interp.get_tensor(pw["index"]), f_interp.get_tensor(fw["index"]))
        np.testing.assert_array_equal(pw["quantization_parameters"]["scales"],
                                      fw["quantization_parameters"]["scales"])


def test_patching_quantizer_reuses_template_and_refuses_int8_full():
    learner = cartpole_net(seed=3)
    quantizer = PolicyQuantizer("int8-dynamic", patch=True)
    first = quantizer.quantize(learner, version=1)
    learner.set_weights(perturbed(learner, seed=6))
    second = quantizer.quantize(learner, version=2)
    assert (first.method, second.method) == ("patch", "patch") and first.data != second.data
    assert PolicyQuantizer("int8-full", patch=True).patch is False
    with pytest.raises(ValueError, match="patchable"):
        FlatbufferPatcher(learner, "int8-full")


# ------------------------------------------------------------------------- async

@pytest.mark.parametrize("patch", [False, True])
def test_async_quantizer_copies_weights_and_never_blocks(patch):
    learner = cartpole_net(seed=3)
    obs = cartpole_obs(64, seed=7)
    with AsyncQuantizer(learner, "int8-dynamic", patch=patch) as aq:
        assert aq.latest() is None
        submitted = learner.get_weights()
        aq.submit(learner, version=1)
        learner.set_weights(perturbed(learner, seed=8))   # the learner keeps training
        start = time.perf_counter()
        aq.latest()
        assert time.perf_counter() - start < 0.01
        payload = aq.wait(version=1, timeout=60)
    expected = cartpole_net(seed=3)
    expected.set_weights(submitted)
    fresh = PolicyQuantizer("int8-dynamic").quantize(expected, version=1)
    assert payload.version == 1
    np.testing.assert_array_equal(run_payload(payload, obs), run_payload(fresh, obs))


def test_async_quantizer_keeps_only_newest_pending_and_checks_calibration():
    learner = cartpole_net(seed=3)
    calib = cartpole_obs(128, seed=9)
    with AsyncQuantizer(learner, "int8-full") as aq:
        with pytest.raises(ValueError, match="calibration"):
            aq.submit(learner.get_weights(), version=1)
        for version in range(1, 6):
            aq.submit(learner.get_weights(), version=version, calibration=calib)
        payload = aq.wait(timeout=60)
        assert payload.version == 5 and payload.precision == "int8-full"
        assert aq.completed + aq.dropped == aq.submitted == 5
