"""Micro-benchmarks: each script measures one thing (a stage, a store operation, a start-up) in isolation."""
