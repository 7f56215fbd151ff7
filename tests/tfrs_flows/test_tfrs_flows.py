"""TFRS's retrieval tutorials' flows, trained with stock `tfrs.tasks.Retrieval` and with
`tfrs_logq.CorrectedRetrieval` swapped in (tutorial_models.py): ``none`` and ``logq-tfrs``
give stock's loss history and metrics; every correction trains, evaluates, and its
factorized metric equals the top-k accuracy computed here from the trained towers.

Each flow's trainings run in one fresh interpreter with one intra-op thread and op
determinism (tests/deterministic_process.py): the bit-for-bit claim is about the ops, and a
kernel's thread split in a busy test process is not (top-1 with a streaming index is decided
by one-ulp ties between a positive's two scores)."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tutorial_models as tm
from deterministic_process import configuration, run_deterministic

from tfrs_logq import CorrectedRetrieval

CORRECTIONS = ("none", "logq-tfrs", "logq-official", "corrected")
# Stock's call for the loss each correction reproduces: TFRS without Q is `none`, with Q
# `logq-tfrs`. Flows whose metric index has identifiers pass ids to stock too.
STOCK_CALLS = {"none": "stock", "logq-tfrs": "stock-q"}


def _stock_calls(flow, correction):
    calls = STOCK_CALLS[correction]
    if flow.metric_index == "streaming-ids":
        return {"stock": "stock-ids", "stock-q": "switched"}[calls]
    return calls


def _assert_same_run(ours, stock):
    """Bit for bit: the same ops in the same order train the same weights."""
    for key, values in stock["history"].items():
        np.testing.assert_array_equal(ours["history"][key], values, err_msg=key)
    assert ours["evaluation"].keys() == stock["evaluation"].keys()
    for key, value in stock["evaluation"].items():
        np.testing.assert_array_equal(ours["evaluation"][key], value, err_msg=key)


def _assert_metric_from_formula(flow, log, result, ks=(1, 5, 10)):
    """The evaluation's top-k accuracy is what TFRS's metric gives when handed what stock
    TFRS would hand it (ids only for an index with identifiers), and within the formula's
    bounds at k >= 5 (at k = 1 the positive ties with its own score in the index)."""
    model = result["model"]
    queries, positives, catalog, ids = tm.embeddings(model, flow, log)
    task = model.task if hasattr(model, "task") else model.retrieval_task
    metric = task.factorized_metrics[0]
    metric.reset_states()
    with_ids = flow.metric_index != "streaming"
    metric.update_state(tf.constant(queries), tf.constant(positives),
                        true_candidate_ids=tf.constant(log.test[flow.id_key]) if with_ids
                        else None)
    fresh = {k: float(m.result()) for k, m in zip(metric._ks, metric._top_k_metrics)}
    for k in ks:
        got = result["evaluation"][f"factorized_top_k/top_{k}_categorical_accuracy"]
        assert got == pytest.approx(fresh[k], abs=1.5 / len(queries)), (k, got, fresh[k])
        if k < 5:
            continue
        if flow.metric_index == "streaming":
            lower, upper = tm.score_based_top_k(queries, positives, catalog, k)
        else:
            lower, upper = tm.id_based_top_k(queries, catalog, ids, log.test[flow.id_key], k)
        assert lower - 1e-6 <= got <= upper + 1e-6, (k, got, lower, upper)


# Integer ids against an index of embeddings alone are also checked, faster, in
# test_drop_in.py (int32, int64 and strings).
FAST_FLOWS = ("basic", "basic-index-ids")
SLOW_FLOWS = ("basic-integer-ids", "deep-context", "multitask", "sequential-gru")


def _check_flow(flow_name, log=None, strategy=None):
    """Every check of a flow; run in the deterministic interpreter (``log``: the default
    made-up log when None, built there)."""
    assert configuration()["determinism"], "run through run_deterministic"
    log = log if log is not None else tm.make_log()
    flow = tm.FLOWS[flow_name]
    stock = {}
    for correction in STOCK_CALLS:
        stock[correction] = tm.run(
            flow, log, lambda metrics: tfrs.tasks.Retrieval(metrics=metrics),
            _stock_calls(flow, correction), strategy=strategy)
    for correction in CORRECTIONS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ours = tm.run(
                flow, log,
                lambda metrics: CorrectedRetrieval(metrics=metrics, correction=correction),
                "switched", strategy=strategy)
        ignored = [w for w in caught
                   if "ignores `candidate_sampling_probability`" in str(w.message)]
        assert len(ignored) == (1 if correction == "none" else 0), correction
        if correction in STOCK_CALLS:
            _assert_same_run(ours, stock[correction])
        _assert_metric_from_formula(flow, log, ours)
        assert np.isfinite(ours["history"]["loss"]).all()


@pytest.mark.parametrize("flow_name", FAST_FLOWS)
def test_flow_every_correction(flow_name):
    run_deterministic(_check_flow, flow_name)


@pytest.mark.slow
@pytest.mark.parametrize("flow_name", SLOW_FLOWS)
def test_flow_every_correction_slow(flow_name):
    run_deterministic(_check_flow, flow_name)


ML1M = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "ml-1m-partial")


@pytest.mark.slow
@pytest.mark.parametrize("flow_name", ["basic", "deep-context"])
def test_flow_on_movielens_1m(flow_name):
    """The tutorials' own data: MovieLens-1M ratings with timestamps (300 users, research
    use only, read from the shared data folder, never committed)."""
    if not os.path.exists(os.path.join(ML1M, "ratings.dat.gz")):
        pytest.skip("MovieLens-1M ratings (ml-1m-partial) not present")
    run_deterministic(_check_ml1m_flow, flow_name, ML1M)


def _check_ml1m_flow(flow_name, path):
    _check_flow(flow_name, tm.ml1m_log(path))
