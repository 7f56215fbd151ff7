"""The two-tower trainer's step (`tfrs-logq train two-tower`, `compare`) against
the catalog size: 100,000 against 1,000,000 items, row-sparse `lazy-adam` (the
default) against tf-keras `adam`.

Each configuration runs in its own subprocess: a log of 2,000,000 interactions
(every item once, the rest Zipf(1.05)) over 50,000 users, split leave-one-out, then
`tfrs_logq.towers.training.train` with the trainer's defaults (batch 512 in-batch,
d 64, history 50, ``inbatch-corrected``; ``--loss mns-corrected`` adds 1,024 uniform
negatives), timed step by step from the host's view (batch drawing included) and
stopped after ``--steps`` steps, before any evaluation. Prints the median step and
the ratio of 1M to 100k items, with the machine.

Beside each step, in the same process, its roofline: the step's own kernels timed alone
on tensors of the step's shapes (the history rows gathered and averaged, the query MLP
forward and backward, the score matmul forward and its two backward matmuls, the loss's
log-sum-exp and softmax, the candidates' rows gathered, the run's optimizer's update from
the gradient of the rows a batch touches, and the host drawing the batch), each the
median of repeated calls. The step is printed as a multiple of their sum (``x
roofline``), with the biggest kernels by name. The sum is what the step's kernels cost
one after the other on this machine's TensorFlow; the step's graph may run some side by
side (below 1x); it is not the CPU's peak.

    python benchmarks/bench_towers_step.py            # ~5 min on 2 cores
    python benchmarks/bench_towers_step.py --quick    # small catalogs, seconds
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOGS = [(100_000, "lazy-adam"), (1_000_000, "lazy-adam"), (100_000, "adam"),
            (1_000_000, "adam")]
QUICK = [(2_000, "lazy-adam"), (20_000, "lazy-adam")]


class _Stop(Exception):
    pass


def one(num_items: int, optimizer: str, steps: int, loss: str, interactions: int) -> dict:
    """Times ``steps`` steps of the trainer on a catalog of ``num_items`` items."""
    import numpy as np
    from common import machine  # sets TF_USE_LEGACY_KERAS first

    from tfrs_logq.pipelines.interactions import build_interactions
    from tfrs_logq.pipelines.splits import make_split
    from tfrs_logq.towers import training
    from tfrs_logq.towers.config import TwoTowerConfig

    rng = np.random.default_rng(0)
    num_users = max(50, interactions // 40)
    rank = np.arange(1, num_items + 1, dtype=np.float64) ** -1.05
    items = np.concatenate([rng.permutation(num_items),
                            rng.choice(num_items, interactions - num_items, p=rank / rank.sum())])
    rng.shuffle(items)
    users = np.sort(rng.integers(0, num_users, len(items)))
    split = make_split(build_interactions(users, items, np.arange(len(items)),
                                          min_item_interactions=1), "loo")
    config = TwoTowerConfig(loss=loss, optimizer=optimizer, steps=steps + 1,
                                     eval_every=steps + 1)
    times = []

    def on_step(i: int) -> None:
        times.append(time.perf_counter())
        if i + 1 == steps:
            raise _Stop

    try:
        training.train(config, split, on_step=on_step)
    except _Stop:
        pass
    per_step = np.diff(times[5:])  # the first steps trace and warm up
    kernels = roofline(config, split)
    return {"num_items": split.num_items, "optimizer": optimizer, "loss": loss,
            "median_ms": 1000 * float(statistics.median(per_step)),
            "steps_timed": len(per_step), "kernels_ms": kernels,
            "roofline_ms": sum(kernels.values()), "machine": machine()}


def roofline(config, split) -> dict:
    """Median milliseconds of each of the step's kernels alone, at the step's shapes:
    the run's catalog, batch, history, embedding width and number of candidates."""
    import numpy as np
    import tensorflow as tf
    from common import time_fn

    from tfrs_logq.towers.loop import make_optimizer
    from tfrs_logq.towers.training import Examples, run_spec

    spec = run_spec(config, split.num_items)
    b, length, d = config.batch_size, config.history_length, config.embedding_dim
    candidates = b + spec.num_in_batch_negatives + spec.num_uniform_negatives
    rows = split.num_items + 1
    examples = Examples(split, length)
    batch = examples.batch(config.seed, 0, b)
    history = tf.constant(batch["history"], tf.int64)
    ids = tf.constant(np.random.default_rng(1).integers(1, rows, candidates), tf.int64)
    table = tf.Variable(tf.random.normal([rows, d], stddev=0.05))
    w1, w2 = tf.Variable(tf.random.normal([d, 2 * d])), tf.Variable(tf.random.normal([2 * d, d]))
    q, c = tf.random.normal([b, d]), tf.random.normal([candidates, d])
    scores = tf.random.normal([b, candidates])
    touched = tf.concat([tf.reshape(history, [-1]), ids], 0)
    grad = tf.IndexedSlices(tf.random.normal([int(touched.shape[0]), d], stddev=1e-3),
                            touched, tf.constant([rows, d], tf.int64))
    optimizer = make_optimizer(spec)  # the run's: row-sparse LazyAdam or tf-keras' Adam
    optimizer.build([table])

    @tf.function
    def history_rows():
        emb = tf.gather(table, history)
        is_item = tf.cast(tf.not_equal(history, 0), tf.float32)[..., None]
        return tf.reduce_sum(emb * is_item, 1) / tf.maximum(tf.reduce_sum(is_item, 1), 1.0)

    @tf.function
    def mlp():  # forward and backward: 3 matmuls a layer
        hidden = tf.nn.relu(q @ w1)
        out = hidden @ w2
        g_hidden = out @ tf.transpose(w2)
        return (tf.transpose(hidden) @ out, tf.transpose(q) @ g_hidden,
                g_hidden @ tf.transpose(w1))

    @tf.function
    def score_matmuls():  # forward, and the gradients of both sides
        s = tf.matmul(q, c, transpose_b=True)
        return s, s @ c, tf.matmul(s, q, transpose_a=True)

    @tf.function
    def loss_ops():
        lse = tf.reduce_logsumexp(scores, axis=1)
        return lse, tf.nn.softmax(scores)

    @tf.function
    def candidate_rows():
        return tf.gather(table, ids)

    @tf.function
    def update():
        optimizer.apply_gradients([(grad, table)])

    def _median_ms(fn) -> float:
        return 1000 * time_fn(fn, warmup=2, repeats=60)[0]

    return {"history gather": _median_ms(lambda: history_rows().numpy()),
            "query MLP": _median_ms(lambda: [t.numpy() for t in mlp()]),
            "score matmuls": _median_ms(lambda: [t.numpy() for t in score_matmuls()]),
            "loss ops": _median_ms(lambda: [t.numpy() for t in loss_ops()]),
            "candidate gather": _median_ms(lambda: candidate_rows().numpy()),
            # (not a dense read of the table to wait on: that copies all of it once the
            # sparse ops have put the variable in copy-on-read mode)
            "optimizer update": _median_ms(lambda: (update(), optimizer.iterations.numpy())),
            "batch drawing": _median_ms(lambda: examples.batch(config.seed, 1, b))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--loss", default="inbatch-corrected")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        num_items, optimizer = args.one.split(":")
        interactions = max(2 * int(num_items), 2_000_000 if not args.quick else 40_000)
        print(json.dumps(one(int(num_items), optimizer, args.steps, args.loss, interactions)))
        return
    rows = []
    for num_items, optimizer in QUICK if args.quick else CATALOGS:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", f"{num_items}:{optimizer}",
               "--steps", str(args.steps if not args.quick else 12), "--loss", args.loss]
        cmd += ["--quick"] if args.quick else []
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        row = rows[-1]
        biggest = sorted(row["kernels_ms"].items(), key=lambda kv: -kv[1])[:3]
        print(f"{row['num_items']:>10,} items  {optimizer:9s}  {row['median_ms']:8.1f} ms/step"
              f"  roofline {row['roofline_ms']:6.1f} ms  = "
              f"{row['median_ms'] / row['roofline_ms']:.2f}x roofline  (biggest: "
              + ", ".join(f"{k} {v:.1f}" for k, v in biggest) + ")", flush=True)
    print(f"machine: {rows[0]['machine']}; loss {args.loss}, the trainer's defaults")
    by = {(r["num_items"], r["optimizer"]): r["median_ms"] for r in rows}
    sizes = sorted({r["num_items"] for r in rows})
    for optimizer in ("lazy-adam", "adam"):
        if all((n, optimizer) in by for n in sizes):
            print(f"{optimizer}: {sizes[-1]:,} / {sizes[0]:,} items = "
                  f"{by[(sizes[-1], optimizer)] / by[(sizes[0], optimizer)]:.2f}x")


if __name__ == "__main__":
    main()
