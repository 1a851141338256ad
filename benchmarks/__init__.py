"""DataBloom's benchmarks: ``studies`` (whole-run studies: ActorQ, the learning suite, time to solve),
``micro`` (one-measurement scripts) and ``common`` (the helpers their records share). Run from a
checkout: ``python -m benchmarks.studies.actorq_study --help``; results in ``benchmarks/RESULTS.md``."""
