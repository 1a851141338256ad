"""Shard writes to s3:// on a local S3 server (moto): requests and time per shard, per engine.

Starts moto's S3 server in-process, points s3fs and tensorstore at it through
``AWS_ENDPOINT_URL``, and writes the same shard (4 batches of 8 envs x 128
CartPole steps) with the ``tensorstore`` engine (the default) and the
``zarr`` engine (zarr-python over s3fs), interleaved. Prints the median
requests and milliseconds per shard after one warm-up write per engine.
A local server has no network latency, so on real S3 the request count is
what matters most.

    python benchmarks/micro/s3_shard_write.py [--repeats 5]

Needs the test extra (moto[server], s3fs, boto3).
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _Counter:
    """WSGI wrapper counting requests."""

    def __init__(self, app):
        self.app, self.count = app, 0

    def __call__(self, environ, start_response):
        self.count += 1
        return self.app(environ, start_response)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed shard writes per engine (median reported)")
    args = parser.parse_args(argv)
    import boto3
    import numpy as np
    from moto.server import ThreadedMotoServer
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    counter = _Counter(server._server.app)
    server._server.app = counter
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1")
    from benchmarks.micro.replay_write import make_batches
    from core.replay import ReplayStore
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    batches = make_batches("cartpole", 4 * 8 * 128)
    mb = sum(b.nbytes for b in batches) / 1e6
    stores = {e: ReplayStore.open_or_create(f"s3://{bucket}/{e}", env_id="bench", engine=e)
              for e in ("tensorstore", "zarr")}
    results = {e: [] for e in stores}
    try:
        for r in range(-1, args.repeats):
            for engine, store in stores.items():
                n0, t0 = counter.count, time.perf_counter()
                store.write_shard(f"s{r + 1:08d}", batches)
                if r >= 0:
                    results[engine].append((counter.count - n0, time.perf_counter() - t0))
    finally:
        server.stop()
    print(f"shard: {sum(b.size for b in batches)} rows, {mb:.2f} MB raw")
    for engine, rows in results.items():
        reqs, secs = np.median(np.array(rows), axis=0)
        print(f"{engine:>12}: {reqs:5.0f} requests  {secs * 1e3:6.0f} ms per shard")
    ts, zr = (np.median(np.array(results[e]), axis=0) for e in ("tensorstore", "zarr"))
    print(f"{'zarr / ts':>12}: {zr[0] / ts[0]:5.1f}x requests  {zr[1] / ts[1]:5.1f}x time")


if __name__ == "__main__":
    main()
