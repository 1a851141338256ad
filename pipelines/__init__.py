"""DataBloom entry points (train, evaluate, ...) and thin executors."""
