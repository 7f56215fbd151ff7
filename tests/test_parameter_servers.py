"""An item table sharded over parameter servers: a two-tower `tfrs.Model` (a query tower and
an item `tf.keras.layers.Embedding`, as TFRS's tutorials write it) trained with
`CorrectedRetrieval(correction="corrected")` through `model.fit` under
`tf.distribute.ParameterServerStrategy` (a `ClusterCoordinator` under `model.fit`, fed by a
`DatasetCreator`), on a cluster of 2 workers and 2 parameter servers in one process
(`tf.distribute.Server`s on free loopback ports, as TF's tutorial builds one), the strategy's
`MinSizePartitioner` splitting the item table, the query tower's embedding and the
frequency counts over both servers.

Checked: the training loss (and the full-softmax loss over the catalog, of the towers
after each epoch) goes down; each server holds its part of each split table; the `Q` fed to
the task comes from an `ExactFrequency` created under the strategy's scope and updated in
the training step, and after training its counts are exact: the total is the examples
trained on and every id's count is `np.bincount` of the ids the two workers consumed (a
`CountMinSketch` updated alongside holds the one-process sketch of the same ids); under
heavier contention (the two workers adding 200,000 ids per step to the same 16 cells) both
estimators still lose nothing, where `Variable.scatter_add` can (reported, not asserted:
how many it loses depends on the machine's scheduling; written with it, the estimators
lost additions in each of 3 runs); the trained towers, the table read
back as one, go through the export (`serving.export.RetrievalModule`, `export_version`) and
the SavedModel's top-k is the brute-force numpy top-k of the trained towers.

The cluster runs in a child interpreter (this file run as a script, bounded in time and
killed past it, its servers with it): a `ParameterServerStrategy` connects its process's
eager context to the cluster, kept out of the test process, whose other tests run on two
logical CPUs and a `MirroredStrategy`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

NUM_ITEMS = 1000  # internal ids 1..NUM_ITEMS; row 0 of the tables is the padding
RAW_OFFSET = 500_000  # the dataset's own item ids: internal id + RAW_OFFSET
DIM = 16
HISTORY = 5
BATCH = 64  # per step (each worker runs whole steps: one replica per worker)
EPOCHS = 6
STEPS_PER_EPOCH = 16
# Each worker reads the dataset from its start (below): as many examples as all the steps
# take, so that no worker's stream wraps around and the two workers' shares of the steps
# show in the counts.
NUM_EXAMPLES = EPOCHS * STEPS_PER_EPOCH * BATCH
NUM_WORKERS = NUM_PS = 2
# Splits a variable of at least 2 x 2 KiB over both servers: the item table (1001 x 16
# float32, 62.6 KiB), the query tower's embedding (likewise), their Adagrad slots and the
# counts (1001 float64, 7.8 KiB); the Dense layer (1 KiB) and the sketch (1 KiB) stay whole.
MIN_SHARD_BYTES = 2048
SKETCH = {"depth": 2, "width": 64, "seed": 3}
STRESS_IDS, STRESS_STEPS, STRESS_CELLS = 200_000, 30, 16
DEFAULT_K = 10
CHILD_TIMEOUT_S = 420


def make_data(seed: int = 0):
    """``(histories [N, HISTORY], targets [N])`` in internal ids: 4 clusters of taste, Zipf
    popularity within each, a user's history and target from one cluster."""
    rng = np.random.default_rng(seed)
    per = NUM_ITEMS // 4
    popularity = 1.0 / np.arange(1, per + 1) ** 1.1
    popularity /= popularity.sum()
    clusters = rng.integers(0, 4, NUM_EXAMPLES)
    draws = rng.choice(per, size=(NUM_EXAMPLES, HISTORY + 1), p=popularity)
    items = (1 + clusters[:, None] * per + draws).astype(np.int64)
    return items[:, :HISTORY], items[:, HISTORY]


def worker_batches(targets: np.ndarray, num_batches: int) -> np.ndarray:
    """`[num_batches, BATCH]`: the target ids of the first ``num_batches`` batches a worker
    reads. `model.fit` under `ParameterServerStrategy` gives every worker's ``dataset_fn``
    one input pipeline (``num_input_pipelines == 1``, checked): each worker reads the whole
    dataset, in order, from its start (``repeat().batch(BATCH)``)."""
    return targets[:num_batches * BATCH].reshape(num_batches, BATCH)


# --------------------------------------------------------------------------------------
# The child: the cluster, the training, the export. Writes what it saw into `out`.


def _child(out: str) -> None:
    import tfrs_logq  # noqa: I001 (first: selects tf-keras)

    import tensorflow as tf
    import tensorflow_recommenders as tfrs

    from tfrs_logq._util.strategy import loopback_cluster
    from tfrs_logq.serving.export import RetrievalModule, export_version

    timings = {}
    start = time.monotonic()
    resolver, _servers = loopback_cluster(NUM_WORKERS, NUM_PS)
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=MIN_SHARD_BYTES, max_shards=NUM_PS))
    histories, targets = make_data()

    class TwoTower(tfrs.Model):
        def __init__(self):
            super().__init__()
            self.query_model = tf.keras.Sequential([
                tf.keras.layers.Embedding(NUM_ITEMS + 1, DIM, mask_zero=True),
                tf.keras.layers.GlobalAveragePooling1D(),
                tf.keras.layers.Dense(DIM)])
            self.candidate_model = tf.keras.layers.Embedding(NUM_ITEMS + 1, DIM)
            self.frequency = tfrs_logq.ExactFrequency(NUM_ITEMS + 1)
            self.sketch = tfrs_logq.CountMinSketch(**SKETCH)
            self.task = tfrs_logq.CorrectedRetrieval(correction="corrected")

        def compute_loss(self, features, training=False):
            item_ids = features["item_id"]
            if training:  # Q is the stream's: updated with the step's ids, then read
                self.frequency.update(item_ids)
                self.sketch.update(item_ids)
            return self.task(
                self.query_model(features["history"]),
                self.candidate_model(item_ids),
                candidate_ids=item_ids,
                candidate_sampling_probability=self.frequency.probability(item_ids))

    with strategy.scope():
        model = TwoTower()
        model.query_model.build((None, HISTORY))  # the variables, now: to place and read
        model.candidate_model.build((None,))
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.5))

    contexts = []

    def _dataset_fn(context):  # as TF's tutorial writes it (a no-op shard here: one pipeline)
        contexts.append([context.num_input_pipelines, context.input_pipeline_id])
        data = tf.data.Dataset.from_tensor_slices({"history": histories, "item_id": targets})
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
        return data.repeat().batch(context.get_per_replica_batch_size(BATCH)).prefetch(2)

    tower_variables = {
        "query_embedding": model.query_model.layers[0].embeddings,
        "dense_kernel": model.query_model.layers[2].kernel,
        "dense_bias": model.query_model.layers[2].bias,
        "item_table": model.candidate_model.embeddings}
    snapshots = []

    def _snapshot():  # the coordinator reads the servers' variables; each one table
        snapshots.append({name: tf.convert_to_tensor(v).numpy()
                          for name, v in tower_variables.items()})

    timings["cluster_s"] = time.monotonic() - start
    history = model.fit(
        tf.keras.utils.experimental.DatasetCreator(_dataset_fn), epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH, verbose=0,
        callbacks=[tf.keras.callbacks.LambdaCallback(
            on_train_begin=lambda logs: _snapshot(),
            on_epoch_end=lambda epoch, logs: _snapshot())])
    timings["fit_s"] = time.monotonic() - start - timings["cluster_s"]

    def _placement(variable):
        parts = getattr(variable, "variables", [variable])
        return [{"device": v.device, "shape": v.shape.as_list()} for v in parts]

    record = {
        "loss": history.history["loss"],
        "input_contexts": contexts,
        "iterations": int(model.optimizer.iterations.numpy()),
        "sharded": {name: isinstance(v, tf.__internal__.distribute.ShardedVariable)
                    for name, v in {**tower_variables, "counts": model.frequency.counts,
                                    "sketch": model.sketch.counters}.items()},
        "placement": {name: _placement(v) for name, v in {
            **tower_variables, "counts": model.frequency.counts,
            "total": model.frequency.total, "sketch": model.sketch.counters}.items()},
        "total": float(model.frequency.total.numpy()),
        "sketch_total": float(model.sketch.total.numpy()),
    }
    arrays = {"counts": tf.convert_to_tensor(model.frequency.counts).numpy(),
              "sketch": tf.convert_to_tensor(model.sketch.counters).numpy(),
              "count_read": model.frequency.count(tf.range(NUM_ITEMS + 1)).numpy(),
              "probability": model.frequency.probability(tf.constant([0, 1, 7, 999])).numpy()}
    for name in tower_variables:
        arrays[f"shards_{name}"] = np.concatenate(
            [v.numpy() for v in getattr(tower_variables[name], "variables",
                                        [tower_variables[name]])])
    for epoch, snapshot in enumerate(snapshots):
        for name, value in snapshot.items():
            arrays[f"epoch{epoch}_{name}"] = value

    # Heavier contention: both workers add STRESS_IDS ids per step to the same few cells.
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # model.fit's
    with strategy.scope():
        stressed = {"exact": tfrs_logq.ExactFrequency(NUM_ITEMS + 1),
                    "sketch": tfrs_logq.CountMinSketch(**SKETCH),
                    "scatter_add": tf.Variable(tf.zeros([NUM_ITEMS + 1], tf.float64))}

    # Half the cells in each shard of the counts.
    cells = tf.constant(np.r_[1:1 + STRESS_CELLS // 2,
                              NUM_ITEMS + 1 - STRESS_CELLS // 2:NUM_ITEMS + 1], tf.int64)

    def _stress(update):  # STRESS_STEPS steps of STRESS_IDS ids, on both workers at once
        @tf.function
        def step():
            def add():
                update(tf.gather(cells, tf.random.uniform([STRESS_IDS], 0, STRESS_CELLS,
                                                          tf.int64)))
            strategy.run(add)

        for _ in range(STRESS_STEPS):
            coordinator.schedule(step)
        coordinator.join()

    _stress(stressed["exact"].update)
    _stress(stressed["sketch"].update)
    _stress(lambda ids: stressed["scatter_add"].scatter_add(
        tf.IndexedSlices(tf.ones_like(ids, tf.float64), ids)))
    exact, sketch = stressed["exact"], stressed["sketch"]
    record["stress"] = {
        "sharded_counts": isinstance(exact.counts, tf.__internal__.distribute.ShardedVariable),
        "exact_total": float(exact.total.numpy()),
        "exact_counts": float(tf.reduce_sum(tf.convert_to_tensor(exact.counts)).numpy()),
        "sketch_total": float(sketch.total.numpy()),
        "sketch_rows": tf.reduce_sum(tf.reshape(tf.convert_to_tensor(sketch.counters),
                                                [SKETCH["depth"], -1]), 1).numpy().tolist(),
        "scatter_add": float(tf.reduce_sum(
            tf.convert_to_tensor(stressed["scatter_add"])).numpy()),
    }
    timings["stress_s"] = time.monotonic() - start - timings["cluster_s"] - timings["fit_s"]

    # The export: the trained towers as `RetrievalModule` reads an encoder.
    class Encoder(tf.Module):
        def __init__(self, query_model):
            super().__init__(name="two_tower")
            self.query_model = query_model
            self.max_length = HISTORY

        def last_query(self, history, training=False):
            return self.query_model(tf.cast(history, tf.int64), training=training)

        def item_embeddings(self):  # `[V + 1, d]`, row 0 the padding: one table, read back
            return tf.convert_to_tensor(model.candidate_model.embeddings)

    raw_ids = np.arange(1, NUM_ITEMS + 1, dtype=np.int64) + RAW_OFFSET
    module = RetrievalModule(Encoder(model.query_model), raw_ids, "brute-force", DEFAULT_K)
    record["export"] = export_version(os.path.join(out, "model"), os.path.join(out, "export"),
                                      module=module, index="brute-force",
                                      default_k=DEFAULT_K)
    timings["export_s"] = (time.monotonic() - start - timings["cluster_s"] - timings["fit_s"]
                           - timings["stress_s"])
    record["timings"] = timings
    np.savez(os.path.join(out, "arrays.npz"), **arrays)
    with open(os.path.join(out, "record.json"), "w") as f:
        json.dump(record, f, indent=1)


# --------------------------------------------------------------------------------------
# The tests: one cluster run, read by each.


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("parameter_servers"))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_USE_LEGACY_KERAS": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), out], env=env,
                              capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
        pytest.fail(f"the cluster run took over {CHILD_TIMEOUT_S} s:\n{str(exc.stderr)[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-6000:]
    with open(os.path.join(out, "record.json")) as f:
        record = json.load(f)
    record["wall_s"] = time.monotonic() - started
    arrays = dict(np.load(os.path.join(out, "arrays.npz")))
    return record, arrays


def _full_softmax_loss(weights, histories, targets):
    """Mean cross-entropy of the target over the whole catalog (items 1..V), of the towers'
    weights: what the sampled loss stands in for."""
    queries = _queries(weights, histories)
    scores = queries @ weights["item_table"][1:].T.astype(np.float64)
    scores -= scores.max(1, keepdims=True)
    log_z = np.log(np.exp(scores).sum(1))
    return float(np.mean(log_z - scores[np.arange(len(targets)), targets - 1]))


def _queries(weights, histories):
    """The query tower in numpy: the mean of the history's (non-padding) embeddings, then
    the Dense layer."""
    table = weights["query_embedding"].astype(np.float64)
    mask = (histories > 0)[..., None]
    mean = (table[histories] * mask).sum(1) / mask.sum(1)
    return mean @ weights["dense_kernel"].astype(np.float64) + weights["dense_bias"]


def test_training_runs_and_the_loss_goes_down(run):
    record, arrays = run
    histories, targets = make_data()
    assert record["iterations"] == EPOCHS * STEPS_PER_EPOCH
    loss = record["loss"]
    assert len(loss) == EPOCHS and np.isfinite(loss).all()
    assert loss[-1] < loss[0], loss  # the epoch means (each epoch other examples: noisy)
    full = [_full_softmax_loss({name: arrays[f"epoch{e}_{name}"] for name in
                                ("query_embedding", "dense_kernel", "dense_bias", "item_table")},
                               histories, targets) for e in range(EPOCHS + 1)]
    assert full[-1] < full[0] - 0.3, full  # log(1000) = 6.9 at the start
    # Not monotone: two workers apply stale gradients in an order the scheduler picks (one
    # run measured 6.91, 12.62, 5.15, 4.71, 4.49, 4.32); from the second half on, every
    # epoch is below the start.
    assert all(value < full[0] for value in full[len(full) // 2:]), full


def test_each_parameter_server_holds_its_part_of_each_split_table(run):
    record, arrays = run
    servers = {f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(NUM_PS)}
    for name, rows in (("item_table", NUM_ITEMS + 1), ("query_embedding", NUM_ITEMS + 1),
                       ("counts", NUM_ITEMS + 1)):
        assert record["sharded"][name], name
        parts = record["placement"][name]
        assert {p["device"] for p in parts} == servers, parts
        assert len(parts) == NUM_PS
        assert sum(p["shape"][0] for p in parts) == rows
        assert all(p["shape"][1:] == ([DIM] if name != "counts" else []) for p in parts)
    for name in ("dense_kernel", "dense_bias", "total", "sketch"):  # small: whole, on one
        assert not record["sharded"].get(name, False), name
        assert [p["device"] in servers for p in record["placement"][name]] == [True]
    # Read back as one table: the shards, in order, are the table (the trained one).
    for name in ("item_table", "query_embedding"):
        np.testing.assert_array_equal(arrays[f"shards_{name}"], arrays[f"epoch{EPOCHS}_{name}"])


def _consumed_split(counts, targets):
    """Every ``(steps of one worker, steps of the other)`` whose ids' bincount (each worker
    consuming its stream in order) equals ``counts``."""
    steps = EPOCHS * STEPS_PER_EPOCH
    cumulative = np.concatenate([np.zeros((1, NUM_ITEMS + 1), np.int64), np.cumsum(
        [np.bincount(b, minlength=NUM_ITEMS + 1) for b in worker_batches(targets, steps)],
        axis=0)])
    return [(n, steps - n) for n in range(steps + 1)
            if np.array_equal(cumulative[n] + cumulative[steps - n], counts)]


def test_the_frequency_counts_are_exact_under_two_concurrent_workers(run):
    record, arrays = run
    import tensorflow as tf

    from tfrs_logq import CountMinSketch

    _, targets = make_data()
    steps = EPOCHS * STEPS_PER_EPOCH
    assert record["total"] == record["sketch_total"] == steps * BATCH
    counts = arrays["counts"]
    assert counts.sum() == steps * BATCH and counts[0] == 0
    np.testing.assert_array_equal(arrays["count_read"], counts)  # read shard by shard
    assert record["input_contexts"] and all(c == [1, 0] for c in record["input_contexts"])
    splits = _consumed_split(counts.astype(np.int64), targets)
    # One split of the steps between the two workers gives these counts (and its mirror).
    (first, second), = {tuple(sorted(split)) for split in splits}
    assert first > 0 and second > 0, splits  # both workers trained (and counted)
    q = arrays["probability"]
    np.testing.assert_allclose(q, np.maximum(counts[[0, 1, 7, 999]], 1) / (steps * BATCH),
                               rtol=1e-6)
    # The sketch updated in the same steps: the one-process sketch of the same ids.
    consumed = np.concatenate([worker_batches(targets, first).reshape(-1),
                               worker_batches(targets, second).reshape(-1)])
    reference = CountMinSketch(**SKETCH)
    reference.update(tf.constant(consumed))
    np.testing.assert_array_equal(arrays["sketch"], reference.counters.numpy())


def test_concurrent_updates_of_the_same_cells_lose_nothing(run):
    record, _ = run
    stress = record["stress"]
    expected = STRESS_IDS * STRESS_STEPS
    assert stress["sharded_counts"]
    assert stress["exact_total"] == stress["exact_counts"] == expected, stress
    assert stress["sketch_total"] == expected
    assert stress["sketch_rows"] == [expected] * SKETCH["depth"], stress
    # What Variable.scatter_add (ResourceScatterAdd, a shared lock) kept: reported only.
    print(f"Variable.scatter_add kept {stress['scatter_add']:.0f} of {expected} additions")


def test_the_sharded_towers_export_and_serve_the_brute_force_top_k(run):
    record, arrays = run
    import tensorflow as tf

    histories, _ = make_data(seed=1)
    histories = histories[:32].copy()
    histories[::3, :2] = 0  # padding, anywhere in the row
    weights = {name: arrays[f"epoch{EPOCHS}_{name}"] for name in
               ("query_embedding", "dense_kernel", "dense_bias", "item_table")}
    queries = _queries(weights, histories)
    scores = queries @ weights["item_table"][1:].T.astype(np.float64)  # [32, V]: items 1..V

    # One variable per table: tf.saved_model.save writes a split variable whole.
    stored = dict(tf.train.list_variables(os.path.join(record["export"], "variables",
                                                       "variables")))
    assert stored["item_table/.ATTRIBUTES/VARIABLE_VALUE"] == [NUM_ITEMS, DIM]
    assert [shape for name, shape in stored.items() if "embeddings" in name] == [
        [NUM_ITEMS + 1, DIM]]
    loaded = tf.saved_model.load(record["export"])  # here: no cluster, no strategy
    raw = np.where(histories > 0, histories + RAW_OFFSET, 0)
    np.testing.assert_array_equal(loaded.item_table.numpy(), weights["item_table"][1:])
    embedded = loaded.signatures["query_embedding"](history=tf.constant(raw))
    np.testing.assert_allclose(embedded["query_embedding"].numpy(), queries, rtol=1e-5,
                               atol=1e-6)
    k = 25
    served = loaded.signatures["top_k"](history=tf.constant(raw), k=tf.constant(k),
                                        exclude_history=tf.constant(False))
    _assert_top_k(served, scores, k)
    excluded = scores.copy()
    for row, items in enumerate(histories):
        excluded[row, items[items > 0] - 1] = -np.inf
    _assert_top_k(loaded.signatures["serving_default"](history=tf.constant(raw)), excluded,
                  DEFAULT_K)
    with open(os.path.join(record["export"], "assets", "export.json")) as f:
        meta = json.load(f)
    assert (meta["index"], meta["num_items"], meta["max_length"]) == (
        "brute-force", NUM_ITEMS, HISTORY)


def _assert_top_k(served, scores, k):
    """The served ``item_ids``/``scores`` are numpy's exact top-k of ``scores`` (`[n, V]`,
    item ``i + 1`` at column ``i``): the same scores, and the same items where no two of
    the best k + 1 tie within 1e-4."""
    ids = served["item_ids"].numpy() - RAW_OFFSET
    got = served["scores"].numpy()
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k + 1]
    best = np.take_along_axis(scores, order, 1)
    np.testing.assert_allclose(got, best[:, :k], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(scores, ids - 1, 1), got, rtol=1e-5, atol=1e-5)
    distinct = np.all(-np.diff(best, axis=1) > 1e-4, axis=1)
    assert distinct.mean() > 0.5
    np.testing.assert_array_equal(ids[distinct], order[distinct, :k] + 1)


if __name__ == "__main__":
    _child(sys.argv[1])
