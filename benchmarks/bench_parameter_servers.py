"""An item table split over parameter servers against one device: a two-tower `tfrs.Model`
(a query tower over the history, an item `tf.keras.layers.Embedding`, as TFRS's tutorials
write it) trained with `CorrectedRetrieval("corrected")` and an `ExactFrequency` Q through
`model.fit`, for the same number of steps of the same batch size,

- *one device*: the default strategy (the baseline, measured in the same run);
- *parameter servers*: `tf.distribute.ParameterServerStrategy`, 2 workers and 2 parameter
  servers on loopback ports in one process (a `ClusterCoordinator` under `model.fit`, fed
  by a `DatasetCreator`), the item table, the query embedding, their optimizer slots and
  the counts split by `MinSizePartitioner` over both servers.

Printed: ms per step and examples per second after the first epoch (tracing and the
cluster's start left out), their ratio to one device, and Recall@10 of the trained towers
on held-out users (full catalog, brute force) after the fixed budget. Under the
parameter servers each worker runs whole steps asynchronously (its own batch's negatives,
its own reads of the tables): the recall measures what that costs at the same budget.

Each variant runs in its own process (a `ParameterServerStrategy` takes over its process's
eager context). On 2 shared cores the workers, servers and coordinator share the cores:
the ratio measures the strategy's overhead (gRPC, the coordinator's scheduling, the split
variables), not a speed-up, which needs machines.

    python benchmarks/bench_parameter_servers.py            # ~3 min on 2 cores
    python benchmarks/bench_parameter_servers.py --quick    # under a minute
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_WORKERS = NUM_PS = 2
HISTORY = 10


def make_data(num_items: int, num_examples: int, seed: int):
    """``(histories [N, HISTORY], targets [N])``, internal ids 1..num_items: 16 tastes, Zipf
    popularity within each; a user's history and target drawn from one taste."""
    import numpy as np

    rng = np.random.default_rng(seed)
    tastes = 16
    per = num_items // tastes
    popularity = 1.0 / np.arange(1, per + 1) ** 1.05
    popularity /= popularity.sum()
    taste = rng.integers(0, tastes, num_examples)
    items = 1 + taste[:, None] * per + rng.choice(per, (num_examples, HISTORY + 1),
                                                  p=popularity)
    return items[:, :HISTORY].astype(np.int64), items[:, HISTORY].astype(np.int64)


def one(kind: str, num_items: int, dim: int, batch: int, epochs: int,
        steps_per_epoch: int) -> dict:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf
    import tensorflow_recommenders as tfrs
    from common import machine

    import tfrs_logq
    from tfrs_logq._util.strategy import loopback_cluster

    if kind == "parameter-servers":
        resolver, _servers = loopback_cluster(NUM_WORKERS, NUM_PS)
        strategy = tf.distribute.ParameterServerStrategy(
            resolver,
            variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
                min_shard_bytes=256 << 10, max_shards=NUM_PS))
    else:
        strategy = tf.distribute.get_strategy()
    num_train = epochs * steps_per_epoch * batch
    histories, targets = make_data(num_items, num_train + 2_000, seed=0)

    class TwoTower(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.query_model = tf.keras.Sequential([
                tf.keras.layers.Embedding(num_items + 1, dim, mask_zero=True),
                tf.keras.layers.GlobalAveragePooling1D(),
                tf.keras.layers.Dense(dim)])
            self.candidate_model = tf.keras.layers.Embedding(num_items + 1, dim)
            self.frequency = tfrs_logq.ExactFrequency(num_items + 1)
            self.task = tfrs_logq.CorrectedRetrieval(correction="corrected")

        def compute_loss(self, features, training=False):
            item_ids = features["item_id"]
            if training:
                self.frequency.update(item_ids)
            return self.task(
                self.query_model(features["history"]), self.candidate_model(item_ids),
                candidate_ids=item_ids,
                candidate_sampling_probability=self.frequency.probability(item_ids))

    tf.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = TwoTower()
        model.query_model.build((None, HISTORY))
        model.candidate_model.build((None,))
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.2))

    train = {"history": histories[:num_train], "item_id": targets[:num_train]}

    def dataset_fn(context=None):
        data = tf.data.Dataset.from_tensor_slices(train)
        if context is not None:
            data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        # Unseeded: each worker (its own pipeline, `num_input_pipelines == 1`) draws its own
        # order, so the two do not train on the same batches.
        return data.repeat().shuffle(16_384).batch(batch).prefetch(2)

    data = (tf.keras.utils.experimental.DatasetCreator(dataset_fn)
            if kind == "parameter-servers" else dataset_fn())
    ends = []
    model.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0,
              callbacks=[tf.keras.callbacks.LambdaCallback(
                  on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()))])
    ms = 1000 * (ends[-1] - ends[0]) / ((epochs - 1) * steps_per_epoch)

    query_table = tf.convert_to_tensor(model.query_model.layers[0].embeddings).numpy()
    dense = model.query_model.layers[2]
    kernel, bias = (tf.convert_to_tensor(v).numpy() for v in (dense.kernel, dense.bias))
    items = tf.convert_to_tensor(model.candidate_model.embeddings).numpy()
    test_h, test_t = histories[num_train:], targets[num_train:]
    queries = query_table[test_h].mean(axis=1) @ kernel + bias  # no padding in the history
    scores = queries @ items[1:].T
    top = np.argpartition(-scores, 10, axis=1)[:, :10] + 1
    recall = float(np.mean((top == test_t[:, None]).any(axis=1)))
    return {"kind": kind, "machine": machine(), "ms": ms, "examples_per_s": batch / ms * 1000,
            "recall@10": recall, "steps": int(model.optimizer.iterations.numpy()),
            "frequency_total": float(model.frequency.total.numpy())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.items, args.epochs, args.steps_per_epoch = 10_000, 3, 10
    sizes = [str(args.items), str(args.dim), str(args.batch), str(args.epochs),
             str(args.steps_per_epoch)]
    if args.one:
        print(json.dumps(one(args.one, *map(int, sizes))))
        return
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    for kind in ("one-device", "parameter-servers"):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", kind,
                              "--items", sizes[0], "--dim", sizes[1], "--batch", sizes[2],
                              "--epochs", sizes[3], "--steps-per-epoch", sizes[4]],
                             capture_output=True, text=True, cwd=HERE, env=env)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]
    print(f"machine: {base['machine']}; started {started}, load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    print(f"corrected, {args.items:,} items, d {args.dim}, batch {args.batch} a step, "
          f"{args.epochs} x {args.steps_per_epoch} steps (first epoch not timed)")
    print("variant | ms/step | examples/s | vs one device | Recall@10 | steps | Q's total")
    for r in rows:
        print(f"{r['kind']} | {r['ms']:.1f} | {r['examples_per_s']:,.0f} | "
              f"{base['ms'] / r['ms']:.2f}x | {r['recall@10']:.4f} | {r['steps']} | "
              f"{r['frequency_total']:,.0f}")


if __name__ == "__main__":
    main()
