"""Run by test_data_parallel.py in a process of its own, with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set before JAX is imported: the same
global batch through keras_logq on one device and under `keras.distribution.DataParallel`
over 4 host CPU devices. Writes the arrays to ``argv[1]`` (npz) and the devices and shardings
it saw to ``argv[1] + ".json"``; the test compares them (and the numpy reference).

- loss: `CorrectedRetrieval` on a `[16, 16]` score matrix, its rows, candidate ids and log Q
  sharded over the batch axis, for every correction: per-row losses, the reduced loss and
  ``jax.grad`` of the loss, under ``jax.jit``;
- fit: a two-tower model (`ItemFrequency` and `CorrectedRetrieval` in ``compute_loss``, as
  docs/keras3.md writes it) for every correction, and one compiled with
  `CorrectedRetrievalLoss`, trained by ``model.fit`` from the same weights for 8 steps (2
  epochs of 4 batches of 16).
"""

import json
import sys
import warnings

import jax
import keras
import keras_logq
import numpy as np
from keras import ops

B, DIM, NUM_USERS, NUM_ITEMS, STEPS, EPOCHS = 16, 8, 24, 10, 4, 2
CORRECTIONS = keras_logq.CORRECTIONS
# Keras warns that a subclassed model is built before its Embedding layers are: not ours.
warnings.filterwarnings("ignore", message=r"`build\(\)` was called on layer")
SEEN = {}  # what the traced training steps saw: name -> sharding descriptions


def describe(sharding, shape) -> dict:
    return {"devices": len(sharding.device_set), "replicated": bool(sharding.is_fully_replicated),
            "shard_shape": list(sharding.shard_shape(tuple(shape))), "text": str(sharding)}


def record(name, x):
    """Records the sharding ``x`` has inside a traced (jit) step."""
    shape = tuple(x.shape)
    jax.debug.inspect_array_sharding(
        x, callback=lambda s: SEEN.setdefault(name, []).append(describe(s, shape)))


def batch_data():
    rng = np.random.default_rng(7)
    # Items repeat across the 4 shards of 4 rows (e.g. item 3 in rows 0, 6, 11, 15): their
    # accidental hits lie in other devices' rows.
    items = np.array([3, 5, 1, 8, 2, 9, 3, 4, 5, 7, 6, 3, 10, 8, 1, 3], "int32")
    scores = (rng.normal(size=(B, B)) * 2).astype("float32")
    counts = rng.integers(1, 40, size=NUM_ITEMS + 1).astype(np.float64)
    log_q_table = np.log(counts / counts.sum())
    return scores, items, log_q_table[items].astype("float32"), log_q_table


def loss_and_grads(correction, scores, ids, log_q):
    """Per-row losses, the mean loss and d(sum loss)/d scores, jit-compiled."""
    per_row = keras_logq.CorrectedRetrieval(correction=correction, reduction="none")
    mean = keras_logq.CorrectedRetrieval(correction=correction)

    def total(s, i, lq):
        rows = per_row(s, candidate_ids=i, candidate_log_sampling_probability=lq)
        return ops.sum(rows), rows

    @jax.jit
    def step(s, i, lq):
        record(f"loss_scores_{correction}", s)
        (_, rows), grad = jax.value_and_grad(total, has_aux=True)(s, i, lq)
        return rows, mean(s, candidate_ids=i, candidate_log_sampling_probability=lq), grad

    return [np.asarray(x) for x in step(scores, ids, log_q)]


class TwoTower(keras.Model):
    """docs/keras3.md's two-tower model: towers and frequency in call(), the loss in
    compute_loss."""

    def __init__(self, correction, **kwargs):
        super().__init__(**kwargs)
        self.user_tower = keras.layers.Embedding(NUM_USERS, DIM)
        self.item_tower = keras.layers.Embedding(NUM_ITEMS + 1, DIM)
        self.frequency = keras_logq.ItemFrequency(NUM_ITEMS + 1)
        self.retrieval = keras_logq.CorrectedRetrieval(correction=correction)

    def call(self, inputs, training=None):
        users, items = inputs["user"], inputs["item"]
        if training:
            record(f"fit_users_{self.retrieval.correction}", users)
        log_q = self.frequency(items, training=training)
        scores = ops.matmul(self.user_tower(users), ops.transpose(self.item_tower(items)))
        return {"scores": scores, "candidate_ids": items, "log_q": log_q}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self.retrieval(y_pred["scores"], candidate_ids=y_pred["candidate_ids"],
                              candidate_log_sampling_probability=y_pred["log_q"])


class Scores(keras.Model):
    """A model that returns the `[batch, batch]` scores, for compile(loss=...)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.user_tower = keras.layers.Embedding(NUM_USERS, DIM)
        self.item_tower = keras.layers.Embedding(NUM_ITEMS + 1, DIM)

    def call(self, inputs, training=None):
        if training:
            record("fit_users_compiled_loss", inputs["user"])
        return ops.matmul(self.user_tower(inputs["user"]),
                          ops.transpose(self.item_tower(inputs["item"])))


def train_data():
    rng = np.random.default_rng(11)
    users = rng.integers(0, NUM_USERS, size=STEPS * B).astype("int32")
    items = rng.integers(1, NUM_ITEMS + 1, size=STEPS * B).astype("int32")
    start = np.random.default_rng(3)
    u0 = (start.normal(size=(NUM_USERS, DIM)) * 0.5).astype("float32")
    i0 = (start.normal(size=(NUM_ITEMS + 1, DIM)) * 0.5).astype("float32")
    return {"user": users, "item": items}, u0, i0


def fit(kind, log_q_table):
    """Trains one model for EPOCHS epochs of STEPS batches of B rows from fixed weights;
    returns its weights, frequency counts and per-epoch losses, and the trained variables'
    shardings."""
    x, u0, i0 = train_data()
    if kind == "compiled_loss":
        model = Scores()
        loss = keras_logq.CorrectedRetrievalLoss(item_log_sampling_probability=log_q_table)
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)
        model({"user": x["user"][:B], "item": x["item"][:B]})
        y = x["item"]
    else:
        model = TwoTower(kind)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        model({"user": x["user"][:B], "item": x["item"][:B]})
        y = None
    model.user_tower.embeddings.assign(u0)
    model.item_tower.embeddings.assign(i0)
    history = model.fit(x, y, batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0)
    out = {"user": model.user_tower.embeddings, "item": model.item_tower.embeddings}
    if kind != "compiled_loss":
        out["counts"] = model.frequency.counts
    variables = {k: describe(v.value.sharding, v.shape) for k, v in out.items()}
    arrays = {k: np.asarray(ops.convert_to_numpy(v)) for k, v in out.items()}
    arrays["loss"] = np.asarray(history.history["loss"])
    return arrays, variables


def run(log_q_table, scores, ids, log_q, tag, info):
    results = {}
    for correction in CORRECTIONS:
        rows, mean, grad = loss_and_grads(correction, scores, ids, log_q)
        results[f"{tag}_loss_{correction}"] = rows
        results[f"{tag}_mean_{correction}"] = mean
        results[f"{tag}_grad_{correction}"] = grad
    for kind in CORRECTIONS + ("compiled_loss",):
        arrays, variables = fit(kind, log_q_table)
        for name, value in arrays.items():
            results[f"{tag}_fit_{kind}_{name}"] = value
        info.setdefault("variables", {})[f"{tag}_{kind}"] = variables
    return results


def main(path):
    devices = jax.devices()
    info = {"devices": [str(d) for d in devices], "platforms": [d.platform for d in devices],
            "keras_devices": keras.distribution.list_devices(), "jax": jax.__version__,
            "keras": keras.__version__, "backend": keras.backend.backend()}
    scores, ids, log_q, log_q_table = batch_data()
    x, u0, i0 = train_data()
    results = {"scores": scores, "ids": ids, "log_q": log_q, "train_items": x["item"],
               "user0": u0, "item0": i0, "epochs": np.asarray(EPOCHS)}

    # One device: no distribution, the arrays on jax.devices()[0].
    keras.distribution.set_distribution(None)
    results.update(run(log_q_table, scores, ids, log_q, "single", info))
    info["single_seen"] = dict(SEEN)
    SEEN.clear()

    # DataParallel over every device; the loss's inputs sharded as fit shards a batch.
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    keras.distribution.set_distribution(distribution)
    info["mesh"] = str(distribution.device_mesh.devices.shape)
    sharded = [keras.distribution.distribute_tensor(a, distribution.get_data_layout(a.shape))
               for a in (scores, ids, log_q)]
    info["inputs"] = {name: describe(a.sharding, a.shape)
                      for name, a in zip(("scores", "ids", "log_q"), sharded)}
    results.update(run(log_q_table, *sharded, "sharded", info))
    info["sharded_seen"] = dict(SEEN)
    keras.distribution.set_distribution(None)

    np.savez(path, **results)
    with open(path + ".json", "w") as f:
        json.dump(info, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
