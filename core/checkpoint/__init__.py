"""Async, parallel, atomically committed zarr v3 checkpoints of learner state.

    from core.checkpoint import Checkpointer, CheckpointError

    ckpt = Checkpointer("runs/a/checkpoints", keep_last=3, keep_every=10_000)
    ckpt.save(1000, {"params": {"dense_0": {"kernel": w}}, "step": 1000},
              metadata={"config": cfg})         # returns after a host copy
    state, meta = ckpt.restore()                # latest complete checkpoint
    k = ckpt.read_variable("params/dense_0/kernel", index=np.s_[:10])
    ckpt.close()

Modules: ``layout`` (names, on-disk layout, state <-> variables),
``engines`` (tensorstore / zarr-python writers, checksum-aware reader),
``checkpointer`` (async saves, commit protocol, retention, restore).
"""
from .checkpointer import Checkpointer
from .layout import SCHEMA_VERSION, CheckpointError, step_name

__all__ = ["Checkpointer", "CheckpointError", "SCHEMA_VERSION", "step_name"]
