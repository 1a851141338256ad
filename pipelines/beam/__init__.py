"""Training with ``--executor beam``: rounds of Beam pipelines of the plan's blocks.

:mod:`.rounds` is the entry point, :mod:`.launcher` submits the round pipelines, :mod:`.graph` builds
one, :mod:`.blocks` holds its stage functions, :mod:`.learner` its learner stage, :mod:`.records` the
JSON records the stages write, :mod:`.policy_files` the policies they read by path.
"""
