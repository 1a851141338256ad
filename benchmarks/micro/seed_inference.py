"""SEED inference benchmark: env frames/s vs env-only actors, central (batched) vs local inference.

For each network (``mlp``: CartPole with a 4-64-64-2 MLP; ``cnn``: Pong with
the Nature CNN on 4 stacked 84x84 frames) and each actor configuration
(``--actors`` actor processes x ``--envs`` envs each):

* ``local``: every actor process runs its own LiteRT policy on its envs each
  step, batched over the actor's envs (the ActorQ path), at ``--local-precision``
  (fp32 by default; for the CNN, frames are stacked in the actor);
* ``per-env``: like ``local`` but each env runs its own batch-1 inference:
  the "per-env local fp32 inference" baseline of the issue's 3x goal (what
  SEED compares against: every actor doing its own forward pass);
* ``rollout``: the local actor as training runs it (``core.rollout.run_rollout_task``
  in tasks of 32 steps: inference, action selection *and* the trajectory
  rows), i.e. the same work the central server does per step (MLP only: that
  loop does not stack frames);
* ``central``: actor processes only step envs and stream observations to an
  InferenceServer in this process, which batches them (max batch = all envs,
  max wait ``--max-wait-ms``) and runs the policy at ``--central-precision``;
* ``echo``: the transport floor of ``central``: the same env-only actors and
  gRPC stream, but a server that answers every step with a fixed reply
  (decodes nothing, infers nothing, assembles nothing). No server-side
  optimisation can make ``central`` beat it.

Frames are agent steps x frame skip (4 for Atari, 1 for CartPole), the
definition SEED's paper uses. The machine is shared, so besides frames/s each
point reports **CPU per env step** (``cpu_us``: the actor processes' CPU time
in their step loops plus, for central, the server process's CPU time in the
measured window, divided by the env steps), which other users' load barely
moves, and the load average. ``--repeats N`` runs the modes in turn N times
and prints medians and the median of each repeat's central/local ratio.

    python -m benchmarks.micro.seed_inference --nets mlp cnn --actors 2 --envs 1 2 4 8 16 --seconds 6
    python -m benchmarks.micro.seed_inference --nets mlp --envs 16 --modes local central --repeats 5 --profile
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time

import numpy as np

NETS = {"mlp": ("CartPole-v1", 1, 1), "cnn": ("atari:Pong", 4, 4)}   # env, frame skip, frame stack


@functools.lru_cache(maxsize=None)
def _payload(net: str, precision: str):
    """The policy at ``precision`` (converted once per run: repeats reuse it)."""
    from core.agents.vtrace.config import VTraceConfig
    from core.agents.vtrace.networks import policy_network
    from core.envs import env_spec
    from core.quantize import PolicyQuantizer
    env_id, _, stack = NETS[net]
    cfg = VTraceConfig(torso="nature_cnn" if net == "cnn" else "mlp", frame_stack=stack)
    return PolicyQuantizer(precision).quantize(policy_network(env_spec(env_id), cfg), version=1)


def _local_actor(payload, env_id, num_envs, stack, seconds, actor_id, out, per_env=False):
    """Actor-side inference: the actor's own LiteRT policy, batched over its envs or one env at a time."""
    from core.envs import make_vector_env
    from core.inference.frames import FrameStacker
    from core.policy import LiteRTPolicy
    envs, obs = make_vector_env(env_id, num_envs, seed=actor_id)
    policy = LiteRTPolicy(payload, batch_size=1 if per_env else num_envs)
    stacker, rng = FrameStacker(stack), np.random.default_rng(actor_id)
    new = np.ones(num_envs, bool)
    steps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        x = stacker(obs, new).reshape(num_envs, -1).astype(np.float32)
        logits = (np.concatenate([policy(x[i:i + 1]) for i in range(num_envs)]) if per_env else policy(x))
        p = np.exp(logits - logits.max(-1, keepdims=True))
        a = (p.cumsum(-1) / p.sum(-1, keepdims=True) < rng.random((num_envs, 1))).sum(-1)
        obs, _, term, trunc, _ = envs.step(np.minimum(a, logits.shape[-1] - 1))
        new = term | trunc
        steps += num_envs
    out.put((steps / (time.perf_counter() - t0), (time.process_time() - c0) / steps))


def _rollout_actor(payload, env_id, num_envs, seconds, actor_id, out):
    """The training-time local actor: rollout tasks of 32 steps recording trajectory rows."""
    from core.actor import ActorSpec
    from core.rollout import run_rollout_task
    spec = ActorSpec("bench", env_id, num_envs, 0, actor_id, selector="categorical")
    run_rollout_task(spec, payload, 0, 32, {})                 # builds the envs and the interpreter
    steps, task, t0, c0 = 0, 1, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        steps += run_rollout_task(spec, payload, task, 32, {}).stats.env_steps
        task += 1
    out.put((steps / (time.perf_counter() - t0), (time.process_time() - c0) / steps))


def _central_actor(endpoint, env_id, num_envs, seconds, actor_id, out):
    from core.inference.client import run_env_actor_task
    from core.actor import ActorSpec
    spec = ActorSpec("bench", env_id, num_envs, 0, actor_id)
    # warm-up connection excluded: run for `seconds` worth of steps by time
    import threading
    result = {}
    t = threading.Thread(target=lambda: result.update(run_env_actor_task(endpoint, spec)), daemon=True)
    t0 = time.perf_counter()
    t.start()
    t.join(seconds + 60)
    out.put((result.get("env_steps", 0) / max(result.get("seconds", time.perf_counter() - t0), 1e-9),
             result.get("step_ms", {})))


class _EchoServer:
    """The ``echo`` mode's server: the real stream handshake, then a constant ``actions`` reply per step."""

    def __init__(self, address: str, envs: int):
        from core.inference import protocol
        self.address, self.envs = address, envs
        self.connections_opened = self.env_steps = self.requests = 0
        self._stop = False
        self._reply = protocol.encode({"kind": "actions", "stop": False}, {"action": np.zeros(envs, np.int64)})
        self._stop_reply = protocol.encode({"kind": "actions", "stop": True})

    def start(self) -> "_EchoServer":
        from concurrent import futures
        import grpc
        from core.inference import protocol
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.stream_stream_rpc_method_handler(self._act)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(protocol.SERVICE,
                                                                                     {"Act": handler}),))
        self._server.add_insecure_port(self.address)
        self._server.start()
        return self

    def _act(self, requests, context):
        from core.inference import protocol
        next(requests)                                      # hello
        self.connections_opened += 1
        yield protocol.encode({"kind": "welcome", "connection": self.connections_opened})
        for _ in requests:
            if self._stop:
                yield self._stop_reply
                return
            self.requests += 1
            self.env_steps += self.envs
            yield self._reply

    def endpoint(self):
        from core.inference.endpoint import ServerEndpoint
        return ServerEndpoint(self.address, "echo")

    def drain(self):
        return []

    def stats(self):
        return {}

    def request_stop(self):
        self._stop = True

    def stop(self):
        self._server.stop(0)


def _requests(server) -> int:
    return server.requests if isinstance(server, _EchoServer) else server.batcher.requests


def run_point(mode, net, actors, envs, seconds, precision, max_wait_ms, fixed_wait=False):
    from core.envs import env_spec
    env_id, skip, stack = NETS[net]
    payload = _payload(net, precision)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    server = None
    if mode in ("central", "echo"):
        from core.inference.endpoint import private_unix_socket
        from core.inference.server import InferenceServer
        plan = private_unix_socket()
        server = (_EchoServer(plan.bind, envs).start() if mode == "echo" else
                  InferenceServer(plan.bind, payload, env_spec(env_id),
                                  unroll_length=32, max_batch_size=actors * envs,
                                  max_wait_s=max_wait_ms / 1e3, frame_stack=stack,
                                  adaptive_wait=not fixed_wait).start())
        procs = [ctx.Process(target=_central_actor, args=(server.endpoint(), env_id, envs, seconds, a, q))
                 for a in range(actors)]
    elif mode == "rollout":
        procs = [ctx.Process(target=_rollout_actor, args=(payload, env_id, envs, seconds, a, q))
                 for a in range(actors)]
    else:
        procs = [ctx.Process(target=_local_actor, args=(payload, env_id, envs, stack, seconds, a, q,
                                                        mode == "per-env"))
                 for a in range(actors)]
    for p in procs:
        p.start()
    if server is not None:
        while server.connections_opened < actors or server.env_steps < actors * envs:
            time.sleep(0.05)          # actors build their envs after connecting (16 Pong envs: seconds)
        time.sleep(1.0)               # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        s0, r0 = server.env_steps, _requests(server)
        while time.perf_counter() - t0 < seconds:
            time.sleep(0.2)
            server.drain()            # unrolls are assembled as in training, then dropped
        steps = server.env_steps - s0
        wall = time.perf_counter() - t0
        server_cpu = time.process_time() - c0
        stats = dict(server.stats(), requests=_requests(server) - r0)
        server.request_stop()
        client = [q.get(timeout=30)[1] for _ in procs]
        for p in procs:
            p.join(30)
        server.stop()
        plan.cleanup()
        sps = steps / wall
        stats["client_step_ms"] = {k: float(np.mean([c.get(k, np.nan) for c in client])) for k in client[0]}
        # per env step: each actor's CPU per request over its envs, plus the server's share
        cpu_us = 1e3 * stats["client_step_ms"]["cpu"] / envs + 1e6 * server_cpu / max(steps, 1)
        stats["server_cpu_us"] = 1e6 * server_cpu / max(steps, 1)
    else:
        results = [q.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join(30)
        sps, stats = float(sum(r[0] for r in results)), {}
        cpu_us = 1e6 * float(np.mean([r[1] for r in results]))
    return {"mode": mode, "net": net, "env": env_id, "actors": actors, "envs_per_actor": envs,
            "precision": precision, "env_steps_per_s": sps, "frames_per_s": sps * skip,
            "cpu_us_per_env_step": cpu_us, "server_cpu_us_per_env_step": stats.get("server_cpu_us"),
            "load_average": os.getloadavg()[0], "wait_ms": stats.get("wait_ms"), "gap_ms": stats.get("gap_ms"),
            "chunk_rows": stats.get("chunk_rows"), "calibration_ms": stats.get("calibration_ms"),
            "infer_cpu_ms_per_batch": stats.get("infer_cpu_ms_per_batch"),
            "requests_per_s": stats.get("requests", 0) / seconds if stats else None,
            "batch_fill": stats.get("mean_fill"), "latency_ms_p50": stats.get("latency_ms_p50"),
            "latency_ms_p90": stats.get("latency_ms_p90"), "latency_ms_p99": stats.get("latency_ms_p99"),
            "server_step_ms": stats.get("step_ms"), "client_step_ms": stats.get("client_step_ms"),
            "queued_ms_mean": stats.get("queued_ms_mean"), "infer_ms_per_batch": stats.get("infer_ms_per_batch"),
            "rows_per_batch": stats["rows"] / max(stats["batches"], 1) if "rows" in stats else None}


def breakdown(row) -> str:
    """Where one central step goes, ms per request (one actor's step of all its envs).

    Client: send the request (encode + the stream write, which on gRPC's
    asyncio API may not return before the server has the message), wait for
    the reply (round trip), step the envs, and the actor process's CPU time
    per step (all its threads: gRPC's too).
    Server, inside the round trip: decode + validate, step-budget wait, input
    preparation (frame stack, recurrent state), batched inference (queueing for
    a batch + the policy call), action selection + unroll assembly, encode.
    The rest of send + round trip is gRPC and the transport (serialization into
    gRPC's buffers, the unix socket, thread hand-offs) plus decoding the reply.
    Wall times are inflated by other users' load; the CPU line is not.
    The CPU line splits one env step's CPU time into the actor's env step (its
    thread's CPU time), the actor's other CPU (encode, gRPC client threads),
    the policy call's share and the rest of the server process (gRPC server,
    decode, frame stack, selection, unroll assembly).
    """
    c, srv, e = row["client_step_ms"], row["server_step_ms"], row["envs_per_actor"]
    handler = sum(srv.values())
    infer_share = row["infer_ms_per_batch"] / max(row["rows_per_batch"], 1e-9) * e
    infer_cpu_us = 1e3 * row["infer_cpu_ms_per_batch"] / max(row["rows_per_batch"], 1e-9)
    env_us = 1e3 * c["env_cpu"] / e
    lines = [f"  client  env step {c['env_step']:.3f}  send {c['encode']:.3f}  round trip {c['round_trip']:.3f}"
             f"  cpu {c['cpu']:.3f} (envs {c['env_cpu']:.3f})",
             "  server  " + "  ".join(f"{k} {v:.3f}" for k, v in srv.items()) + f"  (handler {handler:.3f})",
             f"  batcher queued {row['queued_ms_mean']:.3f}  policy call {row['infer_ms_per_batch']:.3f}/batch of "
             f"{row['rows_per_batch']:.1f} rows (this request's share {infer_share:.3f})  wait {row['wait_ms']:.3f}"
             f"  gap {row['gap_ms'] or float('nan'):.3f}  chunk {row['chunk_rows']}",
             f"  grpc + transport + reply decode = send + round trip - handler = "
             f"{c['encode'] + c['round_trip'] - handler:.3f}",
             f"  CPU us per env step {row['cpu_us_per_env_step']:.1f} = actor env step {env_us:.1f} + actor rest "
             f"{1e3 * c['cpu'] / e - env_us:.1f} + policy {infer_cpu_us:.1f} + server rest "
             f"{row['server_cpu_us_per_env_step'] - infer_cpu_us:.1f}"]
    return "\n".join(lines)


def _median_summary(rows, modes) -> str:
    """Medians per mode, and the median over repeats of each mode's rate / the first mode's."""
    by = {m: [r for r in rows if r["mode"] == m] for m in modes}
    base = by[modes[0]]
    out = []
    for m in modes:
        fps = statistics.median(r["frames_per_s"] for r in by[m])
        cpu = statistics.median(r["cpu_us_per_env_step"] for r in by[m])
        ratios = [r["frames_per_s"] / b["frames_per_s"] for r, b in zip(by[m], base)]
        out.append(f"  median {m:8s} {by[m][0]['precision']:12s} frames/s {fps:9.0f}  cpu us/env step {cpu:7.1f}  "
                   f"vs {modes[0]}: {statistics.median(ratios):.2f}x (repeats {', '.join(f'{x:.2f}' for x in ratios)})")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", default=["mlp", "cnn"], choices=list(NETS))
    p.add_argument("--actors", nargs="+", type=int, default=[2])
    p.add_argument("--envs", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    p.add_argument("--modes", nargs="+", default=["per-env", "local", "central"],
                   choices=["per-env", "local", "rollout", "central", "echo"])
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=1, help="run the modes in turn this many times (medians)")
    p.add_argument("--local-precision", default="fp32")
    p.add_argument("--central-precision", default="fp32")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="the server's bound on a batch's wait")
    p.add_argument("--fixed-wait", action="store_true",
                   help="always wait up to --max-wait-ms (the server's default tunes the wait to arrivals)")
    p.add_argument("--out", default=None,
                   help="also write every row as JSON to this path (e.g. benchmarks/results/seed-inference.json)")
    p.add_argument("--profile", action="store_true", help="print where each central step's time goes")
    args = p.parse_args(argv)
    if "rollout" in args.modes and any(NETS[n][2] > 1 for n in args.nets):
        print("error: --modes rollout runs the training actor loop, which does not stack frames; "
              "valid with --nets mlp only", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.seconds <= 0:
        print(f"error: --repeats {args.repeats} --seconds {args.seconds}; valid: repeats >= 1, seconds > 0",
              file=sys.stderr)
        return 2
    rows = []
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {platform.processor() or platform.machine()} "
          f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}")
    print("mode     net  actors envs prec   env_steps/s  frames/s  req/s   fill  p50ms  p99ms  cpu_us  load")
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    for net in args.nets:
        for a in args.actors:
            for e in args.envs:
                point = []
                for _ in range(args.repeats):
                    for mode in args.modes:
                        prec = args.central_precision if mode == "central" else args.local_precision
                        r = run_point(mode, net, a, e, args.seconds, prec, args.max_wait_ms, args.fixed_wait)
                        point.append(r)
                        print(f"{mode:8s} {net:4s} {a:6d} {e:4d} {prec:6s} {r['env_steps_per_s']:11.0f} "
                              f"{r['frames_per_s']:9.0f} {f(r['requests_per_s'], '6.0f')} "
                              f"{f(r['batch_fill'], '5.2f')} {f(r['latency_ms_p50'], '6.2f')} "
                              f"{f(r['latency_ms_p99'], '6.2f')} {r['cpu_us_per_env_step']:7.1f} "
                              f"{r['load_average']:5.1f}", flush=True)
                        if args.profile and mode == "central":
                            print(breakdown(r), flush=True)
                if args.repeats > 1:
                    print(_median_summary(point, args.modes), flush=True)
                rows += point
    if args.out is None:
        return 0
    with open(args.out, "w") as fh:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "argv": sys.argv[1:],
                   "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
