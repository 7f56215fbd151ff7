"""ScaNN vs brute force, and the model server vs calling the SavedModel in process.

1. Top-k over N synthetic item embeddings (default 1M, d=64, clustered like
   learned embeddings: a Gaussian mixture of 1,000 components, optionally with spread
   norms): queries/s of ScaNN (tuned to --target-recall as the export tunes it, and
   with each fixed --search-fraction; searched as the exported module searches) and of
   exact brute force (a TensorFlow matmul + top_k), and ScaNN's recall@k against the
   exact top-k, for each --ann-k.
2. A SASRec export (brute force over the given catalog) served by the model server
   on loopback: throughput and p50/p99 latency of concurrent gRPC clients (the
   official stub, in a separate process), beside threads calling the same
   SavedModel signature in process.
3. REST under concurrent load: 32 and 200 clients (threads of a separate process)
   all starting at once, each sending single-user POST :predict requests, over one
   keep-alive connection per client or a new connection per request: how many
   succeeded, requests/s, p50/p99 latency of the successful ones.
4. Slow clients: p50/p99 of normal REST requests with none, then 64, connections that
   each sent part of a request (half the headers, or the headers and part of a body).

    python benchmarks/bench_serving.py [--synthetic-items 1000000 --queries 2000 --clients 8]
    python benchmarks/bench_serving.py --skip-ann --skip-grpc   # the REST parts only
    python benchmarks/bench_serving.py --skip-grpc --skip-rest --skip-slow \
        --dim 32 --ann-k 100 1000 --search-fraction 0.05        # ScaNN only, tuned and not
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import tensorflow as tf  # noqa: E402
from common import machine

from tfrs_logq.sasrec.models import SASRecEncoder  # noqa: E402
from tfrs_logq.serving.export import (  # noqa: E402
    DEFAULT_SEARCH_FRACTION,
    DEFAULT_TARGET_RECALL,
    RetrievalModule,
    build_scann_searcher,
    export,
    scann_parameters,
    search_scann,
    search_settings,
    tune_scann,
)
from tfrs_logq.serving.server import ModelServer, ServerOptions  # noqa: E402


def clustered(n, d, rng, components=1000, noise=0.5, norm_spread=0.0):
    """``n`` points of a Gaussian mixture of ``components`` centres drawn by this call
    (so queries and items come from different mixtures), ``noise`` around them, each
    point scaled by ``exp(norm_spread * N(0, 1))``: spread norms make maximum inner
    product search harder for a partitioned index, as learned embeddings do."""
    centers = rng.normal(size=(components, d)).astype(np.float32)
    which = rng.integers(0, components, n)
    points = centers[which] + noise * rng.normal(size=(n, d)).astype(np.float32)
    if norm_spread:
        points *= np.exp(norm_spread * rng.normal(size=(n, 1))).astype(np.float32)
    return points.astype(np.float32)


def ann_benchmark(args, rng):
    """Queries/s and recall@k against the exact top-k, for each k: brute force, ScaNN with
    a fixed share of the leaves searched (each --search-fraction, 10 k reordered), and
    ScaNN tuned as `tfrs-logq export --index scann` tunes it (`tune_scann` to
    --target-recall at the smallest and largest --ann-k, on --tuning-queries queries
    drawn apart from the timed ones). One tree (`scann_parameters`: sqrt(n) leaves) serves
    every row; every ScaNN row is searched through `search_scann`, as the exported
    module searches."""
    spread = dict(noise=args.noise, norm_spread=args.norm_spread)
    items = clustered(args.synthetic_items, args.dim, rng, **spread)
    queries = clustered(args.queries, args.dim, rng, **spread)
    tuning_queries = clustered(args.tuning_queries, args.dim, rng, **spread)
    q = tf.constant(queries)
    table = tf.constant(items)

    def timed(fn, batch=256):
        fn(q[:batch])
        start = time.perf_counter()
        out = [fn(q[i:i + batch]) for i in range(0, args.queries, batch)]
        return args.queries / (time.perf_counter() - start), np.concatenate(
            [np.asarray(o) for o in out])

    ks = sorted(args.ann_k)
    params = scann_parameters(args.synthetic_items, ks[0], max_k=ks[-1])
    start = time.perf_counter()
    searcher = build_scann_searcher(items, params)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    tuned, report = tune_scann(searcher, items, tuning_queries, params, args.target_recall,
                               queries_source=f"{args.tuning_queries} synthetic queries")
    tune_s = time.perf_counter() - start
    print(f"{args.synthetic_items:,} items, d={args.dim}, clustered (1,000 components, noise "
          f"{args.noise:g}, norm spread {args.norm_spread:g}), {args.queries:,} queries in "
          f"batches of 256; tree of {params.get('num_leaves', 0):,} leaves built in "
          f"{build_s:.0f} s; tuned to recall {args.target_recall:g} in {tune_s:.0f} s on "
          f"{args.tuning_queries:,} other queries (held-out recall "
          f"{report['recall']}, reached: {report['reached']})")
    print("| k | index | leaves searched | reordered | queries/s | recall@k vs exact "
          "| / brute force queries/s |")
    print("|---|---|---|---|---|---|---|")
    for k in ks:
        brute = tf.function(lambda qb, k=k: tf.math.top_k(
            tf.matmul(qb, table, transpose_b=True), k)[1])
        exact_qps, exact = timed(lambda x: brute(x).numpy())
        print(f"| {k} | brute force | - | - | {exact_qps:,.0f} | 1.000 | 1.0x |", flush=True)
        settings = [(f"ScaNN, fraction {f:g}", {**params, "num_leaves_to_search": max(
            1, int(params["num_leaves"] * f + 1e-9))} if params["tree"] else params)
            for f in args.search_fraction]
        settings.append((f"ScaNN, tuned to {args.target_recall:g}", tuned))
        for name, p in settings:
            qps, approx = timed(lambda x, p=p: search_scann(searcher, x, k, p)[0].numpy())
            recall = np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact)])
            leaves, factor = (None if x is None else int(x) for x in search_settings(k, p))
            where = f"{leaves:,} of {p['num_leaves']:,}" if p["tree"] else "all"
            print(f"| {k} | {name} | {where} | {max(factor * k, p['reorder']):,} "
                  f"| {qps:,.0f} | {recall:.3f} | {qps / exact_qps:.1f}x |", flush=True)


def serving_export(args):
    num_items = args.server_items
    encoder = SASRecEncoder(num_items + 1, 50, 64, 2, 1, 0.0)
    encoder(tf.zeros([1, 50], tf.int32))
    module = RetrievalModule(encoder, np.arange(1, num_items + 1), "brute-force", 100)
    base = tempfile.mkdtemp()
    export("", base, "bench", index="brute-force", module=module)
    return os.path.join(base, "bench")


def start_server(args, model_base_path):
    return ModelServer(ServerOptions("bench", model_base_path, port=0, rest_api_port=0,
                                     max_batch_size=args.max_batch_size,
                                     batch_timeout_micros=args.batch_timeout_micros)).start()


def server_benchmark(args, rng, model_base_path):
    num_items = args.server_items
    saved = tf.saved_model.load(os.path.join(model_base_path, "1"))
    signature = saved.signatures["serving_default"]
    requests = [rng.integers(1, num_items + 1, size=(1, 50)).astype(np.int64)
                for _ in range(args.requests)]

    def run(call, clients):
        latencies = []
        lock = threading.Lock()
        per_client = args.requests // clients

        def worker(offset):
            for i in range(per_client):
                t0 = time.perf_counter()
                call(requests[offset + i])
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)

        threads = [threading.Thread(target=worker, args=(c * per_client,))
                   for c in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        latencies.sort()
        return (len(latencies) / elapsed, statistics.median(latencies) * 1e3,
                latencies[int(0.99 * (len(latencies) - 1))] * 1e3)

    in_process = lambda h: signature(history=tf.constant(h))["item_ids"].numpy()  # noqa: E731
    run(in_process, 1)
    local = run(in_process, args.clients)
    srv = start_server(args, model_base_path)
    # The load comes from another process, as real clients do (and so that the
    # clients' Python does not share the server's interpreter lock).
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, str(srv.port), str(num_items), str(args.requests),
         str(args.clients)], capture_output=True, text=True, timeout=600)
    srv.stop()
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    remote = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"serving top-100 of {num_items:,} items (SASRec encoder L=50, d=64, brute force), "
          f"{args.requests:,} single-user requests from {args.clients} concurrent clients:")
    print("| path                      | requests/s | p50 ms | p99 ms |")
    print("|---------------------------|------------|--------|--------|")
    print(f"| SavedModel in process     | {local[0]:10,.0f} | {local[1]:6.1f} | {local[2]:6.1f} |")
    print(f"| tfrs-logq serve, gRPC     | {remote[0]:10,.0f} | {remote[1]:6.1f} | "
          f"{remote[2]:6.1f} |")
    print(f"server / in-process throughput = {remote[0] / local[0]:.2f}")


def rest_load_benchmark(args, model_base_path):
    """Many REST clients at once: every request must succeed (none reset or dropped)."""
    clients_list = args.rest_clients
    per_client = args.rest_requests_per_client
    srv = start_server(args, model_base_path)
    rows = []
    try:
        for clients in clients_list:
            for mode in ("keep-alive", "per-request"):
                proc = subprocess.run(
                    [sys.executable, "-c", REST_CLIENT, str(srv.rest_port),
                     str(args.server_items), str(clients), str(per_client), mode],
                    capture_output=True, text=True, timeout=900)
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr[-2000:])
                rows.append((clients, mode, json.loads(proc.stdout.strip().splitlines()[-1])))
    finally:
        srv.stop()
    print(f"REST :predict under concurrent load (top-100 of {args.server_items:,} items), "
          f"{per_client} requests per client, all clients starting at once:")
    print("| clients | connections          | succeeded            | requests/s | p50 ms | "
          "p99 ms |")
    print("|---------|----------------------|----------------------|------------|--------|"
          "--------|")
    for clients, mode, r in rows:
        connections = "one keep-alive each" if mode == "keep-alive" else "new per request"
        print(f"| {clients:7d} | {connections:20s} | {r['ok']:5d}/{r['total']:5d} "
              f"({100 * r['ok'] / r['total']:5.1f}%) | {r['rps']:10,.0f} | {r['p50']:6.1f} | "
              f"{r['p99']:6.1f} |")
        if r["errors"]:
            print(f"  failures, e.g.: {r['errors'][:3]}")


def slow_clients_benchmark(args, model_base_path):
    """Normal REST requests while ``--slow-clients`` connections each hold part of a
    request (half the headers, or the headers and part of the body)."""
    import socket

    srv = start_server(args, model_base_path)
    held = []
    try:
        body = json.dumps({"instances": [[1, 2, 3]]}).encode()

        def latency_ms() -> float:
            import http.client

            t0 = time.perf_counter()
            connection = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=60)
            connection.request("POST", "/v1/models/bench:predict", body)
            response = connection.getresponse()
            response.read()
            connection.close()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            return (time.perf_counter() - t0) * 1e3

        rows = []
        for slow in (0, args.slow_clients):
            while len(held) < slow:
                sock = socket.create_connection(("127.0.0.1", srv.rest_port), timeout=10)
                sock.sendall(b"POST /v1/models/bench:predict HTTP/1.1\r\nHost: x\r\n" +
                             (b"Content-Le" if len(held) % 2 else
                              b"Content-Length: 1000\r\n\r\n{\"instances\": [[1"))
                held.append(sock)
            time.sleep(0.2)
            latencies = sorted(latency_ms() for _ in range(args.slow_requests))
            rows.append((slow, statistics.median(latencies),
                         latencies[int(0.99 * (len(latencies) - 1))]))
    finally:
        for sock in held:
            sock.close()
        srv.stop()
    print(f"REST :predict beside clients that sent part of a request (top-100 of "
          f"{args.server_items:,} items, {args.slow_requests} sequential requests, new "
          "connection each):")
    print("| slow clients connected | p50 ms | p99 ms |")
    print("|------------------------|--------|--------|")
    for slow, p50, p99 in rows:
        print(f"| {slow:22d} | {p50:6.1f} | {p99:6.1f} |")


CLIENT = r"""
import json, statistics, sys, threading, time
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
import grpc
port, num_items, total, clients = map(int, sys.argv[1:])
stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
rng = np.random.default_rng(1)
protos = []
for _ in range(total):
    r = predict_pb2.PredictRequest()
    r.model_spec.name = "bench"
    r.inputs["history"].CopyFrom(tf.make_tensor_proto(rng.integers(1, num_items + 1, (1, 50))))
    protos.append(r)
for r in protos[:20]:
    stub.Predict(r, timeout=30)
latencies, lock = [], threading.Lock()
def worker(offset, n):
    for r in protos[offset:offset + n]:
        t0 = time.perf_counter(); stub.Predict(r, timeout=30); dt = time.perf_counter() - t0
        with lock:
            latencies.append(dt)
per = total // clients
threads = [threading.Thread(target=worker, args=(c * per, per)) for c in range(clients)]
start = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.perf_counter() - start
latencies.sort()
print(json.dumps([len(latencies) / elapsed, statistics.median(latencies) * 1e3,
                  latencies[int(0.99 * (len(latencies) - 1))] * 1e3]))
"""


REST_CLIENT = r"""
import http.client, json, statistics, sys, threading, time
import numpy as np
port, num_items, clients, per_client = map(int, sys.argv[1:5])
keep_alive = sys.argv[5] == "keep-alive"
rng = np.random.default_rng(2)
bodies = [json.dumps({"instances": rng.integers(1, num_items + 1, (1, 50)).tolist()}).encode()
          for _ in range(clients * per_client)]
latencies, errors, lock = [], [], threading.Lock()
barrier = threading.Barrier(clients)
def worker(c):
    connection = None
    barrier.wait()
    for body in bodies[c * per_client:(c + 1) * per_client]:
        t0 = time.perf_counter()
        try:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            connection.request("POST", "/v1/models/bench:predict", body,
                               {"Content-Type": "application/json"})
            response = connection.getresponse()
            reply = response.read()
            if response.status != 200 or b"predictions" not in reply:
                raise RuntimeError(f"HTTP {response.status}: {reply[:100]!r}")
            with lock:
                latencies.append(time.perf_counter() - t0)
        except Exception as exc:
            with lock:
                errors.append(repr(exc)[:120])
            if connection is not None:
                connection.close()
            connection = None
        if not keep_alive and connection is not None:
            connection.close()
            connection = None
    if connection is not None:
        connection.close()
threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
start = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.perf_counter() - start
latencies.sort()
pick = lambda q: latencies[int(q * (len(latencies) - 1))] * 1e3 if latencies else float("nan")
print(json.dumps({"total": clients * per_client, "ok": len(latencies),
                  "rps": len(latencies) / elapsed, "p50": pick(0.5), "p99": pick(0.99),
                  "errors": sorted(set(errors))}))
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--synthetic-items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--server-items", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--skip-ann", action="store_true")
    parser.add_argument("--ann-k", type=int, nargs="+", default=[100],
                        help="part 1: the k of each search (default 100)")
    parser.add_argument("--search-fraction", type=float, nargs="+",
                        default=[DEFAULT_SEARCH_FRACTION],
                        help="part 1: fixed shares of the tree's leaves searched, each "
                             "timed beside the tuned index (default: 1/20, the export's "
                             "before it tuned)")
    parser.add_argument("--target-recall", type=float, default=DEFAULT_TARGET_RECALL,
                        help="part 1: the tuned index's target (default: the export's)")
    parser.add_argument("--tuning-queries", type=int, default=1000,
                        help="part 1: queries the index is tuned and measured on (half "
                             "each), drawn apart from the timed ones")
    parser.add_argument("--noise", type=float, default=0.5,
                        help="part 1: the items' spread around their cluster centres")
    parser.add_argument("--norm-spread", type=float, default=0.0,
                        help="part 1: items scaled by exp(s N(0, 1)); 0.5 makes a catalog "
                             "that a partitioned index finds hard")
    parser.add_argument("--skip-grpc", action="store_true", help="skip part 2")
    parser.add_argument("--skip-rest", action="store_true", help="skip part 3")
    parser.add_argument("--rest-clients", nargs="+", type=int, default=[32, 200],
                        help="numbers of concurrent REST clients")
    parser.add_argument("--rest-requests-per-client", type=int, default=10)
    parser.add_argument("--skip-slow", action="store_true", help="skip part 4")
    parser.add_argument("--slow-clients", type=int, default=64,
                        help="part 4: connections that each send part of a request")
    parser.add_argument("--slow-requests", type=int, default=50)
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--batch-timeout-micros", type=int, default=500)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"machine: {machine()}")
    if not args.skip_ann:
        ann_benchmark(args, rng)
    if args.skip_grpc and args.skip_rest and args.skip_slow:
        return
    model_base_path = serving_export(args)
    if not args.skip_grpc:
        server_benchmark(args, rng, model_base_path)
    if not args.skip_rest:
        rest_load_benchmark(args, model_base_path)
    if not args.skip_slow:
        slow_clients_benchmark(args, model_base_path)


if __name__ == "__main__":
    main()
