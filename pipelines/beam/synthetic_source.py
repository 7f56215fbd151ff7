"""The synthetic input of the pipeline: `SyntheticStream`'s model, drawn in chunks by Beam workers.

``--dataset synthetic`` replaces the data file by a generator with the model of
`tfrs_logq.pipelines.synthetic.SyntheticStream` (Zipf popularity ``d^-s``, items
in ``C`` topics, user topic preferences ``softmax(sigma * z_u)``), drawn with
numpy only (a worker never imports TensorFlow):

- user ``u`` (``0..num_users-1``) has a sequence of ``history_length + 2`` items
  drawn independently from ``P(. | u)``; the leave-one-out split trains on the
  first ``history_length``, validates on the next one and tests on the last;
- users come in chunks of ``users_per_chunk``; chunk ``k`` (its users' topic
  logits and their items) is drawn by ``numpy.random.default_rng([seed, k])``,
  so the data depends on ``(spec, k)`` only, never on the number of workers or on
  which worker draws which chunk.

A Beam job starts from ``Create(range(num_chunks))``; each worker draws its chunks
(`draw_chunk`). The draws are numpy's, so they are not `SyntheticStream`'s (a
TensorFlow stateless stream), but the model and its ``P(d | u)`` are the same
given the user logits `draw_chunk` returns.
"""

from __future__ import annotations

import dataclasses

import numpy as np

DATASET = "synthetic"


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """The synthetic data of a pipeline run.

    Attributes:
      num_users, num_items: int. Users ``0..num_users-1``, items ``1..num_items``.
      history_length: int. Training items per user (each user has two more: the
        validation and the test target).
      seed: int. Every draw depends on it.
      num_topics, zipf_exponent, topic_sharpness: `SyntheticConfig`'s (50, 1.05, 2.5).
      users_per_chunk: int. Users drawn as one element. Defaults to 2,000.
    """

    num_users: int = 10_000
    num_items: int = 5_000
    history_length: int = 20
    seed: int = 0
    num_topics: int = 50
    zipf_exponent: float = 1.05
    topic_sharpness: float = 2.5
    users_per_chunk: int = 2_000

    def __post_init__(self) -> None:
        for name in ("num_users", "num_items", "history_length", "num_topics",
                     "users_per_chunk"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"synthetic `{name}` must be a positive int, received "
                                 f"{value!r}.")
        if self.num_topics > self.num_items:
            raise ValueError(f"synthetic `num_topics` ({self.num_topics}) cannot exceed "
                             f"`num_items` ({self.num_items}).")
        if not self.zipf_exponent > 0 or not self.topic_sharpness >= 0:
            raise ValueError("synthetic `zipf_exponent` must be positive and "
                             "`topic_sharpness` non-negative.")

    @property
    def num_chunks(self) -> int:
        return -(-self.num_users // self.users_per_chunk)

    @property
    def sequence_length(self) -> int:
        return self.history_length + 2

    @property
    def train_interactions(self) -> int:
        return self.num_users * self.history_length

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class ItemTable:
    """`SyntheticStream`'s topic-major cumulative table of item probabilities, in numpy
    (`[C * M]` float64; ``M = ceil(V / C)``; 80 MB at V = 10M)."""

    def __init__(self, spec: SyntheticSpec):
        v, c = spec.num_items, spec.num_topics
        self.num_topics, self.items_per_topic = c, -(-v // c)
        log_pop = -spec.zipf_exponent * np.log(np.arange(1, v + 1, dtype=np.float64))
        topic = np.arange(v) % c
        top = np.full(c, -np.inf)
        np.maximum.at(top, topic, log_pop)
        sums = np.bincount(topic, np.exp(log_pop - top[topic]), minlength=c)
        log_norm = top + np.log(sums)
        probs = np.zeros((c, self.items_per_topic))
        probs[topic, np.arange(v) // c] = np.exp(log_pop - log_norm[topic])
        table = np.minimum(np.cumsum(probs, axis=1), 1.0)
        self.num_in_topic = np.bincount(topic, minlength=c)
        table[np.arange(c), self.num_in_topic - 1] = 1.0
        self.cdf = (table + np.arange(c)[:, None]).reshape(-1)

    def sample(self, topics: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Items ``1..V`` of the given topics (same shapes), from uniforms in [0, 1)."""
        position = np.searchsorted(self.cdf, topics + uniform, side="right")
        j = np.clip(position - topics * self.items_per_topic, 0,
                    self.num_in_topic[topics] - 1)
        return j * self.num_topics + topics + 1


def draw_chunk(spec: SyntheticSpec, chunk: int, table: ItemTable):
    """``(users, logits, items)`` of chunk ``chunk``: `[n]` user ids, their `[n, C]`
    topic logits and `[n, history_length + 2]` int64 items (a pure function of
    ``(spec, chunk)``)."""
    start = chunk * spec.users_per_chunk
    users = np.arange(start, min(spec.num_users, start + spec.users_per_chunk), dtype=np.int64)
    n, c, length = len(users), spec.num_topics, spec.sequence_length
    rng = np.random.default_rng([spec.seed, chunk])
    logits = spec.topic_sharpness * rng.standard_normal((n, c))
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    cum = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
    cum[:, -1] = 1.0
    # One binary search per draw in the rows laid end to end (row r spans [r, r + 1)).
    offsets = np.arange(n, dtype=np.float64)[:, None]
    flat = (cum + offsets).reshape(-1)
    u = rng.random((n, length))
    topics = np.searchsorted(flat, u + offsets, side="right") - np.arange(n)[:, None] * c
    topics = np.clip(topics, 0, c - 1)
    items = table.sample(topics, rng.random((n, length)))
    return users, logits, items.astype(np.int64)


def chunk_training_ids(spec: SyntheticSpec, chunk: int, table: ItemTable) -> np.ndarray:
    """`[n, history_length]` training items of a chunk's users."""
    return draw_chunk(spec, chunk, table)[2][:, :spec.history_length]


def generate_ids(spec: SyntheticSpec) -> np.ndarray:
    """`[num_users, history_length + 2]` every user's items, in one process (tests)."""
    table = ItemTable(spec)
    return np.concatenate([draw_chunk(spec, k, table)[2] for k in range(spec.num_chunks)])
