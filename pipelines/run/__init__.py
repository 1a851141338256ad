"""The training run's internals: the plan, its driver and stages, the learner stage, resume and the summary.

The command-line tools (:mod:`pipelines.train` and its siblings) call in here; the Beam path
(:mod:`pipelines.beam`) reuses the plan, the stages and the learner stage; the executors
(:mod:`pipelines.executors`) schedule what this package hands them and never import it.
"""
