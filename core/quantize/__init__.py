"""ActorQ policy quantization: a Keras policy -> a versioned TFLite flatbuffer.

The learner trains in fp32; every policy broadcast is a :class:`PolicyPayload`
holding a TFLite flatbuffer at one of :data:`PRECISIONS`. Actors run it with
:class:`core.policy.LiteRTPolicy`, so int8 payloads execute int8 kernels.

Precisions:

* ``fp32``: float weights and kernels (the baseline).
* ``fp16``: float16 weights, dequantized to fp32 at load (half the bytes).
* ``int8-dynamic``: int8 weights (dense kernels with >= 1024 elements; smaller
  ones stay fp32, the converter's rule); activations are quantized to int8 at
  run time per batch, so no calibration is needed.
* ``int8-full``: int8 weights *and* activations, calibrated on recent
  observations (from replay); the model keeps a float32 input and output
  (QUANTIZE / DEQUANTIZE ops at its edges), so actors feed float observations.

The int8 scale rule, written out, is in :mod:`core.quantize.int8`.

Conversion costs 0.2-1.5 s per version (shared/PLATFORM_FACTS.md), hundreds of
learner steps, so two fast paths keep it off the learner's critical path:

* :class:`FlatbufferPatcher` converts once and then writes new weights into a
  copy of that flatbuffer (fp32, fp16, int8-dynamic: the graph and the
  quantization rule do not depend on weight values). Tens of milliseconds for
  ActorQ's 3x2048 MLP; the tests check patched == freshly converted.
* :class:`AsyncQuantizer` copies the weights and converts (or patches) in a
  background thread on a private clone of the network; ``latest()`` never
  blocks.

One concept per module:

* ``modes``       the precisions and the TFLite conversion of each (``convert``)
* ``int8``        the int8 scale rule (``quantize_symmetric``, ``dequantize``) and its cost
                  (``weight_quantization_error``, ``action_agreement``)
* ``payloads``    PolicyPayload: one broadcast's flatbuffer bytes and small fields
* ``flatbuffer``  FlatbufferPatcher: new weights written into a prebuilt flatbuffer
* ``quantizers``  PolicyQuantizer and AsyncQuantizer, what the learner calls

Example::

    quantizer = PolicyQuantizer("int8-full")
    payload = quantizer.quantize(q_net, version=7, calibration_obs=replay_obs)
    policy = LiteRTPolicy(payload, batch_size=8)        # on the actor
    q_values = policy(obs_batch)
"""
from core.quantize.flatbuffer import FlatbufferPatcher
from core.quantize.int8 import INT8_MAX, action_agreement, dequantize, quantize_symmetric, weight_quantization_error
from core.quantize.modes import PATCHABLE_PRECISIONS, PRECISIONS, check_precision, convert
from core.quantize.payloads import PolicyPayload
from core.quantize.quantizers import AsyncQuantizer, PolicyQuantizer

__all__ = ["PRECISIONS", "PATCHABLE_PRECISIONS", "INT8_MAX", "check_precision", "convert", "quantize_symmetric",
           "dequantize", "weight_quantization_error", "action_agreement", "PolicyPayload", "FlatbufferPatcher",
           "PolicyQuantizer", "AsyncQuantizer"]
