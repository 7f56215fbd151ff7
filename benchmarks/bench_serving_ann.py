"""faiss against brute force, served: `tfrs-logq serve` under 100 concurrent gRPC clients.

For each catalog size (default 100,000 and 1,000,000 items, d = 32, clustered like learned
embeddings: `bench_serving.clustered`), two exports of one model are written: brute force
(the SavedModel's own matmul + top_k) and faiss (IVF-Flat, inner product, tuned by the
export to --target-recall at k = --k and --max-k, as `tfrs-logq export --index faiss`
tunes it). Each is served in turn by `tfrs-logq serve` in its own process on loopback, and
--clients gRPC clients (threads of this process, the official stub) send `top_k` requests
(one history of --history items, k = --k, history excluded) until --requests are answered
or --seconds have passed, whichever is first. Reported per size and index: requests/s,
p50/p99 latency, and recall@k of the served answers against the exact top-k (numpy, the
history excluded) on up to --recall-sample of them; and the recall the export measured.

The model is a mean-of-history encoder (the query is the mean of the history's item
embeddings), so the exact answer is computed here from the same numbers the server holds.
Nothing leaves the machine: the server binds 127.0.0.1.

    python benchmarks/bench_serving_ann.py                       # 100k and 1M
    python benchmarks/bench_serving_ann.py --sizes 100000 300000 --requests 2000 \\
        --out results/serving-ann/rows.jsonl
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np
import tensorflow as tf  # noqa: E402
from bench_serving import clustered
from common import machine

from tfrs_logq.serving.export import RetrievalModule, export_version  # noqa: E402
from tfrs_logq.serving.scann_tuning import recall_at_k  # noqa: E402


class MeanEncoder(tf.Module):
    """The query is the mean of the history's item embeddings (row 0: padding, zero)."""

    def __init__(self, items: np.ndarray, max_length: int) -> None:
        super().__init__(name="mean_encoder")
        self.max_length = max_length
        table = np.concatenate([np.zeros((1, items.shape[1]), np.float32), items])
        self.table = tf.Variable(table, trainable=False, name="item_embeddings")

    def item_embeddings(self):
        return self.table

    def last_query(self, history, training=False):
        rows = tf.gather(self.table, history)
        count = tf.reduce_sum(tf.cast(history > 0, tf.float32), axis=1, keepdims=True)
        return tf.reduce_sum(rows, axis=1) / tf.maximum(count, 1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(base: str, timeout_s: float = 600):
    """`tfrs-logq serve` on ``base`` in its own process; returns it and its gRPC port once
    KServe V2's /v2/health/ready says so."""
    port, rest = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfrs_logq.cli", "serve", "--model_name", "bench",
         "--model_base_path", base, "--port", str(port), "--rest_api_port", str(rest)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{rest}/v2/health/ready",
                                        timeout=5) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("the server was not ready in time")


def load(port: int, histories: np.ndarray, k: int, clients: int, total: int,
         seconds: float):
    """``clients`` threads send top_k requests until ``total`` are answered or ``seconds``
    pass; returns (answered, elapsed s, latencies s, {request index: item ids})."""
    from tfrs_logq.serving.client import make_request, predict_stub

    stub, channel = predict_stub(f"127.0.0.1:{port}")
    requests = []
    for h in histories:
        requests.append(make_request("bench", h[None, :].astype(np.int64), k=k))
    for r in requests[:20]:  # warm-up (traces, first batches)
        stub.Predict(r, timeout=120)
    lock, latencies, answers, errors = threading.Lock(), [], {}, []
    next_index = [0]
    stop_at = time.monotonic() + seconds

    def worker():
        while time.monotonic() < stop_at:
            with lock:
                i = next_index[0]
                if i >= total:
                    return
                next_index[0] += 1
            t0 = time.perf_counter()
            try:
                reply = stub.Predict(requests[i % len(requests)], timeout=120)
            except Exception as exc:  # counted, reported
                with lock:
                    errors.append(repr(exc)[:200])
                continue
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                answers[i] = tf.make_ndarray(reply.outputs["item_ids"])[0]

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    channel.close()
    return len(latencies), elapsed, sorted(latencies), answers, errors


def exact_excluding(items, histories, raw_ids, k):
    """The exact top-k raw ids of each mean-of-history query, its history left out."""
    out = []
    for h in histories:
        rows = h[h > 0] - raw_ids[0]
        q = items[rows].mean(axis=0)
        scores = items @ q
        scores[rows] = -np.inf
        top = np.argpartition(-scores, k)[:k]
        out.append(raw_ids[top[np.argsort(-scores[top], kind="stable")]])
    return np.stack(out)


def run_size(n, args, rng, out):
    items = clustered(n, args.dim, rng)
    raw_ids = np.arange(1, n + 1)
    encoder = MeanEncoder(items, args.history)
    histories = raw_ids[rng.integers(0, n, (max(args.requests, 1), args.history))]
    tuning_histories = rng.integers(1, n + 1, (args.tuning_queries, args.history))
    tuning_queries = encoder.last_query(tf.constant(tuning_histories, tf.int32)).numpy()
    root = tempfile.mkdtemp(prefix="bench-serving-ann-")
    exports = {}
    for index in ("brute-force", "faiss"):
        t0 = time.perf_counter()
        module = RetrievalModule(encoder, raw_ids, index, default_k=args.k, max_k=args.max_k,
                                 target_recall=args.target_recall,
                                 tuning_queries=tuning_queries if index == "faiss" else None,
                                 queries_source="random histories (mean of their items)")
        exports[index] = export_version("", os.path.join(root, index), index=index,
                                        module=module)
        print(f"{n:,} items: {index} export in {time.perf_counter() - t0:.0f} s", flush=True)
    sample = min(args.recall_sample, len(histories))
    exact = None
    for index, path in exports.items():
        meta = json.load(open(os.path.join(path, "assets", "export.json")))
        proc, port = serve(os.path.dirname(path))
        try:
            answered, elapsed, lat, answers, errors = load(
                port, histories, args.k, args.clients, args.requests, args.seconds)
        finally:
            proc.terminate()
            proc.wait(60)
        served = sorted(i for i in answers if i < sample)
        if exact is None:
            exact = exact_excluding(items, histories[:sample], raw_ids, args.k)
        recall = recall_at_k(np.stack([answers[i] for i in served]), exact[served]) \
            if served else float("nan")
        row = {"num_items": n, "dim": args.dim, "index": index, "k": args.k,
               "clients": args.clients, "answered": answered, "errors": len(errors),
               "seconds": round(elapsed, 1), "qps": round(answered / elapsed, 1),
               "p50_ms": round(statistics.median(lat) * 1e3, 1) if lat else None,
               "p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1e3, 1) if lat else None,
               "served_recall": round(recall, 4), "recall_queries": len(served),
               "export_recall": (meta.get("faiss_tuning") or {}).get("recall"),
               "faiss": {k: meta["faiss"][k] for k in ("nlist", "tuned")}
               if meta.get("faiss") else None}
        print(json.dumps(row), flush=True)
        out.append(row)
        if errors:
            print(f"  first error: {errors[0]}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--history", type=int, default=20)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--max-k", type=int, default=1000)
    p.add_argument("--target-recall", type=float, default=0.95)
    p.add_argument("--tuning-queries", type=int, default=1000)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--requests", type=int, default=3000, help="at most this many per run")
    p.add_argument("--seconds", type=float, default=90, help="at most this long per run")
    p.add_argument("--recall-sample", type=int, default=1000)
    p.add_argument("--out", default=None, help="write the rows here (JSON lines)")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = {"machine": machine(), "load_average_at_start": os.getloadavg(),
              "date": started}
    print(json.dumps(header), flush=True)
    rows: list = []
    for n in args.sizes:
        run_size(n, args, rng, rows)
    header["load_average_at_end"] = os.getloadavg()
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(json.dumps(header) + "\n")
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print("| items | index | answered | QPS | p50 ms | p99 ms | served recall@k | "
          "export recall@k |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['num_items']:,} | {r['index']} | {r['answered']} | {r['qps']:.0f} | "
              f"{r['p50_ms']} | {r['p99_ms']} | {r['served_recall']:.3f} | "
              f"{r['export_recall'] or 'exact'} |")


if __name__ == "__main__":
    main()
