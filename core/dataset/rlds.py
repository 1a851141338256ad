"""RLDS export written with tensorflow-datasets' own writer: a TFDS dataset ``tfds.builder_from_directory`` loads.

One example per complete episode (the RLDS layout)::

    FeaturesDict({
        "episode_id":     Tensor((), int64),
        "episode_return": Tensor((), float64),    sum of its steps' rewards (exact: raw bytes)
        "policy_version": Tensor((), int64),      of its first step
        "steps": Dataset({
            "observation": Tensor(shape, dtype),  "action": Tensor(shape, dtype),
            "reward": Tensor((), float32),        "discount": Tensor((), float32),
            "is_first": bool, "is_last": bool,    "is_terminal": bool,
            "extras": FeaturesDict({...}),        (only when the store has extras)
        }),
    })

Each field keeps the store's dtype and row shape (see :func:`_tensor` for the encoding).

The folder holds what TFDS's builders write: ``dataset_info.json`` (split
``train``, shard lengths; the description names the env id, the DataBloom
version and the source store and commit-log version), ``features.json``,
``metadata.json`` (the same facts as keys) and
``<name>-train.tfrecord-<i>-of-<n>``, one shard per store shard that episodes
start in. Load it with::

    builder = tfds.builder_from_directory(PATH)
    for episode in builder.as_dataset(split="train"):
        for step in episode["steps"]: ...

Why not a TFDS builder's ``download_and_prepare``: every shard is written by
one engine task (Beam, Dask or local) with the pieces TFDS's shard-based
builders use (``features.encode_example``, ``ExampleSerializer``,
``ExampleWriter``, ``naming.ShardedFileTemplate``); on Beam that is what
TFDS's own shard-based Beam generation runs (``Create | Map(write shard)``),
so Beam and Dask write byte-identical shards. TFDS's ``BeamWriter``
re-shards by size and orders by hashed keys, which would split the
store's episode order, and no builder runs on Dask. The driver then writes
``dataset_info.json`` with ``DatasetInfo.write_to_directory``, the info built
by ``tfds.rlds.rlds_base.build_info`` (TFDS's RLDS layout).
"""
from __future__ import annotations

import re
from typing import Any, Dict, List

import numpy as np

from core import urls
from core.dataset.errors import DatasetError
from core.dataset.ownership import owned_episodes

#: Stored fields an RLDS step does not carry (the step flags and the episode metadata replace them).
_NOT_STEP_FIELDS = ("terminated", "truncated", "episode_id", "step", "policy_version")
SPLIT = "train"


def require_tfds():
    """The ``tensorflow_datasets`` module, or a one-line DatasetError naming the extra that installs it."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise DatasetError("--format rlds needs tensorflow-datasets, which is not installed; valid: pip install"
                           " 'databloom[rlds]' (or --format parquet)") from None
    return tfds


def check_target(out: str) -> None:
    """TFDS writes through ``tf.io.gfile``: a local path or gs://."""
    if urls.scheme_of(out) not in ("file", "gs", "gcs"):
        raise DatasetError(f"--format rlds cannot write {out!r} (TFDS writes through tf.io.gfile); valid: a local"
                           " path or gs:// URL")


def dataset_name(env_id: str) -> str:
    """A TFDS dataset name from the env id: ``CartPole-v1`` -> ``databloom_cartpole_v1``."""
    slug = re.sub(r"[^a-z0-9]+", "_", env_id.lower()).strip("_")
    return f"databloom_{slug}" if slug else "databloom"


def _tensor(spec: Dict[str, Any]):
    """A ``Tensor`` feature of the field's dtype and row shape.

    Arrays and float64 values are stored as their raw bytes
    (``Encoding.BYTES``): tf.train.Example would store float64 as float32
    (lossy) and every integer as a varint int64 (an 84x84 uint8 frame would
    grow ~1.5x); scalars of other dtypes stay plain, as RLDS tools expect.
    """
    tfds = require_tfds()
    dtype = np.dtype(spec["dtype"])
    raw = bool(spec["shape"]) or dtype == np.float64
    return tfds.features.Tensor(shape=tuple(spec["shape"]), dtype=dtype,
                                encoding=tfds.features.Encoding.BYTES if raw else tfds.features.Encoding.NONE)


def dataset_info(source: Dict[str, Any], data_dir: str):
    """The ``DatasetInfo`` of an export of ``source`` (the driver's ``source`` dict: env id, fields, versions).

    Built by ``tfds.rlds.rlds_base.build_info``, the helper TFDS's own RLDS
    datasets use, so the step and episode layout is RLDS's: the step fields
    observation, action, reward, discount, is_first, is_last, is_terminal,
    DataBloom's extras as step metadata, and the episode metadata beside ``steps``.
    """
    tfds = require_tfds()
    from tensorflow_datasets.core import dataset_info as dataset_info_lib
    from tensorflow_datasets.rlds import rlds_base
    fields = source["fields"]
    extras = {n.split("/", 1)[1]: _tensor(s) for n, s in fields.items() if n.startswith("extras/")}
    config = rlds_base.DatasetConfig(
        name="databloom", overall_description=description(source),
        observation_info=_tensor(fields["observation"]), action_info=_tensor(fields["action"]),
        reward_info=_tensor(fields["reward"]), discount_info=_tensor(fields["discount"]),
        step_metadata_info={"extras": tfds.features.FeaturesDict(extras)} if extras else {},
        episode_metadata_info={"episode_id": _tensor({"dtype": "int64", "shape": []}),
                               "episode_return": _tensor({"dtype": "float64", "shape": []}),
                               "policy_version": _tensor({"dtype": "int64", "shape": []})})
    identity = dataset_info_lib.DatasetIdentity(name=dataset_name(source["env_id"]),
                                                version=tfds.core.Version(source["export_format_version"]),
                                                data_dir=data_dir, module_name=__name__)
    return rlds_base.build_info(config, identity, ds_metadata={k: v for k, v in source.items() if k != "fields"})


def episode_example(ep: Dict[str, Any], rows: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """One episode's rows (with step flags) as an example of :func:`dataset_info`'s features."""
    steps = {n: v for n, v in rows.items() if n not in _NOT_STEP_FIELDS and not n.startswith("extras/")}
    extras = {n.split("/", 1)[1]: v for n, v in rows.items() if n.startswith("extras/")}
    if extras:
        steps["extras"] = extras
    # The sum of the exported rewards in float64 (the episode index sums per segment, in float32 at worst).
    return {"episode_id": ep["episode_id"], "episode_return": float(rows["reward"].sum(dtype=np.float64)),
            "policy_version": ep["policy_version"], "steps": steps}


def _template(data_dir: str, env_id: str):
    from tensorflow_datasets.core import naming
    return naming.ShardedFileTemplate(data_dir=data_dir, dataset_name=dataset_name(env_id), split=SPLIT,
                                      filetype_suffix="tfrecord")


def write_shard(item: Dict[str, Any]) -> Dict[str, Any]:
    """Map: the episodes one store shard owns -> TFDS shard ``file_index`` of ``num_files``.

    Examples are encoded (``encode_example``), turned into ``tf.train.Example``
    by TFDS's ``ExampleSerializer`` and serialized one episode at a time, streamed to
    TFDS's ``ExampleWriter`` (TFDS's own ``ShardWriter`` tees the examples to
    count them, which would hold a whole shard of decoded episodes).
    """
    from tensorflow_datasets.core import example_serializer, file_adapters
    from tensorflow_datasets.core import writer as writer_lib
    feats = dataset_info(item["source"], item["staging"]).features
    serializer = example_serializer.ExampleSerializer(feats.get_serialized_info())
    counts = {"episodes": 0, "rows": 0}

    def serialized():
        for ep, rows in owned_episodes(item):
            counts["episodes"] += 1
            counts["rows"] += len(rows["reward"])
            example = serializer.get_tf_example(feats.encode_example(episode_example(ep, rows)))
            # deterministic: a proto map's order would otherwise differ between processes, and with
            # it the bytes of a shard written by a Beam worker and by a Dask worker
            yield ep["episode_id"], example.SerializeToString(deterministic=True)

    path = _template(item["staging"], item["source"]["env_id"]).sharded_filepath(
        shard_index=item["file_index"], num_shards=item["num_files"])
    writer_lib.ExampleWriter(file_adapters.FileFormat.TFRECORD).write(path, serialized())
    return {"file_index": item["file_index"], "file": path.name, "bytes": int(path.stat().length),
            "complete": counts["episodes"], **counts}  # RLDS holds complete episodes only


def description(source: Dict[str, Any]) -> str:
    return (f"RLDS episodes of {source['env_id'] or 'an unnamed env'} exported by DataBloom"
            f" {source['databloom_version']} from replay store {source['source']} at commit-log version"
            f" {source['source_version']} (store schema {source['store_schema_version']}, export format"
            f" {source['export_format_version']}). Complete episodes only; steps carry the RLDS fields"
            " observation, action, reward, discount, is_first, is_last, is_terminal.")


def write_dataset_metadata(staging: str, source: Dict[str, Any], res: Dict[str, Any]) -> None:
    """Driver: ``dataset_info.json``, ``features.json`` and ``metadata.json`` for the written shards."""
    from tensorflow_datasets.core import file_adapters
    from tensorflow_datasets.core import splits as splits_lib
    info = dataset_info(source, staging)
    info.set_file_format(file_adapters.FileFormat.TFRECORD)
    split = splits_lib.SplitInfo(name=SPLIT, shard_lengths=list(res["file_episodes"]),
                                 num_bytes=int(sum(res["file_bytes"])),
                                 filename_template=_template(staging, source["env_id"]))
    info.set_splits(splits_lib.SplitDict([split]))
    info.write_to_directory(staging)


__all__: List[str] = ["require_tfds", "dataset_info", "write_shard", "write_dataset_metadata", "dataset_name"]
