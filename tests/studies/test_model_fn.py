"""`tfrs_logq.compare_model`: the user's own TFRS model, written as TFRS's quickstart writes it
(StringLookup + Embedding towers over string user ids and item titles, Adagrad), compared
through the API: results and report, a killed comparison resumed to identical rows, common
random numbers across losses, and bad input refused in one line before any training."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
from tensorboard_events import hparams_trial, scalars

import tfrs_logq
from tfrs_logq.studies._grid import read_rows
from tfrs_logq.studies.compare.model_fn import ComparedTask, _random_generators, training_batches
from tfrs_logq.studies.compare.plan import CompareError
from tfrs_logq.studies.compare.runner import hits_path, load_hits

USERS = [f"u{u}" for u in range(80)]
TITLES = [f"Movie {i} (1999)" for i in range(120)]
LOSSES = ("inbatch-logq-tfrs", "inbatch-corrected")


@pytest.fixture(scope="module")
def movielens():
    """``(train, test, candidates)`` shaped as TFRS's quickstart: ratings of 80 users, each
    drawn from one of 4 genres (titles i = genre mod 4), and a held-out rating per user
    with the user's training titles as the history to leave out."""
    rng = np.random.default_rng(0)
    ratings = [(u, TITLES[int(rng.choice(np.arange(int(u[1:]) % 4, 120, 4)))])
               for u in USERS for _ in range(12)]
    held_out = [(u, TITLES[int(rng.choice(np.arange(int(u[1:]) % 4, 120, 4)))]) for u in USERS]
    seen = {u: [t for v, t in ratings if v == u] for u in USERS}
    train = tf.data.Dataset.from_tensor_slices({"user_id": [u for u, _ in ratings],
                                                "movie_title": [t for _, t in ratings]})
    test = tf.data.Dataset.from_tensor_slices((
        [u for u, _ in held_out], [t for _, t in held_out],
        tf.ragged.constant([seen[u] for u, _ in held_out])))
    candidates = tf.data.Dataset.from_tensor_slices((TITLES, TITLES))
    return train, test, candidates


class MovielensModel(tfrs.Model):
    """TFRS's quickstart model, built around the task it is given (its one change: the task
    and ``candidate_ids``); a Dropout on the query tower, whose masks must be common
    random numbers too."""

    def __init__(self, task, dropout: float = 0.3):
        super().__init__()
        self.query_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=USERS, mask_token=None),
            tf.keras.layers.Embedding(len(USERS) + 1, 8),
            tf.keras.layers.Dropout(dropout)])
        self.candidate_model = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=TITLES, mask_token=None),
            tf.keras.layers.Embedding(len(TITLES) + 1, 8)])
        self.task = task

    def compute_loss(self, features, training=False):
        return self.task(self.query_model(features["user_id"], training=training),
                         self.candidate_model(features["movie_title"]),
                         candidate_ids=features["movie_title"])


def build(task):
    model = MovielensModel(task)
    model.compile(optimizer=tf.keras.optimizers.Adagrad(learning_rate=0.1))
    return model


def _compare(data, output_dir, **kwargs):
    train, test, candidates = data
    options = dict(candidate_id="movie_title", losses=LOSSES, seeds=(0,), steps=8,
                   eval_every=4, window=2, batch_size=32, say=lambda line: None)
    return tfrs_logq.compare_model(kwargs.pop("model_fn", build), train, test, candidates,
                                   output_dir=str(output_dir), **{**options, **kwargs})


RUN_FACTS = ("seconds_per_step", "resumed_from_step", "machine")


class Killed(Exception):
    pass


def test_a_tutorial_model_is_compared_and_a_killed_comparison_resumes_to_the_same_rows(
        movielens, tmp_path):
    whole = tmp_path / "whole"
    calls: list = []

    def served_index(items, queries, ks):  # records what it was called with
        calls.append((np.array(items), np.array(queries), ks))
        return {"kind": "brute-force", "parameters": None, "recall": {str(k): 1.0 for k in ks}}

    rows = _compare(movielens, whole, served_index=served_index)
    assert [(r["loss"], r["seed"]) for r in rows] == [(loss, "0") for loss in LOSSES]
    # The hook got every candidate's embedding and the test queries', those the exact
    # evaluation ranked: numpy ranks them, the history left out, to the final Recall@10.
    _, test, _ = movielens
    targets = [TITLES.index(t.decode()) for _, t, _ in test.as_numpy_iterator()]
    seen = [[TITLES.index(x.decode()) for x in h] for _, _, h in test.as_numpy_iterator()]
    final = read_rows(str(whole / "curves.csv"))
    assert len(calls) == 2
    for loss, (items, queries, ks) in zip(LOSSES, calls):
        assert items.shape == (120, 8) and queries.shape == (80, 8) and ks == (10, 100)
        scores = queries @ items.T
        for row, history in enumerate(seen):
            scores[row, history] = -np.inf
        target = scores[np.arange(80), targets]
        recall = np.mean((scores > target[:, None]).sum(axis=1) < 10)
        last = next(r for r in final if r["loss"] == loss and r["steps"] == "8")
        assert recall == pytest.approx(float(last["recall@10"]))
    assert "brute force serves the exact top-k" in (whole / "report.md").read_text()
    for row in rows:
        assert row["window_steps"] == "4 8" and 0.0 <= float(row["recall@100"]) <= 1.0
        assert float(row["repeat_share"]) >= 0 and row["num_users"] == "80"
        assert row["diverged"] == "0" and 0 < float(row["positive_share_q50"]) < 1
    for name in ("report.md", "results.csv", "curves.csv", "plan.json", "paired.png"):
        assert os.path.getsize(whole / name) > 0
    assert not os.listdir(whole / "runs")  # finished runs' checkpoints removed
    plan = json.loads((whole / "plan.json").read_text())
    assert plan["fixed"]["model"] == "tfrs-model"
    config = plan["fixed"]["config"]
    assert config["model_fn"].endswith(":build") and config["optimizer"] == "Adagrad"
    assert (config["learning_rate"], config["embedding_dim"], config["history_length"]) == (
        0.1, 8, 12)
    assert "Model: tfrs-model, 8 steps of 32, embedding 8" in (whole / "report.md").read_text()

    # Killed in its first run (at the evaluation of step 4, its checkpoint at step 3), then
    # stopped after that run, then finished: the rows of the uninterrupted comparison.
    killed = tmp_path / "killed"

    def kill(line):
        if line.startswith("  step 4:"):
            raise Killed

    with pytest.raises(Killed):
        _compare(movielens, killed, say=kill, checkpoint_seconds=0)  # one after every step
    assert not (killed / "results.csv").exists()
    first = _compare(movielens, killed, max_runs=1)
    assert len(first) == 1 and first[0]["resumed_from_step"] == "3"
    again = _compare(movielens, killed)
    for resumed, uninterrupted in zip(again, rows, strict=True):
        for key in set(resumed) | set(uninterrupted):
            if key not in RUN_FACTS:
                assert resumed.get(key) == uninterrupted.get(key), key
    # Each run's hits per test user (80 users, one target each) at its last evaluation:
    # the final Recall and NDCG, and the same after the kill and resume.
    curves = read_rows(str(whole / "curves.csv"))
    for loss in LOSSES:
        hits = load_hits(hits_path(str(whole), loss, 0))
        resumed = load_hits(hits_path(str(killed), loss, 0))
        assert sorted(hits) == sorted(resumed) and all(
            np.array_equal(hits[k], resumed[k]) for k in hits)
        assert len(hits["users"]) == 80 and set(hits["targets"]) == {1}
        final = next(r for r in curves if r["loss"] == loss and r["steps"] == "8")
        for k in (10, 100):
            assert hits[f"hits@{k}"].sum() / 80 == pytest.approx(float(final[f"recall@{k}"]))
            assert hits[f"gain@{k}"].sum() / 80 == pytest.approx(float(final[f"ndcg@{k}"]))
    # TensorBoard: each run's evaluations once across the kill (step 4 was logged before
    # the kill, not again on resume), equal to curves.csv; the optimizer's learning rate.
    killed_curves = read_rows(str(killed / "curves.csv"))
    for loss in LOSSES:
        logdir = killed / "logs" / f"{loss}-seed0"
        test, train = scalars(logdir / "test"), scalars(logdir / "train")
        mine = {int(r["steps"]): r for r in killed_curves if r["loss"] == loss}
        assert [step for step, _ in test["recall@10"]] == [4, 8]
        for step, value in test["recall@10"]:
            assert value == pytest.approx(float(mine[step]["recall@10"]), abs=1e-7)
        assert [v for _, v in train["learning_rate"]] == pytest.approx([0.1, 0.1])
        assert hparams_trial(logdir).hparams["optimizer"].string_value == "Adagrad"
    # Another model in the same directory is another plan.
    with pytest.raises(CompareError, match="another plan"):
        _compare(movielens, killed, model_fn=lambda task: build(task), max_runs=0)


def test_the_runs_of_a_seed_share_their_first_batch_initial_weights_and_dropout_seeds(
        movielens):
    built, batches = [], []

    class Recording(MovielensModel):
        def compute_loss(self, features, training=False):
            if training and tf.executing_eagerly() and len(batches) < len(built):
                batches.append({k: v.numpy().tolist() for k, v in features.items()})
            return super().compute_loss(features, training)

    def recording(task):
        model = Recording(task)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1), run_eagerly=True)
        model.query_model(tf.constant(USERS[:1]))  # built here, to see the initial weights
        model.candidate_model(tf.constant(TITLES[:1]))
        built.append((task.correction, [w.numpy() for w in model.trainable_variables],
                      [g.state.numpy() for g in _random_generators(model)]))
        return model

    import tempfile

    with tempfile.TemporaryDirectory() as out:
        _compare(movielens, out, model_fn=recording, losses=("inbatch-none", "inbatch-corrected"),
                 seeds=(3,), steps=1, eval_every=1, window=1)
    # The check before training builds one model, then each run one.
    assert [correction for correction, _, _ in built] == ["none", "none", "corrected"]
    reference = built[0]
    assert len(reference[2]) == 1  # the Dropout draws from a seeded generator
    for _, weights, generators in built[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(weights, reference[1], strict=True))
        assert all(np.array_equal(a, b) for a, b in zip(generators, reference[2], strict=True))
    assert len(batches) == 2 and batches[0] == batches[1]
    train = movielens[0]
    first = [next(iter(training_batches(train, seed, 32)))["movie_title"].numpy().tolist()
             for seed in (3, 3, 4)]
    assert first[0] == first[1] != first[2]
    assert batches[0]["movie_title"] == first[0]  # fit trained on the seed's batches


class OwnTask(MovielensModel):
    """Ignores the task it is given: TFRS's stock Retrieval of its own."""

    def __init__(self, task):
        super().__init__(task)
        self.own_task = tfrs.tasks.Retrieval()

    def compute_loss(self, features, training=False):
        return self.own_task(self.query_model(features["user_id"]),
                             self.candidate_model(features["movie_title"]))


class NoIds(MovielensModel):
    def compute_loss(self, features, training=False):
        return self.task(self.query_model(features["user_id"]),
                         self.candidate_model(features["movie_title"]))


def _compiled(cls):
    def model_fn(task):
        model = cls(task)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
        return model
    return model_fn


@pytest.mark.parametrize("case, match", [
    ("keras_model", "returned a Sequential, not a tfrs.Model"),
    ("own_task", "never calls the task it was given"),
    ("no_candidate_ids", "calls its task without candidate_ids"),
    ("not_compiled", "not compiled: compile it there"),
    ("candidates_without_ids", r"candidates must yield \(id, features\) pairs"),
    ("not_importable", "no module named 'no_such_module_of_theirs'"),
    ("no_such_function", "module 'json' has no function 'no_such_function'"),
    ("not_module_function", "is not 'module:function'"),
    ("batched_train", "train must yield one example at a time"),
    ("unknown_target", "1 of the 80 test targets are not candidates"),
])
def test_bad_input_is_one_line_before_any_training(movielens, tmp_path, case, match):
    train, test, candidates = movielens
    kwargs = {}
    if case == "keras_model":
        kwargs["model_fn"] = lambda task: tf.keras.Sequential([tf.keras.layers.Dense(2)])
    elif case == "own_task":
        kwargs["model_fn"] = _compiled(OwnTask)
    elif case == "no_candidate_ids":
        kwargs["model_fn"] = _compiled(NoIds)
    elif case == "not_compiled":
        kwargs["model_fn"] = MovielensModel
    elif case == "candidates_without_ids":
        candidates = tf.data.Dataset.from_tensor_slices(TITLES)
    elif case == "not_importable":
        kwargs["model_fn"] = "no_such_module_of_theirs:build"
    elif case == "no_such_function":
        kwargs["model_fn"] = "json:no_such_function"
    elif case == "not_module_function":
        kwargs["model_fn"] = "build"
    elif case == "batched_train":
        train = train.batch(4)
    elif case == "unknown_target":
        test = test.map(lambda u, t, h: (u, tf.where(u == "u5", "Not a movie", t), h))
    out = tmp_path / "out"
    with pytest.raises(CompareError, match=match) as error:
        _compare((train, test, candidates), out, **kwargs)
    assert "\n" not in str(error.value)
    assert not out.exists()  # refused before the output directory (and any training)


def test_the_task_looks_q_up_by_id_from_the_training_frequencies(movielens):
    """``Q(d) = #d / N`` of the training set (an unseen id: one count), looked up by the
    ``candidate_ids`` the model passes: the loss of `CorrectedRetrieval` given that log Q."""
    from tfrs_logq.studies.compare.model_fn import _read_data

    train, test, candidates = movielens
    data = _read_data(train, test, candidates, "movie_title", 32)
    titles = [t.decode() for t in np.concatenate(
        [b["movie_title"].numpy() for b in train.batch(10_000)])]
    counts = {t: titles.count(t) for t in set(titles)}
    for title in (TITLES[0], TITLES[1], "not a title"):
        expected = np.log(max(counts.get(title, 0), 1) / len(titles))
        log_q = float(data.frequency.log_q(tf.constant([title]))[0])
        assert log_q == pytest.approx(expected, rel=1e-5)
    task = ComparedTask("logq-official", data.frequency)
    q = tf.constant([[1.0, 0.0]])
    items = tf.constant([[1.0, 0.0], [0.5, 0.0], [0.5, 0.0]])
    popular = max(counts, key=counts.get)
    rare = min(counts, key=counts.get)
    loss_popular_negative = task(q, items, candidate_ids=tf.constant(["x", popular, rare]))
    stock = tfrs_logq.CorrectedRetrieval(correction="logq-official")
    log_q = data.frequency.log_q(tf.constant(["x", popular, rare]))
    assert float(loss_popular_negative) == pytest.approx(float(stock(
        q, items, candidate_ids=tf.constant(["x", popular, rare]),
        candidate_log_sampling_probability=log_q)))
    assert task.calls == 1


ML1M = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
                    "ml-1m-partial")


def ml1m_datasets():
    """``(train, test, candidates, vocabularies)`` of ML-1M's ratings of users 1-2999 (the
    timestamped part, ../shared/data/ml-1m-partial; research use only, never committed) as
    TFRS's featurization tutorial reads MovieLens: each user's last rating is the test
    target, found from the user id and its time, the user's earlier titles left out of
    the ranking; None when the data is not on this machine."""
    import gzip

    paths = [os.path.join(ML1M, name) for name in ("ratings.dat.gz", "movies.dat.gz")]
    if not all(os.path.exists(p) for p in paths):
        return None
    with gzip.open(paths[1], "rt", encoding="latin-1") as f:
        titles = dict(line.rstrip("\n").split("::")[:2] for line in f)
    with gzip.open(paths[0], "rt") as f:
        ratings = np.array([line.split("::") for line in f], dtype=np.int64)
    users, movies, times = ratings[:, 0], ratings[:, 1], ratings[:, 3]
    order = np.lexsort((times, users))
    users, movies, times = users[order], movies[order], times[order]
    last = np.r_[users[1:] != users[:-1], True]  # each user's last rating
    title = np.array([titles[str(m)] for m in movies])
    user = users.astype(str)
    train = tf.data.Dataset.from_tensor_slices({"user_id": user[~last],
                                                "movie_title": title[~last],
                                                "timestamp": times[~last]})
    history = tf.RaggedTensor.from_row_lengths(  # each user's earlier titles, in order
        title[~last], np.bincount(users[~last], minlength=users.max() + 1)[users[last]])
    test = tf.data.Dataset.from_tensor_slices((
        {"user_id": user[last], "timestamp": times[last]}, title[last], history))
    catalog = np.array(sorted(set(titles.values())))
    candidates = tf.data.Dataset.from_tensor_slices((catalog, catalog))
    text = tf.keras.layers.TextVectorization(max_tokens=2_000)
    text.adapt(catalog)
    vocabularies = {"users": np.unique(user), "titles": catalog,
                    "tokens": text.get_vocabulary()[2:],
                    "buckets": np.linspace(times.min(), times.max(), 50).tolist(),
                    "time_mean": float(times.mean()), "time_var": float(times.var())}
    return train, test, candidates, vocabularies


class UserModel(tf.keras.Model):
    """The featurization tutorial's query features: the user id, the rating's time
    bucketized and normalized."""

    def __init__(self, v: dict, dim: int):
        super().__init__()
        self.user_embedding = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=v["users"], mask_token=None),
            tf.keras.layers.Embedding(len(v["users"]) + 1, dim)])
        self.timestamp_embedding = tf.keras.Sequential([
            tf.keras.layers.Discretization(v["buckets"]),
            tf.keras.layers.Embedding(len(v["buckets"]) + 2, dim)])
        self.normalized_timestamp = tf.keras.layers.Normalization(
            axis=None, mean=v["time_mean"], variance=v["time_var"])

    def call(self, inputs):
        return tf.concat([self.user_embedding(inputs["user_id"]),
                          self.timestamp_embedding(inputs["timestamp"]),
                          tf.reshape(self.normalized_timestamp(inputs["timestamp"]), (-1, 1))],
                         axis=1)


class MovieModel(tf.keras.Model):
    """The tutorial's candidate features: the title, and its words."""

    def __init__(self, v: dict, dim: int):
        super().__init__()
        self.title_embedding = tf.keras.Sequential([
            tf.keras.layers.StringLookup(vocabulary=v["titles"], mask_token=None),
            tf.keras.layers.Embedding(len(v["titles"]) + 1, dim)])
        self.title_text_embedding = tf.keras.Sequential([
            tf.keras.layers.TextVectorization(vocabulary=v["tokens"]),
            tf.keras.layers.Embedding(len(v["tokens"]) + 2, dim, mask_zero=True),
            tf.keras.layers.GlobalAveragePooling1D()])

    def call(self, titles):
        return tf.concat([self.title_embedding(titles), self.title_text_embedding(titles)],
                         axis=1)


class FeaturizedModel(tfrs.Model):
    """TFRS's deep retrieval tutorial, small: a dense layer over each tower's features;
    built around the task it is given, ``candidate_ids`` passed."""

    def __init__(self, task, v: dict, dim: int = 16):
        super().__init__()
        self.query_model = tf.keras.Sequential([UserModel(v, dim), tf.keras.layers.Dense(dim)])
        self.candidate_model = tf.keras.Sequential([MovieModel(v, dim),
                                                    tf.keras.layers.Dense(dim)])
        self.task = task

    def compute_loss(self, features, training=False):
        query_embeddings = self.query_model({"user_id": features["user_id"],
                                             "timestamp": features["timestamp"]})
        return self.task(query_embeddings, self.candidate_model(features["movie_title"]),
                         candidate_ids=features["movie_title"])


@pytest.mark.slow  # 3 seeds x 2 losses of a featurized model on ML-1M (about 2 min, 2 cores)
def test_a_featurized_model_on_ml1m_through_the_api(tmp_path):
    from tfrs_logq.studies.compare.plan import load_plan
    from tfrs_logq.studies.compare.report import paired

    data = ml1m_datasets()
    if data is None:
        pytest.skip("../shared/data/ml-1m-partial is not on this machine")
    train, test, candidates, vocabularies = data

    def model_fn(task):
        model = FeaturizedModel(task, vocabularies)
        model.compile(optimizer=tf.keras.optimizers.Adagrad(0.1))
        return model

    out = tmp_path / "ml1m"
    losses = ("inbatch-logq-tfrs", "inbatch-corrected")
    rows = tfrs_logq.compare_model(
        model_fn, train, test, candidates, candidate_id="movie_title", losses=losses,
        seeds=(0, 1, 2), steps=30, eval_every=15, window=2, batch_size=1024,
        shuffle_buffer=20_000, output_dir=str(out), source="ML-1M, users 1-2999",
        say=lambda line: None)
    assert sorted((r["loss"], r["seed"]) for r in rows) == sorted(
        (loss, str(s)) for loss in losses for s in (0, 1, 2))
    assert all(0 < float(r["recall@100"]) <= 1 and r["diverged"] == "0" for r in rows)
    assert all(r["num_users"] == "2999" for r in rows)
    report = (out / "report.md").read_text()
    assert "Model: tfrs-model" in report and "ML-1M, users 1-2999" in report
    assert paired(rows, load_plan(str(out)), losses[1], "recall@100", reference=losses[0])[
        "n"] == 3
