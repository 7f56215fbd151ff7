"""TFRS's retrieval tutorials' models, written from what the tutorials do, each built
around a task given to it, so that one test trains a flow with stock
`tfrs.tasks.Retrieval` and with `tfrs_logq.CorrectedRetrieval` swapped in.

The flows (TFRS docs/examples): basic retrieval (StringLookup + Embedding towers over
user ids and titles), featurization and deep retrieval (timestamps normalized and
discretized, titles through TextVectorization, Dense layers on top), multitask
(retrieval with a rating model), efficient serving (BruteForce and ScaNN indexes), a
sequential query tower (GRU over the history), and any of them under
`tf.distribute.MirroredStrategy`. (A ScaNN index serves the trained towers, as the
efficient-serving tutorial builds it; as a training metric its variables would join the
model's, which TFRS's tutorials never do.) The data is a small MovieLens-like log made here
(string user ids and titles, integer movie ids, timestamps, ratings).

How the model calls its task (``calls``):

- ``"stock"``: as TFRS's tutorials, no ids, no ``Q``;
- ``"stock-q"``: stock TFRS with ``candidate_sampling_probability`` (TFRS's logQ);
- ``"stock-ids"``: stock TFRS with ``candidate_ids`` (an index with identifiers);
- ``"switched"``: what docs/switching.md adds for tfrs-logq: ``candidate_ids`` and
  ``candidate_sampling_probability`` (``Q(d)`` from `tfrs_logq.ExactFrequency`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

import tfrs_logq

CALLS = ("stock", "stock-q", "stock-ids", "switched")


@dataclasses.dataclass
class Log:
    """A MovieLens-like log: train and test splits (dicts of arrays) and the catalog."""

    train: dict
    test: dict
    titles: np.ndarray
    movie_ids: np.ndarray


def make_log(num_users: int = 120, num_movies: int = 60, num_ratings: int = 1600,
             seed: int = 0, history: int = 5) -> Log:
    """Users in 4 taste clusters, Zipf popularity inside each cluster; the last fifth of
    the ratings (by time) is the test split. Each row carries the user's previous
    ``history`` titles (padded with "") for the sequential flow."""
    rng = np.random.default_rng(seed)
    titles = np.array([f"Movie {m} ({1960 + m % 40})" for m in range(num_movies)])
    movie_ids = np.arange(100, 100 + num_movies, dtype=np.int64)
    users = rng.integers(0, num_users, num_ratings)
    cluster = users % 4
    popularity = 1.0 / np.arange(1, num_movies // 4 + 1) ** 1.1
    within = rng.choice(popularity.size, num_ratings, p=popularity / popularity.sum())
    movies = (cluster * (num_movies // 4) + within) % num_movies
    timestamps = np.sort(rng.integers(880_000_000, 890_000_000, num_ratings))
    ratings = (1 + (movies + users) % 5).astype(np.float32)
    past = {u: [] for u in range(num_users)}
    histories = []
    for u, m in zip(users, movies):
        seen = past[u][-history:]
        histories.append([""] * (history - len(seen)) + [titles[i] for i in seen])
        past[u].append(m)
    rows = dict(
        user_id=np.array([f"u{u}" for u in users]),
        movie_title=titles[movies],
        movie_id=movie_ids[movies],
        timestamp=timestamps.astype(np.int64),
        user_rating=ratings,
        history=np.array(histories),
    )
    cut = int(num_ratings * 0.8)
    return Log(train={k: v[:cut] for k, v in rows.items()},
               test={k: v[cut:] for k, v in rows.items()},
               titles=titles, movie_ids=movie_ids)


def ml1m_log(data_dir: str, num_users: int = 300, history: int = 5) -> Log:
    """MovieLens-1M's ratings with timestamps (``ratings.dat.gz``, ``movies.dat.gz``: the
    ``ml-1m-partial`` layout) for the first ``num_users`` users, as the tutorials read
    MovieLens: string user ids and titles, integer movie ids, timestamps, ratings; the
    last fifth by time is the test split."""
    import gzip
    import os

    with gzip.open(os.path.join(data_dir, "movies.dat.gz"), "rt", encoding="latin-1") as f:
        names = dict(line.rstrip("\n").split("::")[:2] for line in f)
    rows = []
    with gzip.open(os.path.join(data_dir, "ratings.dat.gz"), "rt") as f:
        for line in f:
            user, movie, rating, stamp = line.split("::")
            if int(user) > num_users:
                break
            rows.append((int(stamp), int(user), int(movie), float(rating)))
    rows.sort()
    stamps, users, movies, ratings = (np.array(c) for c in zip(*rows))
    catalog = np.unique(movies)
    past: dict = {}
    histories = []
    for u, m in zip(users, movies):
        seen = past.setdefault(u, [])[-history:]
        histories.append([""] * (history - len(seen)) + [names[str(i)] for i in seen])
        past[u].append(m)
    split = dict(user_id=np.array([str(u) for u in users]),
                 movie_title=np.array([names[str(m)] for m in movies]),
                 movie_id=movies.astype(np.int64), timestamp=stamps.astype(np.int64),
                 user_rating=ratings.astype(np.float32), history=np.array(histories))
    cut = int(len(rows) * 0.8)
    titles = np.unique(split["movie_title"])
    return Log(train={k: v[:cut] for k, v in split.items()},
               test={k: v[cut:] for k, v in split.items()},
               titles=titles, movie_ids=catalog.astype(np.int64))


def dataset(split: dict, batch_size: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(split).batch(batch_size)


class TaskCaller:
    """The task's call as the flow writes it (``calls`` above); ``id_key`` names the
    candidate id feature ("movie_title" or "movie_id")."""

    def __init__(self, calls: str, frequency, id_key: str = "movie_title") -> None:
        assert calls in CALLS, calls
        self.calls, self.frequency, self.id_key = calls, frequency, id_key

    def kwargs(self, features) -> dict:
        ids = features[self.id_key]
        out = {}
        if self.calls in ("stock-ids", "switched"):
            out["candidate_ids"] = ids
        if self.calls in ("stock-q", "switched"):
            out["candidate_sampling_probability"] = self.frequency.probability(ids)
        return out


# -- basic retrieval -----------------------------------------------------------------------

def basic_towers(log: Log, dim: int = 16, id_key: str = "movie_title"):
    """The basic-retrieval tutorial's towers: StringLookup (IntegerLookup for integer ids)
    and Embedding."""
    users = np.unique(log.train["user_id"])
    user_model = tf.keras.Sequential([
        tf.keras.layers.StringLookup(vocabulary=users, mask_token=None),
        tf.keras.layers.Embedding(len(users) + 1, dim)])
    if id_key == "movie_id":
        lookup = tf.keras.layers.IntegerLookup(vocabulary=log.movie_ids, mask_token=None)
        size = len(log.movie_ids) + 1
    else:
        lookup = tf.keras.layers.StringLookup(vocabulary=log.titles, mask_token=None)
        size = len(log.titles) + 1
    movie_model = tf.keras.Sequential([lookup, tf.keras.layers.Embedding(size, dim)])
    return user_model, movie_model


class RetrievalModel(tfrs.Model):
    """The tutorials' ``MovielensModel``: query and candidate towers and a retrieval task."""

    def __init__(self, query_model, candidate_model, task, caller: TaskCaller,
                 query_key: str = "user_id") -> None:
        super().__init__()
        self.query_model = query_model
        self.candidate_model = candidate_model
        self.task = task
        self.caller = caller
        self.query_key = query_key

    def compute_loss(self, features, training=False):
        query_embeddings = self.query_model(features[self.query_key])
        candidate_embeddings = self.candidate_model(features[self.caller.id_key])
        return self.task(query_embeddings, candidate_embeddings,
                         **self.caller.kwargs(features))


# -- featurization and deep retrieval --------------------------------------------------------

class UserModel(tf.keras.Model):
    """User id, normalized timestamp and its discretized embedding (featurization tutorial)."""

    def __init__(self, log: Log, dim: int) -> None:
        super().__init__()
        users = np.unique(log.train["user_id"])
        self.user_embedding = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=users, mask_token=None),
            tf.keras.layers.Embedding(len(users) + 1, dim)])
        stamps = log.train["timestamp"].astype(np.float64)
        buckets = np.linspace(stamps.min(), stamps.max(), num=20)
        self.timestamp_embedding = tf.keras.Sequential([
            tf.keras.layers.Discretization(buckets.tolist()),
            tf.keras.layers.Embedding(len(buckets) + 1, dim)])
        self.normalized_timestamp = tf.keras.layers.Normalization(axis=None)
        self.normalized_timestamp.adapt(stamps)

    def call(self, inputs):
        return tf.concat([
            self.user_embedding(inputs["user_id"]),
            self.timestamp_embedding(inputs["timestamp"]),
            tf.reshape(self.normalized_timestamp(inputs["timestamp"]), (-1, 1)),
        ], axis=1)


class MovieModel(tf.keras.Model):
    """Title id embedding and the title's words averaged (TextVectorization)."""

    def __init__(self, log: Log, dim: int) -> None:
        super().__init__()
        self.title_embedding = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=log.titles, mask_token=None),
            tf.keras.layers.Embedding(len(log.titles) + 1, dim)])
        self.title_vectorizer = tf.keras.layers.TextVectorization(max_tokens=200)
        self.title_vectorizer.adapt(log.titles)
        self.title_text_embedding = tf.keras.Sequential([
            self.title_vectorizer,
            tf.keras.layers.Embedding(200, dim, mask_zero=True),
            tf.keras.layers.GlobalAveragePooling1D()])

    def call(self, titles):
        return tf.concat([self.title_embedding(titles), self.title_text_embedding(titles)],
                         axis=1)


def deep_towers(log: Log, dim: int = 16, layers=(32, 16)):
    """The deep-retrieval tutorial's towers: the featurized models under Dense layers."""
    def deep(base):
        model = tf.keras.Sequential([base])
        for size in layers[:-1]:
            model.add(tf.keras.layers.Dense(size, activation="relu"))
        model.add(tf.keras.layers.Dense(layers[-1]))
        return model

    return deep(UserModel(log, dim)), deep(MovieModel(log, dim))


class ContextRetrievalModel(RetrievalModel):
    """The query tower takes the whole feature dict (user id and timestamp)."""

    def compute_loss(self, features, training=False):
        query_embeddings = self.query_model(
            {"user_id": features["user_id"], "timestamp": features["timestamp"]})
        candidate_embeddings = self.candidate_model(features["movie_title"])
        return self.task(query_embeddings, candidate_embeddings,
                         **self.caller.kwargs(features))


# -- multitask -----------------------------------------------------------------------------

class MultitaskModel(tfrs.Model):
    """The multitask tutorial: a rating model and a retrieval task on shared towers."""

    def __init__(self, user_model, movie_model, retrieval_task, caller: TaskCaller,
                 rating_weight: float, retrieval_weight: float) -> None:
        super().__init__()
        self.user_model = user_model
        self.movie_model = movie_model
        self.rating_model = tf.keras.Sequential([
            tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(1)])
        self.rating_task = tfrs.tasks.Ranking(
            loss=tf.keras.losses.MeanSquaredError(),
            metrics=[tf.keras.metrics.RootMeanSquaredError()])
        self.retrieval_task = retrieval_task
        self.caller = caller
        self.rating_weight, self.retrieval_weight = rating_weight, retrieval_weight

    def compute_loss(self, features, training=False):
        user_embeddings = self.user_model(features["user_id"])
        movie_embeddings = self.movie_model(features["movie_title"])
        ratings = self.rating_model(tf.concat([user_embeddings, movie_embeddings], axis=1))
        rating_loss = self.rating_task(labels=features["user_rating"], predictions=ratings)
        retrieval_loss = self.retrieval_task(user_embeddings, movie_embeddings,
                                             **self.caller.kwargs(features))
        return self.rating_weight * rating_loss + self.retrieval_weight * retrieval_loss


# -- sequential ----------------------------------------------------------------------------

def gru_towers(log: Log, dim: int = 16):
    """The sequential-retrieval tutorial: a GRU over the history's title embeddings."""
    vocabulary = log.titles
    query_model = tf.keras.Sequential([
        tf.keras.layers.StringLookup(vocabulary=vocabulary, mask_token=""),
        tf.keras.layers.Embedding(len(vocabulary) + 2, dim, mask_zero=True),
        tf.keras.layers.GRU(dim)])
    candidate_model = tf.keras.Sequential([
        tf.keras.layers.StringLookup(vocabulary=vocabulary, mask_token=None),
        tf.keras.layers.Embedding(len(vocabulary) + 1, dim)])
    return query_model, candidate_model


# -- building and running a flow ----------------------------------------------------------

@dataclasses.dataclass
class Flow:
    """One tutorial flow: how to build its model around a task, its metric index."""

    name: str
    build: Callable  # (log, task, caller) -> tfrs.Model
    id_key: str = "movie_title"
    query_key: str = "user_id"
    metric_index: str = "streaming"  # or "streaming-ids": (id, embedding) pairs
    optimizer: Callable = lambda: tf.keras.optimizers.Adagrad(learning_rate=0.1)


def retrieval_flow(name, towers, **kwargs) -> Flow:
    model_class = kwargs.pop("model_class", RetrievalModel)
    query_key = kwargs.get("query_key", "user_id")

    def build(log, task, caller):
        query_model, candidate_model = towers(log)
        return model_class(query_model, candidate_model, task, caller, query_key=query_key)

    return Flow(name=name, build=build, **kwargs)


def multitask_flow(rating_weight: float, retrieval_weight: float) -> Flow:
    def build(log, task, caller):
        user_model, movie_model = basic_towers(log)
        return MultitaskModel(user_model, movie_model, task, caller, rating_weight,
                              retrieval_weight)

    return Flow(name=f"multitask-{rating_weight:g}-{retrieval_weight:g}", build=build)


FLOWS = {
    "basic": retrieval_flow("basic", basic_towers),
    "basic-integer-ids": retrieval_flow(
        "basic-integer-ids", lambda log: basic_towers(log, id_key="movie_id"),
        id_key="movie_id"),
    "basic-index-ids": retrieval_flow("basic-index-ids", basic_towers,
                                      metric_index="streaming-ids"),
    "deep-context": retrieval_flow("deep-context", deep_towers,
                                   model_class=ContextRetrievalModel),
    "multitask": multitask_flow(0.5, 0.5),
    "sequential-gru": retrieval_flow("sequential-gru", gru_towers, query_key="history"),
}


def candidates(log: Log, model, id_key: str) -> tf.data.Dataset:
    ids = log.movie_ids if id_key == "movie_id" else log.titles
    return tf.data.Dataset.from_tensor_slices(ids).batch(32).map(
        lambda i: (i, _candidate_model(model)(i)))


def _candidate_model(model):
    return getattr(model, "candidate_model", None) or model.movie_model


def metric_for(flow: Flow, log: Log, model, ks=(1, 5, 10)):
    """The flow's FactorizedTopK: over embeddings alone (as the tutorials build it) or over
    (id, embedding) pairs."""
    tower = _candidate_model(model)
    ids = log.movie_ids if flow.id_key == "movie_id" else log.titles
    items = tf.data.Dataset.from_tensor_slices(ids)
    if flow.metric_index == "streaming":
        return tfrs.metrics.FactorizedTopK(candidates=items.batch(32).map(tower), ks=ks)
    if flow.metric_index == "streaming-ids":
        return tfrs.metrics.FactorizedTopK(
            candidates=items.batch(32).map(lambda i: (i, tower(i))), ks=ks)
    raise ValueError(flow.metric_index)


def run(flow: Flow, log: Log, task_fn: Callable, calls: str, *, seed: int = 0,
        epochs: int = 1, batch_size: int = 256, strategy=None, frequency=None) -> dict:
    """Builds the flow's model around ``task_fn(metrics)``, trains it with `model.fit`,
    evaluates it with `model.evaluate`; returns the history, the evaluation and the model.

    The metric's candidate tower is the model's own, so the task is built after the
    towers: ``task_fn(metrics) -> task``, set on the model before compiling.
    """
    frequency = frequency or tfrs_logq.ExactFrequency.from_dataset(
        tf.data.Dataset.from_tensor_slices(log.train[flow.id_key]).batch(512))
    caller = TaskCaller(calls, frequency, flow.id_key)
    scope = strategy.scope() if strategy is not None else _null_scope()
    with scope:
        tf.keras.utils.set_random_seed(seed)
        holder = _TaskHolder()
        model = flow.build(log, holder, caller)
        metric = metric_for(flow, log, model)
        task = task_fn([metric])
        _set_task(model, task)
        model.compile(optimizer=flow.optimizer())
    history = model.fit(dataset(log.train, batch_size), epochs=epochs, verbose=0)
    test = dataset(log.test, batch_size)
    evaluation = model.evaluate(test, return_dict=True, verbose=0)
    return {"history": history.history, "evaluation": evaluation, "model": model,
            "frequency": frequency}


class _TaskHolder:
    """Stands in for the task while the towers are built (the metric needs them)."""


def _set_task(model, task) -> None:
    for attribute in ("task", "retrieval_task"):
        if isinstance(getattr(model, attribute, None), _TaskHolder):
            setattr(model, attribute, task)
            return
    raise AssertionError("the flow's model has no task attribute")


class _null_scope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def score_based_top_k(query_embeddings: np.ndarray, positive_embeddings: np.ndarray,
                      candidate_embeddings: np.ndarray, k: int,
                      tolerance: float = 1e-4) -> tuple[float, float]:
    """Bounds on TFRS's score-based top-k accuracy, from the formula: a query is a hit when
    fewer than ``k`` candidates score above its positive. Scores within ``tolerance`` of the
    positive's (float rounding of two matmul orders) give the lower and upper bound."""
    positive = np.sum(query_embeddings * positive_embeddings, axis=1, keepdims=True)
    scores = query_embeddings @ candidate_embeddings.T
    upper = np.mean(np.sum(scores > positive + tolerance, axis=1) < k)
    lower = np.mean(np.sum(scores > positive - tolerance, axis=1) < k)
    return float(lower), float(upper)


def id_based_top_k(query_embeddings: np.ndarray, candidate_embeddings: np.ndarray,
                   candidate_ids: np.ndarray, positive_ids: np.ndarray, k: int,
                   tolerance: float = 1e-4) -> tuple[float, float]:
    """Bounds on id-based top-k accuracy: the positive's id among the ``k`` best
    candidates; candidates tied with the ``k``-th within ``tolerance`` give the bounds."""
    scores = query_embeddings @ candidate_embeddings.T
    kth = -np.sort(-scores, axis=1)[:, k - 1:k]
    index = {value: i for i, value in enumerate(candidate_ids.tolist())}
    columns = np.array([index[value] for value in positive_ids.tolist()])
    own = scores[np.arange(len(columns)), columns][:, None]
    upper = np.mean(own >= kth - tolerance)
    lower = np.mean(own > kth + tolerance)
    return float(lower), float(upper)


def embeddings(model, flow: Flow, log: Log, split: Optional[dict] = None):
    """Query embeddings, positive embeddings and the catalog's, from the trained towers."""
    split = split or log.test
    query_model = getattr(model, "query_model", None) or model.user_model
    tower = _candidate_model(model)
    if isinstance(model, ContextRetrievalModel):
        queries = query_model({"user_id": split["user_id"], "timestamp": split["timestamp"]})
    else:
        queries = query_model(tf.constant(split[flow.query_key]))
    positives = tower(tf.constant(split[flow.id_key]))
    ids = log.movie_ids if flow.id_key == "movie_id" else log.titles
    catalog = tower(tf.constant(ids))
    return queries.numpy(), positives.numpy(), catalog.numpy(), ids
