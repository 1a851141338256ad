"""Engines for dataset passes: map a per-shard function over items, reduce the results.

``engine.map_reduce(label, fn, items, reduce) -> JSON-able result``. Engines
hold no dataset logic; ``fn`` and ``reduce`` are plain module-level functions
of ``core.dataset``, and ``reduce`` sorts its inputs, so the result does not
depend on which engine ran or in which order results arrived. Every engine
returns the reduce result after a JSON round trip, so even the Python types
of the results are identical across engines (a test checks this).

* ``local``: in this process, in order (debugging, tiny stores).
* ``dask``: a ``LocalCluster`` (one single-threaded worker process per core)
  or an existing scheduler (``address``); ``client.map`` then one reduce task.
* ``beam``: one pipeline per pass, ``Create | Reshuffle | Map | ToList |
  reduce | write JSON``; the launcher reads the JSON, so nothing relies on
  the launcher's memory. Default: the DirectRunner, in-process; Beam
  options (``--runner``, ``--direct_running_mode``, ``--temp_location``, ...)
  pass through untouched.

Example::

    with make_engine("dask") as engine:
        total = engine.map_reduce("rows", count_rows, items, sum)
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import uuid
from typing import Any, Callable, List, Optional, Sequence

from core.dataset.errors import DatasetError

ENGINES = ("beam", "dask", "local")


def _json_round_trip(value: Any) -> Any:
    return json.loads(json.dumps(value))


class LocalEngine:
    name = "local"
    in_process = True

    def map_reduce(self, label: str, fn: Callable, items: Sequence[Any], reduce: Callable) -> Any:
        return _json_round_trip(reduce([fn(i) for i in items]))

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DaskEngine(LocalEngine):
    name = "dask"
    in_process = False

    def __init__(self, address: Optional[str] = None, n_workers: int = 0, retries: int = 2):
        from distributed import Client, LocalCluster
        self._cluster = None
        self.retries = retries
        if address:
            self.client = Client(address, timeout="20s")
        else:
            self._cluster = LocalCluster(n_workers=n_workers or os.cpu_count() or 1, threads_per_worker=1,
                                         processes=True, dashboard_address=":0", silence_logs=logging.ERROR)
            self.client = Client(self._cluster)

    def map_reduce(self, label: str, fn: Callable, items: Sequence[Any], reduce: Callable) -> Any:
        run = uuid.uuid4().hex[:8]
        futures = self.client.map(fn, list(items), key=[f"{label}-{run}-{i}" for i in range(len(items))],
                                  pure=False, retries=self.retries)
        result = self.client.submit(reduce, futures, key=f"{label}-{run}-reduce", pure=False)
        return _json_round_trip(result.result())

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()


def _reduce_and_write(results: List[Any], reduce: Callable, url: str) -> None:
    import fsspec
    with fsspec.open(url, "w") as f:
        json.dump(reduce(results), f)


class BeamEngine(LocalEngine):
    name = "beam"

    def __init__(self, pipeline_args: Optional[List[str]] = None):
        from apache_beam.options.pipeline_options import (DirectOptions, GoogleCloudOptions, PipelineOptions,
                                                          StandardOptions)
        self.options = PipelineOptions(list(pipeline_args or []))
        runner = self.options.view_as(StandardOptions).runner or "DirectRunner"
        mode = self.options.view_as(DirectOptions).direct_running_mode
        self.in_process = runner in ("DirectRunner", "direct") and mode != "multi_processing"
        self.temp = self.options.view_as(GoogleCloudOptions).temp_location
        self._local_temp = None
        if not self.temp:
            if not runner.startswith("Direct") and runner != "direct":
                raise DatasetError(f"Beam runner {runner} needs --temp_location (a URL its workers and this"
                                   " process can both reach, e.g. gs://bucket/tmp) for pass results")
            self._local_temp = tempfile.mkdtemp(prefix="databloom-beam-")
            self.temp = self._local_temp

    def map_reduce(self, label: str, fn: Callable, items: Sequence[Any], reduce: Callable) -> Any:
        import apache_beam as beam
        import fsspec
        url = f"{self.temp.rstrip('/')}/{label}-{uuid.uuid4().hex}.json"
        with beam.Pipeline(options=self.options) as p:
            _ = (p
                 | "CreateItems" >> beam.Create(list(items))
                 | "Reshuffle" >> beam.Reshuffle()  # to prevent fusion: spread shards over workers
                 | f"Map-{label}" >> beam.Map(fn)
                 | "Gather" >> beam.combiners.ToList()
                 | "ReduceAndWrite" >> beam.Map(_reduce_and_write, reduce, url))
        fs, path = fsspec.core.url_to_fs(url)
        try:
            with fs.open(path) as f:
                return _json_round_trip(json.load(f))
        finally:
            fs.rm(path)

    def close(self) -> None:
        if self._local_temp:
            import shutil
            shutil.rmtree(self._local_temp, ignore_errors=True)


def make_engine(kind: str, pipeline_args: Optional[List[str]] = None, dask_address: Optional[str] = None,
                n_workers: int = 0):
    """An engine by name; DatasetError (one line) for unknown names or misplaced Beam options."""
    if kind not in ENGINES:
        raise DatasetError(f"unknown executor {kind!r}; valid: {', '.join(ENGINES)}")
    if pipeline_args and kind != "beam":
        raise DatasetError(f"unrecognized arguments: {' '.join(pipeline_args)} (Beam pipeline options pass"
                           " through only with --executor beam)")
    if kind == "beam":
        return BeamEngine(pipeline_args)
    if kind == "dask":
        return DaskEngine(dask_address, n_workers)
    return LocalEngine()


def check_reachable(engine, *urls_: str) -> None:
    """memory:// lives in one process: reject it for engines whose workers are other processes."""
    from core import urls
    for url in urls_:
        if url and urls.scheme_of(url) == "memory" and not engine.in_process:
            raise DatasetError(f"{url!r} is a memory:// store, visible only in this process; valid with"
                               " --executor local or beam (in-process DirectRunner), or use a path/URL the"
                               f" {engine.name} workers can reach")
