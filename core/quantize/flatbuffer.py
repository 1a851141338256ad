"""FlatbufferPatcher: writes new weights into a prebuilt TFLite flatbuffer instead of converting again.

For fp32, fp16 and int8-dynamic the graph and the quantization rule do not
depend on weight values, so the network is converted once and each new
version is a copy of that flatbuffer with its weight buffers overwritten
(int8 by :func:`core.quantize.int8.quantize_symmetric`, the converter's own
rule). Tens of milliseconds for ActorQ's 3x2048 MLP instead of a conversion;
the tests check patched == freshly converted.

Example::

    patcher = FlatbufferPatcher(q_net, "int8-dynamic")     # converts once
    payload = patcher.patch(q_net.get_weights(), version=8)
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from core.quantize.int8 import _dense_layers, quantize_symmetric
from core.quantize.modes import PATCHABLE_PRECISIONS, _model_dims, check_precision, convert
from core.quantize.payloads import PolicyPayload

_FULLY_CONNECTED, _DEQUANTIZE = 9, 6
_TYPE_FLOAT32, _TYPE_FLOAT16, _TYPE_INT8 = 0, 1, 9


def _byte_offset(view: np.ndarray, base: np.ndarray) -> int:
    return view.__array_interface__["data"][0] - base.__array_interface__["data"][0]


@dataclasses.dataclass(frozen=True)
class _Slot:
    """Where one Keras weight lives in the flatbuffer."""
    weight_index: int      # into keras get_weights()
    transpose: bool        # Dense kernel [in, out] -> FULLY_CONNECTED weights [out, in]
    dtype: int             # TFLite tensor type
    offset: int            # byte offset of the data
    nbytes: int
    scale_offset: int = -1  # int8: byte offset of the float32 scale vector
    num_scales: int = 0


class FlatbufferPatcher:
    """Writes new Keras weights into a prebuilt TFLite flatbuffer (no converter).

    Built once per architecture: the network is cloned, given distinct nonzero
    random weights (so the converter neither drops zero biases nor shares equal
    buffers) and converted. Each FULLY_CONNECTED op holds one Dense layer's
    kernel (transposed to ``[out, in]``) and bias; which layer is read from the
    template's weights in the op (the converter may order parallel branches,
    e.g. a dueling head's two streams, unlike ``model.layers``); ``patch``
    copies the flatbuffer and overwrites those buffers in place: float32,
    float16, or int8 plus its per-channel scales by :func:`quantize_symmetric`
    (the converter's own rule, bit for bit). Sizes, offsets and the graph do not
    change, so the result is a valid model identical to a fresh conversion.

    Only Sequential MLPs of Dense layers are supported; others raise ValueError.
    """

    def __init__(self, model, precision: str):
        import keras
        check_precision(precision)
        if precision not in PATCHABLE_PRECISIONS:
            raise ValueError(f"cannot patch precision {precision!r}; patchable: "
                             f"{', '.join(PATCHABLE_PRECISIONS)}")
        dense = _dense_layers(model)
        if not self.supports(model):
            raise ValueError("FlatbufferPatcher supports MLPs of Dense layers (kernel + bias) only")
        self.precision = precision
        self.input_dim, self.output_dim = _model_dims(model)
        self.shapes = tuple(tuple(w.shape) for w in model.get_weights())
        template = keras.models.clone_model(model)
        rng = np.random.default_rng(12345)
        marks = [rng.uniform(0.5, 1.0, s).astype(np.float32) * rng.choice([-1, 1], s) for s in self.shapes]
        template.set_weights(marks)
        start = time.perf_counter()
        self._template = convert(template, precision)
        self.build_seconds = time.perf_counter() - start
        self._slots = self._locate(self._template, len(dense), marks[0::2])

    @staticmethod
    def supports(model) -> bool:
        """True for networks whose only weights are Dense kernels and biases (what the patcher rewrites)."""
        import keras
        dense = _dense_layers(model)   # layers with a kernel: Conv2D has one too, so check the type
        return (all(isinstance(layer, keras.layers.Dense) for layer in dense)
                and len(dense) * 2 == len(model.get_weights()))

    def matches(self, model) -> bool:
        return tuple(tuple(w.shape) for w in model.get_weights()) == self.shapes

    @staticmethod
    def _holds(tensor, view: np.ndarray, kernel: np.ndarray) -> bool:
        """Whether FULLY_CONNECTED weights ``tensor`` (``[out, in]``) decode to the template ``kernel``."""
        shape = tuple(tensor.ShapeAsNumpy())
        if shape != kernel.shape[::-1]:
            return False
        if tensor.Type() == _TYPE_INT8:
            got = view.view(np.int8).reshape(shape) * tensor.Quantization().ScaleAsNumpy().reshape(-1, 1)
        elif tensor.Type() == _TYPE_FLOAT16:
            got = view.view("<f2").reshape(shape).astype(np.float32)
        else:
            got = view.view("<f4").reshape(shape)
        # Template entries are +-[0.5, 1): int8 and fp16 round by < 0.01, other layers differ by ~1.
        return bool(np.allclose(got, kernel.T, atol=1e-2))

    def _layer_of(self, graph, model, op, producers, kernels, taken) -> int:
        """Index of the Dense layer whose template kernel FULLY_CONNECTED ``op`` holds."""
        tensor = graph.Tensors(producers.get(int(op.Inputs(1)), int(op.Inputs(1))))
        view = model.Buffers(tensor.Buffer()).DataAsNumpy()
        if not isinstance(view, np.ndarray):
            raise ValueError("a FULLY_CONNECTED weight buffer is external")
        found = [i for i, k in enumerate(kernels) if i not in taken and self._holds(tensor, view, k)]
        if len(found) != 1:
            raise ValueError(f"a FULLY_CONNECTED op with weights {tensor.ShapeAsNumpy()} matches "
                             f"{len(found)} Dense layers; expected exactly one")
        return found[0]

    def _locate(self, data: bytes, num_layers: int, kernels: Sequence[np.ndarray]) -> list[_Slot]:
        from ai_edge_litert import schema_py_generated as schema
        buf = bytearray(data)
        base = np.frombuffer(buf, np.uint8)
        model = schema.Model.GetRootAs(buf, 0)
        graph = model.Subgraphs(0)
        producers = {}
        fc_ops = []
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
            if builtin == _DEQUANTIZE:
                producers[int(op.Outputs(0))] = int(op.Inputs(0))
            elif builtin == _FULLY_CONNECTED:
                fc_ops.append(op)
        if len(fc_ops) != num_layers:
            raise ValueError(f"expected {num_layers} FULLY_CONNECTED ops, found {len(fc_ops)}")
        slots, used_buffers, taken = [], set(), set()
        for op in fc_ops:
            layer = self._layer_of(graph, model, op, producers, kernels, taken)
            taken.add(layer)
            for role, weight_index in ((1, 2 * layer), (2, 2 * layer + 1)):
                t_index = producers.get(int(op.Inputs(role)), int(op.Inputs(role)))
                if t_index < 0:
                    raise ValueError(f"layer {layer} lost its bias in conversion")
                tensor = graph.Tensors(t_index)
                buffer = model.Buffers(tensor.Buffer())
                if tensor.Buffer() in used_buffers or buffer.DataLength() == 0:
                    raise ValueError(f"layer {layer} weight buffer is shared or external")
                used_buffers.add(tensor.Buffer())
                view = buffer.DataAsNumpy()
                expected = self.shapes[weight_index][::-1] if role == 1 else self.shapes[weight_index]
                if tuple(tensor.ShapeAsNumpy()) != tuple(expected):
                    raise ValueError(f"layer {layer} shape {tensor.ShapeAsNumpy()} != {expected}")
                slot = _Slot(weight_index, role == 1, tensor.Type(), _byte_offset(view, base), view.nbytes)
                if tensor.Type() == _TYPE_INT8:
                    scales = tensor.Quantization().ScaleAsNumpy()
                    if tensor.Quantization().QuantizedDimension() != 0:
                        raise ValueError("int8 weights are expected quantized along the output axis")
                    slot = dataclasses.replace(slot, scale_offset=_byte_offset(scales, base),
                                               num_scales=len(scales))
                elif tensor.Type() not in (_TYPE_FLOAT32, _TYPE_FLOAT16):
                    raise ValueError(f"layer {layer} has unsupported tensor type {tensor.Type()}")
                slots.append(slot)
        return slots

    def patch(self, weights: Sequence[np.ndarray], version: int) -> PolicyPayload:
        """A payload with ``weights`` (Keras ``get_weights()`` order) at this precision."""
        start = time.perf_counter()
        if tuple(tuple(np.shape(w)) for w in weights) != self.shapes:
            raise ValueError(f"weights do not match the patcher's architecture {self.shapes}")
        regions = []  # (byte offset, new bytes), disjoint
        for slot in self._slots:
            w = np.asarray(weights[slot.weight_index], np.float32)
            if slot.dtype == _TYPE_INT8:
                # quantize the contiguous [in, out] kernel per output channel, transpose int8
                q, scale = quantize_symmetric(w, axis=-1 if slot.num_scales > 1 else None)
                regions.append((slot.scale_offset, scale.astype("<f4").tobytes()))
                data = _transpose(q) if slot.transpose else q
            else:
                w = w.astype("<f4" if slot.dtype == _TYPE_FLOAT32 else "<f2", copy=False)
                data = _transpose(w) if slot.transpose else w
            regions.append((slot.offset, np.ascontiguousarray(data).view(np.uint8).reshape(-1)))
        # One copy of the template: unchanged spans (as views) and new spans, joined.
        template, pieces, cursor = memoryview(self._template), [], 0
        for offset, new in sorted(regions, key=lambda r: r[0]):
            pieces += [template[cursor:offset], new]
            cursor = offset + len(new)
        pieces.append(template[cursor:])
        data = b"".join(pieces)
        return PolicyPayload(int(version), self.precision, data, time.perf_counter() - start,
                             self.input_dim, self.output_dim, "patch")


def _transpose(a: np.ndarray, tile: int = 256) -> np.ndarray:
    """Contiguous ``a.T``, copied in cache-sized tiles (2x faster than numpy's for 2048^2)."""
    out = np.empty(a.shape[::-1], a.dtype)
    for i in range(0, a.shape[1], tile):
        for j in range(0, a.shape[0], tile):
            out[i:i + tile, j:j + tile] = a[j:j + tile, i:i + tile].T
    return out
