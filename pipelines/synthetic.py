"""A synthetic large-scale interaction stream with a known ground-truth model.

The generator is a topic model with Zipf popularity, chosen so that the true
``P(d | u)`` of every (user, item) pair, the true top-k of every user and the
true unigram ``Q(d)`` are all computable without anything of size
``V x V`` or ``users x V``:

- Items ``1..V`` (0 is padding) belong to ``C`` topics: item ``d`` is in topic
  ``(d - 1) mod C`` and is the ``j = (d - 1) // C``-th item of it. Its
  popularity is ``pop(d) = d^-s`` (Zipf with exponent ``s``), so within a topic
  items are ordered by popularity.
- User ``u`` has topic preferences ``P(c | u) = softmax(sigma * z_u)`` with
  ``z_u ~ N(0, I_C)`` (a `[users, C]` float64 table drawn once from ``seed``, kept
  with its cumulative table: 32 GB at 200,000 users and 10,000 topics, so keep
  ``users x C`` to a few hundred million).
- An interaction picks a topic ``c ~ P(c | u)``, then an item of that topic with
  probability ``pop(d) / Z_c``: ``P(d | u) = P(c(d) | u) pop(d) / Z_{c(d)}``.

Example ``i`` of the stream (deterministic in ``(seed, i)``) is a user drawn
uniformly from ``num_users``, ``history_length`` past items and one target item,
all drawn independently from ``P(. | u)``. Sampling an item is two binary
searches: its topic in a user-major cumulative table of ``P(c | u)`` (``users x C``
float64 values), then the item in a topic-major cumulative table of ``V`` float64
values (80 MB at V = 10M), so the stream is vectorized per batch and runs in
parallel.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic stream.

    Attributes:
      num_items: int. Catalog size ``V`` (ids ``1..V``; 0 is padding).
      num_users: int. Number of users.
      num_topics: int. Number of topics ``C``.
      zipf_exponent: float. ``s`` in ``pop(d) = d^-s``.
      topic_sharpness: float. ``sigma``: scale of the users' topic logits.
      history_length: int. Items of history per example.
      seed: int. Seed of every random draw.
    """

    num_items: int = 50_000
    num_users: int = 100_000
    num_topics: int = 50
    zipf_exponent: float = 1.05
    topic_sharpness: float = 2.5
    history_length: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for field in ("num_items", "num_users", "num_topics", "history_length"):
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"`{field}` must be a positive int, received {value!r}.")
        if self.num_topics > self.num_items:
            raise ValueError(
                f"`num_topics` ({self.num_topics}) cannot exceed `num_items` ({self.num_items})."
            )
        if not self.zipf_exponent > 0:
            raise ValueError(f"`zipf_exponent` must be positive, received {self.zipf_exponent!r}.")
        if not self.topic_sharpness >= 0:
            raise ValueError(
                f"`topic_sharpness` must be non-negative, received {self.topic_sharpness!r}."
            )


class SyntheticStream:
    """The stream and its ground truth. See the module docstring for the model."""

    def __init__(self, config: Optional[SyntheticConfig] = None, **overrides) -> None:
        if config is None:
            config = SyntheticConfig(**overrides)
        elif overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        v, c = config.num_items, config.num_topics
        self.items_per_topic = -(-v // c)  # M, the row length of the topic-major table
        ids = np.arange(1, v + 1, dtype=np.float64)
        log_pop = -config.zipf_exponent * np.log(ids)
        topic = (np.arange(v) % c).astype(np.int64)
        # log Z_c, computed stably.
        self._log_pop = log_pop
        max_per_topic = np.full(c, -np.inf)
        np.maximum.at(max_per_topic, topic, log_pop)
        sums = np.zeros(c)
        np.add.at(sums, topic, np.exp(log_pop - max_per_topic[topic]))
        self.log_topic_norm = max_per_topic + np.log(sums)
        # Topic-major cumulative table: entry c * M + j is c + P(first j+1 items | c).
        table = np.full((c, self.items_per_topic), 1.0)
        within = np.exp(log_pop - self.log_topic_norm[topic])
        j = np.arange(v) // c
        probs = np.zeros((c, self.items_per_topic))
        probs[topic, j] = within
        table = np.minimum(np.cumsum(probs, axis=1), 1.0)
        self.num_in_topic = np.bincount(topic, minlength=c)
        table[np.arange(c), self.num_in_topic - 1] = 1.0  # exact end of each segment
        self._cdf = tf.constant((table + np.arange(c)[:, None]).reshape(-1), tf.float64)
        self._num_in_topic = tf.constant(self.num_in_topic, tf.int64)
        self._log_pop_tf = tf.constant(np.concatenate([[-np.inf], log_pop]), tf.float64)
        self._log_topic_norm_tf = tf.constant(self.log_topic_norm, tf.float64)
        rng = np.random.default_rng(config.seed)
        logits = config.topic_sharpness * rng.standard_normal((config.num_users, c))
        self._user_logits = tf.constant(logits, tf.float64)
        # User-major cumulative table of P(c | u): entry u * C + c is u + P(topics <= c | u),
        # so a topic draw is one binary search (no [batch, C] tensor per batch).
        user_cdf = np.empty(config.num_users * c)
        for start in range(0, config.num_users, 1024):
            rows = logits[start:start + 1024]
            p = np.exp(rows - rows.max(axis=1, keepdims=True))
            cdf = np.minimum(np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1), 1.0)
            cdf[:, -1] = 1.0  # exact end of each segment
            user_cdf[start * c:(start + len(rows)) * c] = (
                cdf + np.arange(start, start + len(rows))[:, None]).reshape(-1)
        self._user_cdf = tf.constant(user_cdf, tf.float64)
        del logits, user_cdf

    # ------------------------------------------------------------------ ground truth

    def user_topic_logits(self, users) -> tf.Tensor:
        """`[n, C]` float64 unnormalised ``log P(c | u)``."""
        return tf.gather(self._user_logits, tf.cast(tf.convert_to_tensor(users), tf.int64))

    def user_topic_log_probs(self, users) -> tf.Tensor:
        return tf.nn.log_softmax(self.user_topic_logits(users), axis=-1)

    def true_log_prob(self, users, items) -> tf.Tensor:
        """float64 ``log P(d | u)``: `[n]` for pairs ``(users[i], items[i])``, or `[n, w]`
        for `[n, w]` ``items`` (row ``i`` scored for ``users[i]``; ``n x C`` memory, not
        ``n w x C``)."""
        items = tf.cast(tf.convert_to_tensor(items), tf.int64)
        topics = (items - 1) % self.config.num_topics
        log_pc = tf.gather(self.user_topic_log_probs(users), topics, batch_dims=1)
        return (
            log_pc
            + tf.gather(self._log_pop_tf, items)
            - tf.gather(self._log_topic_norm_tf, topics)
        )

    def true_top_k(self, users, k: int,
                   max_chunk_floats: int = 1 << 25) -> tuple[tf.Tensor, tf.Tensor]:
        """`[n, k]` item ids and ``log P(d | u)`` of each user's true top-k.

        Within a topic items are ranked by popularity, so the top-k is among
        the first ``k`` items of every topic: ``C * k`` candidates per user, scored
        for at most ``max_chunk_floats / (C k)`` users at a time.
        """
        cfg = self.config
        k = int(k)
        per_topic = min(k, self.items_per_topic)
        j = np.arange(per_topic)
        cand = (j[None, :] * cfg.num_topics + np.arange(cfg.num_topics)[:, None] + 1).reshape(-1)
        valid = cand <= cfg.num_items
        cand = np.where(valid, cand, 1)
        topics = (cand - 1) % cfg.num_topics
        base = np.where(
            valid, self._log_pop[cand - 1] - self.log_topic_norm[topics], -np.inf
        )
        users = np.asarray(users)
        chunk = max(1, max_chunk_floats // len(cand))  # [chunk, C k] scores at a time
        cand_t, base_t, topics_t = (tf.constant(cand, tf.int64), tf.constant(base),
                                    tf.constant(topics))
        ids, log_probs = [], []
        for start in range(0, len(users), chunk):
            log_pc = self.user_topic_log_probs(users[start:start + chunk])  # [chunk, C]
            scores = tf.gather(log_pc, topics_t, axis=1) + base_t[None, :]
            top_scores, idx = tf.math.top_k(scores, k=min(k, int(valid.sum())))
            ids.append(tf.gather(cand_t, idx))
            log_probs.append(top_scores)
        return tf.concat(ids, 0), tf.concat(log_probs, 0)

    def item_log_marginal(self, num_users_sample: Optional[int] = None) -> np.ndarray:
        """`[V + 1]` true unigram ``log Q(d) = log E_u P(d | u)`` (entry 0: padding, -inf).

        Averages ``P(c | u)`` over all users (or the first ``num_users_sample``),
        chunked: never ``users x V``.
        """
        cfg = self.config
        n = cfg.num_users if num_users_sample is None else min(num_users_sample, cfg.num_users)
        topic_mass = np.zeros(cfg.num_topics)
        for start in range(0, n, 4096):
            users = np.arange(start, min(n, start + 4096))
            topic_mass += tf.nn.softmax(self.user_topic_logits(users)).numpy().sum(0)
        topic_mass /= n
        topics = np.arange(cfg.num_items) % cfg.num_topics
        log_q = np.log(topic_mass[topics]) + self._log_pop - self.log_topic_norm[topics]
        return np.concatenate([[-np.inf], log_q])

    # ------------------------------------------------------------------ sampling

    def sample_topics(self, users: tf.Tensor, count: int, seed: tf.Tensor) -> tf.Tensor:
        """`[n, count]` topics drawn from ``P(c | u)`` of `[n]` ``users``: inverse CDF by
        binary search in the user-major table (``n count log(users C)`` work, where
        ``stateless_categorical`` from `[n, C]` logits would cost ``n C``)."""
        c = self.config.num_topics
        users = tf.cast(users, tf.int64)
        u = tf.random.stateless_uniform(tf.concat([tf.shape(users), [count]], 0), seed=seed,
                                        dtype=tf.float64)
        target = tf.cast(users, tf.float64)[:, None] + u
        position = tf.searchsorted(self._user_cdf, tf.reshape(target, [-1]), side="right",
                                   out_type=tf.int64)
        topics = tf.reshape(tf.cast(position, tf.int64), tf.shape(u)) - users[:, None] * c
        return tf.clip_by_value(topics, 0, c - 1)  # u + x may round up to u + 1

    def sample_items(self, users: tf.Tensor, count: int, seed: tf.Tensor) -> tf.Tensor:
        """`[n, count]` items drawn from ``P(. | u)`` for `[n]` ``users``."""
        s1, s2 = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        topics = self.sample_topics(users, count, s1)
        u = tf.random.stateless_uniform(tf.shape(topics), seed=s2, dtype=tf.float64)
        position = tf.searchsorted(
            self._cdf, tf.reshape(tf.cast(topics, tf.float64) + u, [-1]), side="right"
        )
        position = tf.reshape(tf.cast(position, tf.int64), tf.shape(topics))
        j = position - topics * self.items_per_topic
        j = tf.clip_by_value(j, 0, tf.gather(self._num_in_topic, topics) - 1)
        return j * self.config.num_topics + topics + 1

    def _batch(self, index: tf.Tensor, batch_size: int) -> dict:
        cfg = self.config
        seed = tf.stack([tf.constant(cfg.seed, tf.int64), index])
        s_user, s_items = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        users = tf.random.stateless_uniform(
            [batch_size], seed=s_user, maxval=cfg.num_users, dtype=tf.int64
        )
        items = self.sample_items(users, cfg.history_length + 1, s_items)
        return {
            "user_id": users,
            "history": items[:, :-1],
            "target": items[:, -1],
        }

    def dataset(
        self,
        batch_size: int,
        num_batches: Optional[int] = None,
        start_batch: int = 0,
        num_parallel_calls: int = tf.data.AUTOTUNE,
    ) -> tf.data.Dataset:
        """Batches of ``{"user_id": [b], "history": [b, H], "target": [b]}``.

        Batch ``i`` depends only on ``(seed, start_batch + i)``: disjoint
        ``start_batch`` ranges give disjoint, reproducible splits (e.g. train
        from 0, evaluation from 10**9). ``num_batches=None`` streams forever.
        """
        if int(batch_size) < 1:
            raise ValueError(f"`batch_size` must be a positive int, received {batch_size!r}.")
        indices = tf.data.Dataset.range(start_batch, 2**62 if num_batches is None else
                                        start_batch + int(num_batches))
        ds = indices.map(
            lambda i: self._batch(i, int(batch_size)),
            num_parallel_calls=num_parallel_calls,
            deterministic=True,
        )
        return ds.prefetch(tf.data.AUTOTUNE)


__all__ = ["SyntheticConfig", "SyntheticStream"]
