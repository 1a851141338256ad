"""SEED-style central inference: env-only actors stream observations, the learner batches inference.

One concept per module:

* ``endpoint``  where the server listens (never a wildcard by default), the per-run token, TLS files
* ``protocol``  the wire format: length-prefixed JSON header + raw numpy bytes (no pickle, no protoc)
* ``batching``  DynamicBatcher: max batch size AND max wait time (a partial batch never waits forever),
                the wait optionally tuned to the measured arrival rate
* ``runners``   InferenceRunner, the one interface the server runs its policy through (LiteRTRunner today)
* ``messages``  MessageChecks: what an actor's hello and step messages must hold, checked against the env spec
* ``frames``    FrameStacker: the last k frames on the channel axis (pixels; numpy only, no gRPC)
* ``unrolls``   UnrollAssembler: per-actor RLDS rows -> TrajectoryBatch unrolls, server-side
* ``tasks``     TaskSchedule: per-actor grants of rollout tasks, policy versions in use, finished tasks
* ``server``    InferenceServer: gRPC bidi-streaming service in the learner process (LiteRT fp32/int8)
* ``streams``   ActorStreams: the server's side of one actor's stream (hello, steps, tasks, state capture)
* ``client``    run_env_actor_task: an env-only actor with reconnect and backoff

Example::

    plan = private_unix_socket()                      # unix socket in a 0700 directory
    server = InferenceServer(plan.bind, payload, env_spec("CartPole-v1"), unroll_length=32)
    server.start()
    run_env_actor_task(server.endpoint(), ActorSpec("r", "CartPole-v1", 8, 0, 0), max_env_steps=1000)
    batches = server.drain()          # TrajectoryBatches ready for ReplayStore.write_shard
    server.stop(); plan.cleanup()
"""
