"""Offline dataset processing over replay stores: stats, filter, compact, export, relabel.

Every operation is a short *plan* of passes; a pass maps a plain per-shard
function over the live shards of one snapshot and reduces the per-shard
results with a plain, order-independent function (results are sorted by
shard index before reducing). The training executors (:mod:`pipelines.executors`,
their ``map_reduce``) only schedule passes, so Beam, Dask and the in-process
executor give identical results; every function here takes one as ``engine``.

One concept per module:

* ``errors``   DatasetError (a ReplayError: one-line CLI errors, exit 2)
* ``shards``   per-shard reading: items, rows, per-row actors, rows -> batches
* ``episodes`` per-shard episode segments and the global episode table
* ``stats``    episodes, steps, return distribution, per-version / per-actor
* ``filter``   copy episodes with return >= X into a new store (one commit)
* ``replace``  the atomic "replace" commit used by compact and relabel
* ``compact``  merge small shards into large ones (one replace entry)
* ``relabel``  n-step return columns as new arrays (one replace entry)
* ``export``   the export plan (episodes per owning shard) and the checked summary
* ``ownership`` the episodes a shard owns, read whole with their step flags (both export formats)
* ``rlds``     RLDS episodes as a TFDS dataset (tensorflow-datasets' writer)
* ``parquet``  one Arrow/Parquet dataset, FixedSizeList columns, schema metadata

Example::

    import contextlib
    from core.dataset import stats
    from pipelines.executors.factory import make_pass_executor
    with contextlib.closing(make_pass_executor("dask")) as engine:
        summary = stats.compute_stats(engine, "runs/a/replay")
    summary["episodes"], summary["return"]["mean"]
"""
