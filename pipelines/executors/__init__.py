"""Thin executors: they schedule stage functions and hold no algorithm logic.

One protocol serves training (:mod:`pipelines.run.driver`) and dataset passes
(:mod:`pipelines.process`, :mod:`core.dataset`)::

    ex.broadcast(payload) -> ref      # send once, pass ref to many tasks
    ex.submit(fn, *args, key=..., actor=None) -> future   # .done(), .result()
    ex.wait(futures, timeout) -> list of done futures
    ex.map_reduce(label, fn, items, reduce) -> JSON-able result   # one dataset pass
    ex.workers() -> dict of per-worker info
    ex.close()

``map_reduce`` holds no dataset logic: ``fn`` and ``reduce`` are plain
module-level functions of :mod:`core.dataset`, and ``reduce`` sorts its
inputs, so a pass's result does not depend on the executor or on the order
results arrived. Every executor returns it after a JSON round trip, so even
the Python types agree across executors (a test checks this).

Executors: ``local`` (this process, in order; deterministic), ``dask``
(:mod:`.dask`: an embedded LocalCluster or an existing scheduler), ``beam``
(:mod:`.beam`: dataset passes as one pipeline each; training on Beam runs as
rounds, :mod:`pipelines.beam.rounds`).

The Dask executor has one call more, for a stage that holds state (the learner)::

    ex.place(cls, *args, resources={"GPU": 1}) -> handle   # pipelines.executors.dask_stage

An executor by name: :mod:`.factory` (``make_executor``, ``make_pass_executor``,
``run_with_executor``); what they share: :mod:`.common`. This ``__init__`` imports none of its
submodules, so no executor imports back through it. Executors import ``core`` only, never
``pipelines.run`` or ``pipelines.beam``.
"""
