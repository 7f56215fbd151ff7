"""Keras 3 (keras_logq on JAX, PyTorch, TensorFlow) against the TFRS path (tfrs_logq), same run.

The same batches of tfrs_logq's synthetic stream (pipelines/synthetic.py) train the same
two-tower model (user and item embeddings, L2-normalised, temperature 0.1, Adam 0.01,
in-batch negatives, the corrected loss with accidental hits removed, exact item counts for
log Q updated as it trains) through:

- TFRS: `tfrs.Model` + `tfrs_logq.CorrectedRetrieval` + `tfrs_logq.ExactFrequency` (tf-keras);
- Keras 3: `keras-logq/examples/two_tower.py`'s `TwoTower` (`keras_logq.CorrectedRetrieval`,
  `keras_logq.ItemFrequency`) under `model.fit`, one process per backend (JAX and PyTorch
  from .venv-keras, TensorFlow from this environment).

Prints Recall@k of held-out stream examples over the whole catalog, and the median step
time after the first 10 steps (compilation excluded), with its ratio to TFRS's.

    .venv/bin/python benchmarks/bench_keras3.py --steps 300

On a busy machine set OMP_NUM_THREADS=1: PyTorch's OpenMP threads spin when the cores
are shared, and its step time then says more about the load than about the code.
Measured here (2 cores shared, load average about 10; 200 steps of 256, V=2000, one seed;
OMP_NUM_THREADS=1): Recall@50 TFRS 0.580, JAX 0.586, PyTorch 0.575, Keras-3-on-TF 0.589
(s.e. about 0.008 each); ms/step TFRS 5.98, JAX 1.56 (0.26x), PyTorch 20.2 (3.4x),
Keras-3-on-TF 4.62 (0.77x). Without OMP_NUM_THREADS=1 PyTorch took 528 ms/step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "keras-logq", "examples", "two_tower.py")


def _step_timer(base):
    class StepTimes(base):
        def __init__(self):
            super().__init__()
            self.times, self._t = [], None

        def on_train_batch_begin(self, batch, logs=None):
            self._t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self._t)

    return StepTimes()


def recall_at_k(queries, items, targets, k):
    """Recall@k of 1-based ``targets`` over the whole catalog (``items`` row ``i`` is item
    ``i + 1``; row 0 of the tables is padding), by `tfrs_logq.metrics`' ranks and
    formulas. Computed in this process for every backend: a Keras 3 worker saves its
    embeddings instead (its environment has no tfrs_logq, and importing it would select
    tf-keras in a Keras-3-on-TensorFlow process)."""
    from tfrs_logq.metrics import recall_ndcg_from_ranks, target_ranks

    ranks = target_ranks(queries, items, np.asarray(targets, np.int64) - 1, padding_id=None)
    return recall_ndcg_from_ranks(ranks, (k,))[f"recall@{k}"]


def make_data(args, path):
    import tfrs_logq  # noqa: F401  (tf-keras before TensorFlow)
    from tfrs_logq.pipelines.synthetic import SyntheticStream

    stream = SyntheticStream(num_items=args.synthetic_items, num_users=args.synthetic_users,
                             num_topics=args.num_topics, seed=args.seed)
    train = list(stream.dataset(args.batch_size, args.steps).as_numpy_iterator())
    test = list(stream.dataset(args.num_test, 1, start_batch=10**9).as_numpy_iterator())[0]
    np.savez(path, user=np.concatenate([b["user_id"] for b in train]).astype("int32"),
             item=np.concatenate([b["target"] for b in train]).astype("int32"),
             test_user=test["user_id"].astype("int32"), test_item=test["target"].astype("int32"))


def run_tfrs(args, data):
    import tensorflow as tf
    import tensorflow_recommenders as tfrs

    import tfrs_logq

    tf.keras.utils.set_random_seed(args.seed)
    init = lambda: tf.keras.initializers.RandomNormal(stddev=0.1)  # noqa: E731  (one each)

    class TwoTower(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.user_tower = tf.keras.layers.Embedding(args.synthetic_users, args.dim,
                                                        embeddings_initializer=init())
            self.item_tower = tf.keras.layers.Embedding(args.synthetic_items + 1, args.dim,
                                                        embeddings_initializer=init())
            self.frequency = tfrs_logq.ExactFrequency(args.synthetic_items + 1)
            self.task = tfrs_logq.CorrectedRetrieval(correction=args.loss,
                                                     temperature=args.temperature,
                                                     reduction="sum_over_batch_size")

        def compute_loss(self, features, training=False):
            users, items = features["user"], features["item"]
            if training:
                self.frequency.update(items)
            return self.task(tf.math.l2_normalize(self.user_tower(users), -1),
                             tf.math.l2_normalize(self.item_tower(items), -1),
                             candidate_ids=items,
                             candidate_log_sampling_probability=self.frequency.log_q(items),
                             compute_metrics=False)

    model = TwoTower()
    model.compile(optimizer=tf.keras.optimizers.Adam(args.learning_rate))
    ds = tf.data.Dataset.from_tensor_slices({"user": data["user"], "item": data["item"]})
    timer = _step_timer(tf.keras.callbacks.Callback)
    model.fit(ds.batch(args.batch_size), epochs=1, verbose=0, callbacks=[timer])
    queries = tf.math.l2_normalize(model.user_tower(data["test_user"]), -1).numpy()
    items = tf.math.l2_normalize(model.item_tower.embeddings[1:], -1).numpy()
    return {"path": "TFRS (tf-keras)", "backend": "tensorflow",
            "recall": recall_at_k(queries, items, data["test_item"], args.k),
            "step_s": float(np.median(timer.times[10:]))}


def keras_worker(args):
    """In a child process: train the example's TwoTower on the saved batches."""
    import importlib.util

    import keras

    spec = importlib.util.spec_from_file_location("two_tower_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data = np.load(args.keras_worker)
    keras.utils.set_random_seed(args.seed)
    model = example.TwoTower(args.synthetic_users, args.synthetic_items, dim=args.dim,
                             correction=args.loss, temperature=args.temperature)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate))
    model.build()
    timer = _step_timer(keras.callbacks.Callback)
    model.fit({"user": data["user"], "item": data["item"]}, batch_size=args.batch_size,
              epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    embeddings = f"{args.keras_worker}.{keras.backend.backend()}.npz"
    np.savez(embeddings,
             queries=keras.ops.convert_to_numpy(model.query_embeddings(data["test_user"])),
             items=keras.ops.convert_to_numpy(model.item_embeddings()))
    print(json.dumps({"path": "Keras 3 (keras_logq)", "backend": keras.backend.backend(),
                      "embeddings": embeddings, "step_s": float(np.median(timer.times[10:]))}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--synthetic-items", type=int, default=2000)
    p.add_argument("--synthetic-users", type=int, default=2000)
    p.add_argument("--num-topics", type=int, default=20)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.1)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--loss", default="corrected",
                   help="in-batch sampled softmax with this correction")
    p.add_argument("--num-test", type=int, default=4000)
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    p.add_argument("--keras-python", default=os.path.join(ROOT, ".venv-keras", "bin", "python"),
                   help="python with keras, jax and torch (make install creates it)")
    p.add_argument("--keras-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.keras_worker:
        return keras_worker(args)
    tmp = tempfile.mkdtemp(prefix="bench_keras3-")
    path = os.path.join(tmp, "data.npz")
    make_data(args, path)
    rows = [run_tfrs(args, np.load(path))]
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    for backend in args.backends:
        python = sys.executable if backend == "tensorflow" else args.keras_python
        env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
        env["KERAS_BACKEND"] = backend
        proc = subprocess.run([python, __file__, *passthrough, "--keras-worker", path],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"{backend}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(row.pop("embeddings")) as saved:
            row["recall"] = recall_at_k(saved["queries"], saved["items"],
                                        np.load(path)["test_item"], args.k)
        rows.append(row)
    base = rows[0]["step_s"]
    print(f"{args.steps} steps of {args.batch_size}, V={args.synthetic_items}, "
          f"correction={args.loss}, Recall@{args.k} on {args.num_test} held-out examples")
    print(f"{'path':<22} {'backend':<11} {'Recall@' + str(args.k):>10} {'ms/step':>9} "
          f"{'vs TFRS':>8}")
    for r in rows:
        print(f"{r['path']:<22} {r['backend']:<11} {r['recall']:>10.4f} "
              f"{1000 * r['step_s']:>9.2f} {r['step_s'] / base:>8.2f}")
    return rows


if __name__ == "__main__":
    main()
