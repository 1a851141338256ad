"""What every executor shares: the JSON round trip of a pass's result, and the actors' thread settings.

Executors import these from here, never from their package's ``__init__`` (which imports none of them):
``local``, ``dask`` and ``beam`` return a dataset pass's result through :func:`json_round_trip`, so even
the Python types agree across executors; :func:`thread_env` is what Dask workers and the Beam
DirectRunner's worker processes run with.
"""
from __future__ import annotations

import json
from typing import Any


def json_round_trip(value: Any) -> Any:
    """``value`` as JSON would return it (tuples become lists, numpy scalars are refused)."""
    return json.loads(json.dumps(value))


def thread_env(cfg) -> dict:
    # Actors run LiteRT + numpy; one BLAS/OpenMP thread each keeps workers
    # from oversubscribing the cores they share with the learner.
    n = str(cfg.threads.litert)
    return {"OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, "MKL_NUM_THREADS": n,
            "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
