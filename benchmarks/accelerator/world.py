"""The synthetic world of `tfrs_logq.pipelines.synthetic`, without TensorFlow.

The generative model (topics, Zipf popularity, ``P(c|u) = softmax(sigma z_u)``) is
rebuilt here from the same numpy draws, so that everything the TF study measures
against is the same:

- the users' topic logits ``sigma * z_u`` come from ``np.random.default_rng(seed)``,
  as in `SyntheticStream`: identical to the bit;
- the truth ``log P(d|u)``, the unigram ``log Q(d) = E_u P(d|u)`` and the popularity
  bands are the same float64 formulas (``Q`` differs from TensorFlow's softmax by
  rounding, about 1e-16 relative);
- the held-out examples (stream batch ``10**15``) are redrawn with TensorFlow's own
  stateless Philox (`tf_philox`) and the same float64 inverse-CDF searches: the same
  users, histories and targets to the bit.

The *training* stream is drawn on the device instead (`sample_batch`, ``jax.random``
inside the jitted step): the same distribution, not TensorFlow's draws (a host-side
generator cannot feed 4,096 examples every 2 ms). Its inverse-CDF tables are float32
and per row (``P(topics <= c | u)`` for each user, ``P(first j + 1 items | c)`` for
each topic), searched by a fixed number of bisection steps: a cumulative probability
is then off by at most about 6e-8, against the float64 tables of the TF stream.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from . import tf_philox

EVAL_BATCH_INDEX = 10**15  # the TF study's held-out batch
KS = (10, 100, 1000)
BANDS = ("head", "torso", "tail")
_USER_CHUNK = 1024


@dataclasses.dataclass(frozen=True)
class WorldConfig:
    """`tfrs_logq.pipelines.synthetic.SyntheticConfig`'s fields (``seed`` = world seed)."""

    num_items: int
    num_users: int
    num_topics: int
    zipf_exponent: float = 1.05
    topic_sharpness: float = 8.0
    history_length: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        for field in ("num_items", "num_users", "num_topics", "history_length"):
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"`{field}` must be a positive int, received {value!r}.")
        if self.num_topics > self.num_items:
            raise ValueError(f"`num_topics` ({self.num_topics}) cannot exceed `num_items` "
                             f"({self.num_items}).")
        if self.num_users * self.num_topics >= 2**31:
            raise ValueError("`num_users * num_topics` must be below 2**31 (int32 indices of "
                             f"the device's topic table), received {self.num_users} x "
                             f"{self.num_topics}.")


def _row_cdf(logits: np.ndarray) -> np.ndarray:
    """`SyntheticStream`'s per-user cumulative ``P(topics <= c | u)``, float64, exact end."""
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.minimum(np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1), 1.0)
    cdf[:, -1] = 1.0
    return cdf


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


class World:
    """The world's truth (host, float64) and its device sampling tables (float32).

    Attributes:
      config: the `WorldConfig`.
      log_q: `[V + 1]` float64 true unigram ``log Q(d)`` (entry 0, padding: -inf).
      bands: `[V + 1]` int band of every id: 0 head, 1 torso, 2 tail.
      user_cdf: `[users, C]` float32 per-row ``P(topics <= c | u)`` (the device table).
      item_cdf: `[C, M]` float32 per-topic ``P(first j + 1 items | c)``.
      num_in_topic: `[C]` int32 items per topic.
    """

    def __init__(self, config: WorldConfig, num_eval_users: int) -> None:
        self.config = config
        v, c = config.num_items, config.num_topics
        self.items_per_topic = -(-v // c)
        ids = np.arange(1, v + 1, dtype=np.float64)
        self.log_pop = -config.zipf_exponent * np.log(ids)
        topic = (np.arange(v) % c).astype(np.int64)
        max_per_topic = np.full(c, -np.inf)
        np.maximum.at(max_per_topic, topic, self.log_pop)
        sums = np.zeros(c)
        np.add.at(sums, topic, np.exp(self.log_pop - max_per_topic[topic]))
        self.log_topic_norm = max_per_topic + np.log(sums)
        probs = np.zeros((c, self.items_per_topic))
        probs[topic, np.arange(v) // c] = np.exp(self.log_pop - self.log_topic_norm[topic])
        table = np.minimum(np.cumsum(probs, axis=1), 1.0)
        self.num_in_topic = np.bincount(topic, minlength=c)
        table[np.arange(c), self.num_in_topic - 1] = 1.0
        self._topic_cdf_flat = (table + np.arange(c)[:, None]).reshape(-1)  # the TF table
        self.item_cdf = table.astype(np.float32)

        rng = np.random.default_rng(config.seed)
        logits = config.topic_sharpness * rng.standard_normal((config.num_users, c))
        self.user_cdf = np.empty((config.num_users, c), np.float32)
        topic_mass = np.zeros(c)
        for start in range(0, config.num_users, _USER_CHUNK):
            rows = logits[start:start + _USER_CHUNK]
            self.user_cdf[start:start + len(rows)] = _row_cdf(rows)
            topic_mass += np.exp(_log_softmax(rows)).sum(0)
        topic_mass /= config.num_users
        self.log_q = np.concatenate([[-np.inf], np.log(topic_mass[topic]) + self.log_pop
                                     - self.log_topic_norm[topic]])
        self.bands = popularity_bands(self.log_q)
        self.eval_batch = self._held_out_batch(logits, num_eval_users)
        self.eval_log_pc = _log_softmax(logits[self.eval_batch["user_id"]])
        del logits

    # ------------------------------------------------------------------ truth

    def true_log_prob(self, rows: np.ndarray, items: np.ndarray) -> np.ndarray:
        """float64 ``log P(d|u)`` of the held-out users ``rows`` (positions in the eval
        batch, `[n]`) and ``items`` (`[n]` or `[n, w]`)."""
        items = np.asarray(items, np.int64)
        topics = (items - 1) % self.config.num_topics
        log_pc = self.eval_log_pc[rows]
        gathered = (np.take_along_axis(log_pc, topics, axis=1) if items.ndim == 2
                    else log_pc[np.arange(len(rows)), topics])
        return gathered + self.log_pop[items - 1] - self.log_topic_norm[topics]

    def exact_expected_hits(self, top: np.ndarray, ks=KS) -> np.ndarray:
        """`[users, len(ks)]` float64: each held-out user's ``sum_{d in top[:, :k]} P(d|u)``,
        the expected hit of a target drawn from the truth."""
        sums = np.cumsum(np.exp(self.true_log_prob(np.arange(len(top)), top)), axis=1)
        return np.stack([sums[:, min(k, sums.shape[1]) - 1] for k in ks], axis=1)

    def exact_expected_recall(self, top: np.ndarray, ks=KS) -> dict:
        """Mean over held-out users of ``sum_{d in top[:, :k]} P(d|u)`` (float64)."""
        hits = self.exact_expected_hits(top, ks)
        return {k: float(hits[:, i].mean()) for i, k in enumerate(ks)}

    # ------------------------------------------------------------------ the held-out batch

    def _held_out_batch(self, logits: np.ndarray, n: int) -> dict:
        """Stream batch `EVAL_BATCH_INDEX` of `SyntheticStream._batch`, TensorFlow's draws."""
        cfg = self.config
        c, count = cfg.num_topics, cfg.history_length + 1
        s_user, s_items = tf_philox.split([cfg.seed, EVAL_BATCH_INDEX])
        users = tf_philox.uniform_int64((n,), s_user, 0, cfg.num_users)
        s1, s2 = tf_philox.split(s_items)
        u = tf_philox.uniform_float64((n, count), s1)
        topics = np.empty((n, count), np.int64)
        for i, user in enumerate(users):
            # The TF table holds u + cdf in one flat array; row u's entries lie in [u, u + 1]
            # and every other row's outside (u, u + 1), so the flat search equals this one.
            row = _row_cdf(logits[user:user + 1])[0] + float(user)
            position = np.searchsorted(row, float(user) + u[i], side="right")
            topics[i] = np.clip(position, 0, c - 1)
        u2 = tf_philox.uniform_float64((n, count), s2)
        position = np.searchsorted(self._topic_cdf_flat, (topics.astype(np.float64) + u2),
                                   side="right")
        j = np.clip(position - topics * self.items_per_topic, 0, self.num_in_topic[topics] - 1)
        items = j * c + topics + 1
        return {"user_id": users, "history": items[:, :-1], "target": items[:, -1]}


def popularity_bands(log_q: np.ndarray) -> np.ndarray:
    """`[V + 1]` band of every id, the bands of `tfrs_logq.metrics.popularity_bands` by ``Q``:
    items by ``Q`` descending; head holds the first third of the mass, torso the next, tail
    the rest."""
    q = np.exp(log_q[1:])
    order = np.argsort(-q, kind="stable")
    before = np.cumsum(q[order]) - q[order]
    band = np.zeros(len(q), np.int64)
    band[order] = np.minimum((3.0 * before / q.sum()).astype(np.int64), 2)
    return np.concatenate([[2], band])


# ---------------------------------------------------------------------- device sampling

def _bisect_right(table, row_start, row_length: int, x):
    """Per element, the number of entries ``<= x`` in its row ``table[row_start :
    row_start + row_length]`` (rows sorted ascending): ``ceil(log2(L + 1))`` gathers."""
    import jax.numpy as jnp

    lo = jnp.zeros(x.shape, jnp.int32)
    hi = jnp.full(x.shape, row_length, jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(row_length + 1)))):
        mid = (lo + hi) // 2
        value = table[row_start + jnp.minimum(mid, row_length - 1)]
        go_right = jnp.logical_and(mid < hi, value <= x)
        lo = jnp.where(go_right, mid + 1, lo)
        hi = jnp.where(go_right, hi, mid)
    return lo


def sample_batch(tables: dict, config: WorldConfig, batch_size: int, key) -> dict:
    """A training batch drawn on the device: ``{"user_id" [B], "history" [B, H],
    "target" [B]}`` (int32), the generative model of `SyntheticStream` with
    ``jax.random`` draws. ``tables``: `device_tables`."""
    import jax
    import jax.numpy as jnp

    c, m = config.num_topics, int(tables["item_cdf"].shape[0]) // config.num_topics
    count = config.history_length + 1
    k_user, k_topic, k_item = jax.random.split(key, 3)
    users = jax.random.randint(k_user, (batch_size,), 0, config.num_users, jnp.int32)
    x = jax.random.uniform(k_topic, (batch_size, count), jnp.float32)
    topics = _bisect_right(tables["user_cdf"], users[:, None] * c, c, x)
    topics = jnp.minimum(topics, c - 1)
    x = jax.random.uniform(k_item, (batch_size, count), jnp.float32)
    j = _bisect_right(tables["item_cdf"], topics * m, m, x)
    j = jnp.clip(j, 0, tables["num_in_topic"][topics] - 1)
    items = j * c + topics + 1
    return {"user_id": users, "history": items[:, :-1], "target": items[:, -1]}


def device_tables(world: World) -> dict:
    """The flat float32 tables `sample_batch` searches, on the default device."""
    import jax.numpy as jnp

    return {"user_cdf": jnp.asarray(world.user_cdf.reshape(-1)),
            "item_cdf": jnp.asarray(world.item_cdf.reshape(-1)),
            "num_in_topic": jnp.asarray(world.num_in_topic.astype(np.int32))}


__all__ = ["BANDS", "EVAL_BATCH_INDEX", "KS", "World", "WorldConfig", "device_tables",
           "popularity_bands", "sample_batch"]
