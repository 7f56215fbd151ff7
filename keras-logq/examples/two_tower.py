"""A two-tower retrieval model in Keras 3 with the corrected logQ loss, on any backend.

Run it with ``KERAS_BACKEND=jax`` (or ``torch``, ``tensorflow``):

    pip install -e "keras-logq[examples]"    # keras-rs, for BruteForceRetrieval
    KERAS_BACKEND=jax python keras-logq/examples/two_tower.py --steps 300

The data is the synthetic stream of ``tfrs_logq.pipelines.synthetic`` (a topic model
with Zipf popularity), re-implemented here in numpy so that this script needs no
TensorFlow: item ``d`` in ``1..V`` belongs to topic ``(d - 1) mod C`` and has
popularity ``d^-s``; user ``u`` prefers topics by ``softmax(sigma z_u)``; an
interaction picks a topic, then an item of it by popularity.

The model:

- two embedding towers; the item embeddings of the batch's candidates are computed in
  ``call()`` (on JAX and PyTorch, variables used only in ``compute_loss()`` would not
  be tracked by the training step);
- ``keras_logq.ItemFrequency`` counts the items it trains on (Keras variables, updated
  by ``model.fit`` on every backend) and gives ``log Q``;
- optionally ``keras_logq.UniformNegatives`` adds uniform negatives (mixed negative
  sampling), corrected with the unigram ``log Q`` as the paper does;
- ``keras_logq.CorrectedRetrieval`` is the loss;
- ``keras_rs.layers.BruteForceRetrieval`` retrieves the top-k of the whole catalog for
  the evaluation's Recall@k.
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import keras_logq
import numpy as np


class SyntheticStream:
    """The topic-model stream (numpy): ``sample(n)`` gives users and their items."""

    def __init__(self, num_items=2000, num_users=2000, num_topics=20, zipf_exponent=1.05,
                 topic_sharpness=2.5, seed=0):
        self.num_items, self.num_users, self.num_topics = num_items, num_users, num_topics
        rng = np.random.default_rng(seed)
        logits = topic_sharpness * rng.normal(size=(num_users, num_topics))
        prefs = np.exp(logits - logits.max(axis=1, keepdims=True))
        self.topic_probs = prefs / prefs.sum(axis=1, keepdims=True)
        items = np.arange(1, num_items + 1)
        self.popularity = items.astype(np.float64) ** -zipf_exponent
        self.topic_items = [items[(items - 1) % num_topics == c] for c in range(num_topics)]
        self.topic_cdf = [np.cumsum(self.popularity[t - 1]) / self.popularity[t - 1].sum()
                          for t in self.topic_items]
        self.rng = np.random.default_rng(seed + 1)

    def sample(self, n):
        users = self.rng.integers(0, self.num_users, size=n)
        u = self.rng.uniform(size=n)
        topics = (self.topic_probs[users].cumsum(axis=1) < u[:, None]).sum(axis=1)
        topics = np.minimum(topics, self.num_topics - 1)
        v = self.rng.uniform(size=n)
        items = np.array([self.topic_items[c][min(np.searchsorted(self.topic_cdf[c], x),
                                                      len(self.topic_items[c]) - 1)]
                          for c, x in zip(topics, v)])
        return users.astype("int32"), items.astype("int32")


class TwoTower(keras.Model):
    """User and item towers trained with `CorrectedRetrieval` on in-batch (+ uniform) negatives.

    Args:
        num_users: int. Users ``0 .. num_users - 1``.
        num_items: int. Items ``1 .. num_items`` (0 is padding).
        dim: int. Embedding size.
        correction: str. ``"none"``, ``"logq-tfrs"``, ``"logq-official"`` or ``"corrected"``.
        num_uniform: int. Uniform negatives added to the in-batch ones (0: in-batch only).
        temperature: float. Scores are divided by it.
    """

    def __init__(self, num_users, num_items, dim=32, correction="corrected", num_uniform=0,
                 temperature=0.1, **kwargs):
        super().__init__(**kwargs)
        self.num_users, self.num_items, self.dim = num_users, num_items, dim
        self.correction, self.num_uniform, self.temperature = correction, num_uniform, temperature
        init = keras.initializers.RandomNormal(stddev=0.1)
        self.user_tower = keras.layers.Embedding(num_users, dim, embeddings_initializer=init)
        self.item_tower = keras.layers.Embedding(num_items + 1, dim, embeddings_initializer=init)
        self.frequency = keras_logq.ItemFrequency(num_items + 1)
        self.uniform = (keras_logq.UniformNegatives(num_items, num_uniform, seed=1)
                        if num_uniform else None)
        self.retrieval = keras_logq.CorrectedRetrieval(correction=correction,
                                                       temperature=temperature)

    def build(self, input_shape=None):
        self.user_tower.build((None,))
        self.item_tower.build((None,))
        self.built = True

    def call(self, inputs, training=None):
        users, items = inputs["user"], inputs["item"]
        queries = keras.ops.normalize(self.user_tower(users), axis=-1)
        log_q = self.frequency(items, training=training)  # counts the batch when training
        candidate_ids = items
        if self.uniform is not None:
            negatives = self.uniform(items)
            candidate_ids = keras.ops.concatenate(
                [items, keras.ops.cast(negatives.ids, items.dtype)], axis=0)
            # The paper's MNS: every negative corrected with the unigram log Q.
            log_q = keras.ops.concatenate([log_q, self.frequency.log_q(negatives.ids)], axis=0)
        candidates = keras.ops.normalize(self.item_tower(candidate_ids), axis=-1)
        scores = keras.ops.matmul(queries, keras.ops.transpose(candidates))
        return {"scores": scores, "candidate_ids": candidate_ids,
                "candidate_log_sampling_probability": log_q}

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self.retrieval(
            y_pred["scores"],
            candidate_ids=y_pred["candidate_ids"],
            candidate_log_sampling_probability=y_pred["candidate_log_sampling_probability"],
        )

    def query_embeddings(self, users):
        return keras.ops.normalize(self.user_tower(users), axis=-1)

    def item_embeddings(self):
        return keras.ops.normalize(self.item_tower.embeddings[1:], axis=-1)  # ids 1..V

    def get_config(self):
        return {"num_users": self.num_users, "num_items": self.num_items, "dim": self.dim,
                "correction": self.correction, "num_uniform": self.num_uniform,
                "temperature": self.temperature, **super().get_config()}


def recall_at_k(model, users, items, k):
    """Recall@k over the whole catalog, retrieved by `keras_rs.layers.BruteForceRetrieval`."""
    import keras_rs

    retrieval = keras_rs.layers.BruteForceRetrieval(k=k, return_scores=False)
    retrieval.update_candidates(model.item_embeddings(),
                                np.arange(1, model.num_items + 1, dtype="int32"))
    top = keras.ops.convert_to_numpy(retrieval(model.query_embeddings(users)))
    return float(np.mean((top == items[:, None]).any(axis=1)))


def run(args) -> dict:
    keras.utils.set_random_seed(args.seed)
    stream = SyntheticStream(num_items=args.synthetic_items, num_users=args.synthetic_users,
                             num_topics=args.num_topics, seed=args.seed)
    users, items = stream.sample(args.steps * args.batch_size)
    test_users, test_items = stream.sample(args.num_test)
    model = TwoTower(args.synthetic_users, args.synthetic_items, dim=args.dim,
                     correction=args.loss, num_uniform=args.num_uniform,
                     temperature=args.temperature)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                  jit_compile=args.jit_compile)
    model.build()
    before = recall_at_k(model, test_users, test_items, args.k)
    start = time.perf_counter()
    history = model.fit({"user": users, "item": items}, batch_size=args.batch_size,
                        epochs=1, shuffle=False, verbose=args.verbose)
    seconds = time.perf_counter() - start
    return {
        "backend": keras.backend.backend(),
        "correction": args.loss,
        "steps": args.steps,
        "loss": float(history.history["loss"][-1]),
        "recall_before": before,
        f"recall_at_{args.k}": recall_at_k(model, test_users, test_items, args.k),
        "seconds_per_step": seconds / args.steps,
        "counts_match": bool(np.array_equal(
            keras.ops.convert_to_numpy(model.frequency.counts),
            np.bincount(items, minlength=args.synthetic_items + 1))),
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loss", default="corrected", choices=keras_logq.CORRECTIONS,
                   help="in-batch sampled softmax with this correction")
    p.add_argument("--synthetic-items", type=int, default=2000)
    p.add_argument("--synthetic-users", type=int, default=2000)
    p.add_argument("--num-topics", type=int, default=20)
    p.add_argument("--num-uniform", type=int, default=0, help="uniform negatives per batch")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--temperature", type=float, default=0.1)
    p.add_argument("--num-test", type=int, default=2000)
    p.add_argument("--k", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jit-compile", default="auto",
                   type=lambda s: s if s == "auto" else s.lower() == "true")
    p.add_argument("--verbose", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    result = run(parse_args(argv))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
