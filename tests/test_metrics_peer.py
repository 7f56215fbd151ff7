"""Recall@k and NDCG@k against an independent implementation: ranx (``pip install ranx``,
in the ``test`` extra).

Ours is what ``train``, ``compare`` and ``evaluate`` report: `pipelines.sequential.evaluate`
(`tfrs_logq.metrics.target_ranks` for each target's 0-based rank, then
`tfrs_logq.metrics.recall_ndcg_from_ranks`, the one place ranks become Recall and NDCG; the
two-tower evaluation of ``compare`` and ``evaluate --server`` call the same two functions).
ranx gets the same rankings as a run (every item's score, per query) and qrels (the target
alone, relevance 1), and computes ``recall@k``, ``hit_rate@k`` and ``ndcg@k`` (Järvelin and
Kekäläinen's ``rel / log2(position + 1)`` over 1-based positions, divided by the ideal DCG).

How the definitions line up:

- **One target per query.** Our protocol ranks one held-out target per query (one per test
  user and position), so the ideal DCG is 1, and ranx's Recall@k (relevant items in the top
  k over relevant items) is the hit rate: 1 when the target is among the top k, else 0.
  Ours is ``rank < k`` and ``1 / log2(rank + 2)`` for the 0-based rank; ranx's, the same at
  1-based position ``rank + 1``. The test checks Recall against both ``recall@k`` and
  ``hit_rate@k``, query by query and averaged.
- **History left out (exclude-seen, the default).** Offline ranking leaves out the ids the
  request sends, the target included (``docs/evaluation.md``). The peer's run for such a
  query simply lacks those items, as the served list does: a target among them is not in
  the run, so ranx scores it 0 at every cut-off, as our ``NOT_RETURNED`` rank does. The
  padding row (item 0) is no item and is in neither ranking. Under keep-seen nothing but
  padding is left out and a repeat target ranks like any other item.
- **Ties.** Ours counts every other item scoring at least the target's score as above it:
  the target takes the worst place of its tie. ranx orders tied items as its sort of the
  scores leaves them (an unstable sort: arbitrary, neither best nor worst for the target).
  So the equality checks use scores without ties (asserted); with ties, ours is at most
  ranx's for every query and metric, and equal to ranx's on a run whose ties are broken
  against the target (its score lowered below the items it tied with, above the next lower
  score). A constant model scores 0 at every cut-off below the catalog's size with ours.

The comparison can fail: a local copy of our formula with the log in another base, the
position off by one either way, or ``rank <= k`` as the cut-off disagrees with ranx.

ranx evaluates through numba: the first run in a fresh environment compiles its kernels
(about a minute on 2 cores) and caches them; later runs take seconds.
"""

import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq import metrics
from tfrs_logq.pipelines.sequential import evaluate

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import ranx

NUM_IDS = 31  # row 0 is padding; items 1..30
NUM_QUERIES = 90
HISTORY = 6
KS = (1, 3, 10, 20, 29)
REPEATS = 9  # queries whose target is among the ids the request sends
TOLERANCE = 1e-12


def _data(seed: int, exclude_seen: bool, scores=None) -> dict:
    """Random scores, left-padded histories and one target per query. Outside the repeat
    queries the target is the item at position ``i mod n`` of the query's ranking (n items
    ranked), so the targets' ranks cover every position: a cut-off off by one shows."""
    rng = np.random.default_rng(seed)
    if scores is None:
        scores = rng.standard_normal((NUM_QUERIES, NUM_IDS)).astype(np.float32)
    history = rng.integers(1, NUM_IDS, (NUM_QUERIES, HISTORY))
    for i in range(NUM_QUERIES):
        history[i, : rng.integers(0, HISTORY)] = 0  # left padding
    targets = np.zeros(NUM_QUERIES, np.int64)
    for i in range(NUM_QUERIES):
        seen = set(history[i].tolist()) - {0}
        if i < REPEATS:
            targets[i] = sorted(seen)[i % len(seen)]
            continue
        ranked = [d for d in range(1, NUM_IDS) if not (exclude_seen and d in seen)]
        ranked.sort(key=lambda d: -scores[i, d])
        targets[i] = ranked[i % len(ranked)]
    return {"scores": scores, "history": history, "targets": targets,
            "exclude": history if exclude_seen else None}


def _ours(data: dict, batch_size: int = 16):
    """`evaluate` on the data's rankings: the identity as item embeddings and each query's
    scores as its embedding, so the ranked scores are exactly ``data["scores"]``. Returns the
    mean figures and the per-target ranks."""
    starts = iter(range(0, NUM_QUERIES, batch_size))

    def query_fn(history):
        start = next(starts)
        np.testing.assert_array_equal(history.numpy(), data["history"][start:start + batch_size])
        return tf.constant(data["scores"][start:start + batch_size])

    ranks: list = []
    arrays = {k: data[k] for k in ("history", "targets", "exclude")}
    means = evaluate(query_fn, np.eye(NUM_IDS, dtype=np.float32), arrays, ks=KS,
                     batch_size=batch_size, per_target=ranks)
    return means, np.asarray(ranks, np.int64)


def _per_query(ranks, recall_ndcg=None) -> dict:
    """Per query, our figures: `recall_ndcg_from_ranks` (or a stand-in) of its one rank."""
    recall_ndcg = recall_ndcg or metrics.recall_ndcg_from_ranks
    rows = [recall_ndcg(np.asarray([r]), KS) for r in ranks]
    return {name: np.array([row[name] for row in rows]) for name in rows[0]}


def _peer_run(data: dict, scores=None) -> dict:
    scores = data["scores"] if scores is None else scores
    run = {}
    for i in range(NUM_QUERIES):
        left_out = set() if data["exclude"] is None else set(data["exclude"][i].tolist())
        run[f"q{i:03d}"] = {f"d{d}": float(scores[i, d])
                            for d in range(1, NUM_IDS) if d not in left_out}
    return run


def _peer(data: dict, run: dict) -> dict:
    """ranx's per-query figures, ``recall@k``, ``ndcg@k`` and ``hit_rate@k``, in query order."""
    qrels = ranx.Qrels({f"q{i:03d}": {f"d{int(t)}": 1} for i, t in enumerate(data["targets"])})
    names = [f"{m}@{k}" for k in KS for m in ("recall", "ndcg", "hit_rate")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba's type-safety notes
        out = ranx.evaluate(qrels, ranx.Run(run), names, return_mean=False,
                            make_comparable=True)
    assert list(qrels.keys()) == sorted(run)  # ranx's per-query order is ours
    return {name: np.asarray(values, np.float64) for name, values in out.items()}


def _disagreements(ours: dict, peer: dict) -> list:
    """Where our per-query figures differ from ranx's: Recall against ``recall@k`` and
    ``hit_rate@k``, NDCG against ``ndcg@k``. Empty when they agree."""
    wrong = []
    for k in KS:
        pairs = [(f"recall@{k}", f"recall@{k}"), (f"recall@{k}", f"hit_rate@{k}"),
                 (f"ndcg@{k}", f"ndcg@{k}")]
        for name, peer_name in pairs:
            differ = np.abs(ours[name] - peer[peer_name]) > TOLERANCE
            if differ.any():
                wrong.append(f"{name} vs ranx {peer_name}: queries {np.flatnonzero(differ)}")
    return wrong


@functools.lru_cache(maxsize=None)
def _case(exclude_seen: bool):
    data = _data(seed=1 if exclude_seen else 2, exclude_seen=exclude_seen)
    # No ties among the items a query ranks: the equality part needs none.
    for i in range(NUM_QUERIES):
        assert len(np.unique(data["scores"][i, 1:])) == NUM_IDS - 1
    means, ranks = _ours(data)
    return data, means, ranks, _peer(data, _peer_run(data))


@pytest.mark.parametrize("exclude_seen", [True, False], ids=["exclude-seen", "keep-seen"])
def test_recall_and_ndcg_equal_ranx_without_ties(exclude_seen):
    data, means, ranks, peer = _case(exclude_seen)
    assert _disagreements(_per_query(ranks), peer) == []
    for k in KS:  # evaluate's means are ranx's means
        assert means[f"recall@{k}"] == pytest.approx(peer[f"recall@{k}"].mean(), abs=TOLERANCE)
        assert means[f"ndcg@{k}"] == pytest.approx(peer[f"ndcg@{k}"].mean(), abs=TOLERANCE)
    # The rankings exercise what they should: hits and misses at every cut-off but the
    # catalog's, the repeat targets (misses under exclude-seen, ranked under keep-seen).
    assert set(range(NUM_IDS - 1)) <= set(ranks.tolist()) or exclude_seen
    repeats = ranks[:REPEATS]
    if exclude_seen:
        assert (repeats == metrics.NOT_RETURNED).all()
        assert (peer["recall@29"][:REPEATS] == 0).all()
    else:
        assert (repeats < NUM_IDS - 1).all()
    for k in KS[:-1]:
        assert 0 < means[f"recall@{k}"] < 1


def test_the_beam_evaluators_histogram_form_equals_ranx():
    _, _, ranks, peer = _case(True)
    histogram = metrics.rank_histogram(ranks, max(KS))
    figures = metrics.recall_ndcg_from_histogram(histogram, KS, KS)
    for k in KS:
        assert figures[f"recall@{k}"] == pytest.approx(peer[f"recall@{k}"].mean(), abs=TOLERANCE)
        assert figures[f"ndcg@{k}"] == pytest.approx(peer[f"ndcg@{k}"].mean(), abs=TOLERANCE)


def _cutoff_inclusive(ranks, ks):
    """`recall_ndcg_from_ranks` with the cut-off off by one (``rank <= k``)."""
    ranks = np.asarray(ranks)
    out = {}
    for k in ks:
        hit = ranks <= k
        out[f"recall@{k}"] = float(hit.mean())
        out[f"ndcg@{k}"] = float(np.where(hit, metrics.dcg_gain(ranks), 0.0).mean())
    return out


WRONG_GAINS = {
    "natural log": lambda r: 1.0 / np.log(np.asarray(r) + 2.0),
    "log10": lambda r: 1.0 / np.log10(np.asarray(r) + 2.0),
    "0-based rank read as 1-based position": lambda r: 1.0 / np.log2(np.asarray(r) + 3.0),
    "1-based position read as 0-based rank":
        lambda r: 1.0 / np.log2(np.maximum(np.asarray(r), 1) + 1.0),
}


@pytest.mark.parametrize("wrong", sorted(WRONG_GAINS))
def test_the_comparison_catches_a_wrong_ndcg(wrong, monkeypatch):
    _, _, ranks, peer = _case(False)
    # Our own function, its DCG gain replaced by a wrong one.
    monkeypatch.setattr(metrics, "dcg_gain", WRONG_GAINS[wrong])
    wrong_figures = _disagreements(_per_query(ranks), peer)
    assert wrong_figures and all(w.startswith("ndcg@") for w in wrong_figures)


def test_the_comparison_catches_a_cutoff_off_by_one():
    _, _, ranks, peer = _case(False)
    wrong = _disagreements(_per_query(ranks, _cutoff_inclusive), peer)
    # every cut-off below the catalog's size has a target at rank k
    assert {w.split(" ")[0] for w in wrong} >= {f"recall@{k}" for k in KS[:-1]}


def test_ties_count_against_the_target_unlike_ranx():
    """With ties ours is the worst place of the tie: at most ranx's (whose order within a
    tie is arbitrary) and equal to ranx's on a run whose ties are broken against the target.
    A constant model (the last queries) is a miss at every cut-off below the catalog's size."""
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, (NUM_QUERIES, NUM_IDS)).astype(np.float32)  # many ties
    scores[-10:] = 1.0  # a constant model
    for exclude_seen in (True, False):
        data = _data(seed=4, exclude_seen=exclude_seen, scores=scores)
        means, ranks = _ours(data)
        ours = _per_query(ranks)
        peer = _peer(data, _peer_run(data))
        for k in KS:
            for name, peer_name in ((f"recall@{k}", f"recall@{k}"), (f"ndcg@{k}", f"ndcg@{k}")):
                assert (ours[name] <= peer[peer_name] + TOLERANCE).all()
            if k < NUM_IDS - 1 - HISTORY:
                assert (ours[f"recall@{k}"][-10:] == 0).all()
        # The target below every item it tied with (the scores are integers: 0.5 lower
        # passes no other score).
        against = scores.astype(np.float64).copy()
        against[np.arange(NUM_QUERIES), data["targets"]] -= 0.5
        assert _disagreements(ours, _peer(data, _peer_run(data, against))) == []
        # The ties matter: ranx alone puts some tied targets higher.
        assert _disagreements(ours, peer) != []
