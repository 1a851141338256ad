"""DataBloom core library: envs, networks, quantization, actors, agents, replay, checkpoints."""
