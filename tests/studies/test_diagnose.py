"""Specification of `tfrs_logq.studies.diagnose`: sampled-gradient bias against the full softmax.

References are written here in numpy from the paper's formulas.
"""

import itertools
import json

import numpy as np
import pytest
import tensorflow as tf
from pipeline_data import write_ratings

from tfrs_logq.studies.diagnose import Proposal, diagnose, full_softmax_gradient


def _toy(num_items=5, num_queries=3, dim=3, seed=0):
    rng = np.random.default_rng(seed)
    items = rng.normal(size=(num_items, dim))
    queries = rng.normal(size=(num_queries, dim))
    positives = rng.integers(0, num_items, num_queries)
    unigram = rng.uniform(0.2, 1.0, num_items)
    return queries, items, positives, unigram / unigram.sum()


def reference_gradient(correction, u, items, p, negatives, log_q):
    """One draw's gradient w.r.t. u, from the formulas (hits masked)."""
    valid = [d for d in negatives if d != p]
    s = items @ u
    if correction == "corrected":
        if not valid:
            return np.zeros_like(u)
        log_q_prime = log_q[valid] - np.log1p(-np.exp(log_q[p]))
        z = s[valid] - log_q_prime
        pi = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        lse = z.max() + np.log(np.exp(z - z.max()).sum())
        w = 1.0 - 1.0 / (1.0 + np.exp(lse - np.log(len(valid)) - s[p]))
        return w * (-items[p] + pi @ items[valid])
    shift = np.zeros_like(log_q) if correction == "none" else log_q
    rows = [p] + valid
    z = s[rows] - shift[rows]
    if correction == "logq-official":
        z[0] = s[p]  # the positive uncorrected
    pi = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    return -items[p] + pi @ items[rows]


def test_full_softmax_gradient_is_chunk_independent_and_exact():
    q, items, pos, _ = _toy(num_items=50, num_queries=4)
    g, p_pos = full_softmax_gradient(q, items, pos, chunk_size=7)
    s = q @ items.T
    prob = np.exp(s - s.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    np.testing.assert_allclose(g, prob @ items - items[pos], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(p_pos, prob[np.arange(4), pos], rtol=1e-10)


@pytest.mark.parametrize("sampler", ["in-batch", "uniform", "mixed", "mixed-unigram"])
def test_exact_expectation_equals_numpy_enumeration(sampler):
    q, items, pos, unigram = _toy()
    k = 2
    result = diagnose(q, items, pos, unigram, samplers=[sampler], num_negatives=[k], exact=True)
    proposal = Proposal(sampler, k, unigram)
    n = len(unigram)
    # What each sampler's negatives are corrected with (k = 2: one uniform slot of two).
    log_q = {"in-batch": np.log(unigram), "uniform": np.full(n, -np.log(n)),
             "mixed": np.log(0.5 / n + 0.5 * unigram), "mixed-unigram": np.log(unigram)}[sampler]
    np.testing.assert_allclose(proposal.log_q(), log_q, rtol=1e-12)
    slots = [np.full(n, 1 / n)] * proposal.num_uniform + [unigram] * (k - proposal.num_uniform)
    g_star, p_pos = full_softmax_gradient(q, items, pos)
    for row in result["rows"]:
        c = row["correction"]
        expected = np.zeros_like(q)
        for combo in itertools.product(range(n), repeat=k):
            prob = np.prod([slots[i][d] for i, d in enumerate(combo)])
            for j in range(len(q)):
                expected[j] += prob * reference_gradient(c, q[j], items, pos[j], combo, log_q)
        bias = np.linalg.norm(expected - g_star, axis=1) / np.linalg.norm(g_star, axis=1)
        np.testing.assert_allclose(result["_per_query"][(sampler, k, c)]["bias"], bias,
                                   rtol=1e-6, err_msg=c)
        assert row["bias"] == pytest.approx(bias.mean(), rel=1e-6)


def test_monte_carlo_converges_to_the_exact_expectation():
    q, items, pos, unigram = _toy(seed=3)
    exact = diagnose(q, items, pos, unigram, num_negatives=[2], exact=True)
    mc = diagnose(q, items, pos, unigram, num_negatives=[2], num_draws=3000, seed=1)
    for a, b in zip(exact["rows"], mc["rows"]):
        assert b["bias"] == pytest.approx(a["bias"], abs=0.03), a["correction"]
        assert b["variance"] == pytest.approx(a["variance"], rel=0.1), a["correction"]


def _zipf_model(num_items=1500, num_queries=96, dim=12, seed=0):
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, num_items + 1)
    items = 0.5 * rng.normal(size=(num_items, dim))
    items[:, 0] = np.log(pop)  # scores carry popularity, as trained models do
    queries = 0.5 * rng.normal(size=(num_queries, dim))
    queries[:, 0] = 1.0
    s = queries @ items.T
    prob = np.exp(s - s.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    positives = np.array([rng.choice(num_items, p=p) for p in prob])
    return queries, items, positives, pop


def test_corrected_bias_is_below_standard_logq_and_shrinks_with_k():
    result = diagnose(*_zipf_model(), num_negatives=[8, 64], num_draws=60, seed=2)
    bias = {(r["k"], r["correction"]): r["bias"] for r in result["rows"]}
    for k in (8, 64):
        assert bias[(k, "corrected")] < 0.5 * bias[(k, "logq-tfrs")] < bias[(k, "none")]
    assert bias[(64, "corrected")] < 0.5 * bias[(8, "corrected")]
    decile_rows = [r for r in result["rows"] if r["k"] == 64][0]["by_decile"]
    assert sum(d["num_queries"] for d in decile_rows) == 96


def test_input_errors_name_the_problem():
    q, items, pos, unigram = _toy()
    with pytest.raises(ValueError, match="same dim"):
        diagnose(q[:, :2], items, pos, unigram)
    with pytest.raises(ValueError, match="positives must be item rows"):
        diagnose(q, items, pos + 10, unigram)
    with pytest.raises(ValueError, match="unigram"):
        diagnose(q, items, pos, -unigram)
    with pytest.raises(ValueError, match="sampler"):
        diagnose(q, items, pos, unigram, samplers=["popular"])
    with pytest.raises(ValueError, match="too large"):
        diagnose(q, items, pos, unigram, num_negatives=[64], exact=True)


def test_cli_on_the_synthetic_stream_writes_table_json_and_png(tmp_path, capsys):
    from tfrs_logq import cli

    out = tmp_path / "diag"
    code = cli.main(["diagnose", "--synthetic-items", "400", "--queries", "24",
                     "--num-sampled", "4", "16", "--draws", "20", "--output-dir", str(out),
                     "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((out / "diagnose.json").read_text())
    assert printed == saved and len(saved["rows"]) == 2 * 4  # every correction by default
    assert (out / "diagnose.png").stat().st_size > 1000
    assert "| in-batch | 16 | corrected |" in (out / "diagnose.md").read_text()
    assert not list(out.glob(".*tmp*"))


def test_cli_model_dir_that_is_not_a_run_is_a_one_line_error(tmp_path, capsys):
    from tfrs_logq import cli

    code = cli.main(["diagnose", "--model-dir", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "does not exist" in err


def test_mixed_sampler_offers_both_proposals_on_the_same_draws_and_labels_mns():
    """``mixed`` corrects with the mixture's own log Q, ``mixed-unigram`` with the unigram
    (the paper's convention, what ``mns-*`` trains), on the same random draws."""
    from tfrs_logq.studies.diagnose import SAMPLER_PROPOSALS, format_table

    q, items, pos, unigram = _toy(num_items=20, num_queries=6, seed=5)
    result = diagnose(q, items, pos, unigram, samplers=["mixed", "mixed-unigram"],
                      num_negatives=[4], num_draws=30, seed=3)
    per_query = result["_per_query"]
    # "none" ignores log Q: identical numbers prove the draws are the same.
    for key in ("bias", "variance", "cosine"):
        np.testing.assert_array_equal(per_query[("mixed", 4, "none")][key],
                                      per_query[("mixed-unigram", 4, "none")][key])
    assert not np.allclose(per_query[("mixed", 4, "corrected")]["bias"],
                           per_query[("mixed-unigram", 4, "corrected")]["bias"])
    assert "mns-*" in SAMPLER_PROPOSALS["mixed-unigram"]
    assert "mns" not in SAMPLER_PROPOSALS["mixed"]
    assert result["proposals"] == {s: SAMPLER_PROPOSALS[s] for s in ("mixed", "mixed-unigram")}
    table = format_table(result)
    assert "| mixed-unigram | 4 | corrected |" in table
    assert "- mixed-unigram: negatives corrected with unigram Q(d)" in table
    assert "what mns-* trains" in table.splitlines()[-1]


def test_cli_model_dir_logs_the_data_loading_line_once(tmp_path, capsys, monkeypatch):
    """`diagnose --model-dir` printed its data-loading line twice."""
    from tfrs_logq import cli
    from tfrs_logq.sasrec import trained
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data"
    write_ratings(data, users=30, items=20, per_user=10, first_item=1, zipf=1.5, rating=5)
    model_dir = tmp_path / "model"  # a training output's config.json (no weights)
    model_dir.mkdir()
    config = {"dataset": "ml-1m", "split": "loo", "data_dir": str(data),
              "data_format": "ratings", "max_length": 5, "temporal_fraction": None}
    (model_dir / "config.json").write_text(json.dumps(config))

    class Encoder:  # the trained encoder's two methods diagnose reads
        def last_query(self, history, training=False):
            return tf.cast(tf.one_hot(history[:, -1], 4), tf.float32)

        def item_embeddings(self):
            return tf.eye(num_items + 1, 4)

    from tfrs_logq.pipelines.datasets import load_dataset

    num_items = load_dataset("ml-1m", str(data), fmt="ratings", download_ok=False).num_items

    monkeypatch.setattr(trained, "load_trained", lambda d: (Encoder(), config, None))
    capsys.readouterr()
    code = cli.main(["diagnose", "--model-dir", str(model_dir), "--queries", "5",
                     "--num-sampled", "2", "--draws", "2", "--loss", "none"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert len([line for line in err.splitlines() if "ratings.dat" in line]) == 1, err


def test_plot_writes_the_png_whole_and_leaves_no_temporary(tmp_path):
    from tfrs_logq.studies import diagnose as diag

    result = diag.diagnose(*diag.synthetic_inputs(300, 16, seed=0), num_negatives=[4],
                           num_draws=5, seed=0)
    path = tmp_path / "diagnose.png"
    path.write_bytes(b"an older figure")
    diag.plot(result, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["diagnose.png"]


def test_the_regime_is_the_positives_share_of_the_standard_denominator():
    q, items, pos, unigram = _toy(num_items=40, num_queries=64, seed=3)
    result = diagnose(q, items, pos, unigram, samplers=["in-batch", "uniform", "mixed"],
                      num_negatives=[4, 32], corrections=["logq-tfrs"], num_draws=2)
    s = q @ items.T
    prob = np.exp(s - s.max(1, keepdims=True))
    prob /= prob.sum(1, keepdims=True)
    p = prob[np.arange(len(pos)), pos]
    regime = result["regime"]
    assert regime["p_positive"]["q50"] == pytest.approx(np.percentile(p, 50), rel=1e-9)
    proposals = {"in-batch": lambda k: unigram[pos], "uniform": lambda k: np.full(len(pos), 1 / 40),
                 "mixed": lambda k: (k // 2) / k / 40 + (1 - (k // 2) / k) * unigram[pos]}
    for entry in regime["samplers"]:
        q_p = proposals[entry["sampler"]]
        assert entry["p_over_q"]["q90"] == pytest.approx(np.percentile(p / q_p(4), 90), rel=1e-9)
        for k in (4, 32):
            ratio = p / q_p(k)
            assert entry["median_share"][k] == pytest.approx(np.median(ratio / (ratio + k)),
                                                             rel=1e-9)


def test_the_regimes_share_is_the_mean_share_in_sampled_standard_denominators():
    """The formula against Monte Carlo: draw k negatives from Q and measure the positive's
    share of sum_i exp(s_i - log Q(d_i)) + exp(s_p - log Q(p)) directly."""
    rng = np.random.default_rng(7)
    num_items, k = 200, 512
    items = rng.normal(size=(num_items, 4))
    queries = rng.normal(size=(16, 4)) * 1.5
    positives = rng.integers(0, num_items, 16)
    unigram = rng.uniform(0.1, 1.0, num_items)
    unigram /= unigram.sum()
    regime = diagnose(queries, items, positives, unigram, samplers=["in-batch"],
                      num_negatives=[k], corrections=["logq-tfrs"], num_draws=2)["regime"]
    s = queries @ items.T
    shares = []
    for _ in range(200):
        draws = rng.choice(num_items, size=(16, k), p=unigram)
        neg = np.exp(np.take_along_axis(s, draws, 1) - np.log(unigram[draws])).sum(1)
        pos_term = np.exp(s[np.arange(16), positives] - np.log(unigram[positives]))
        shares.append(pos_term / (pos_term + neg))
    # The median over queries of E[share] against the formula's median share.
    assert regime["samplers"][0]["median_share"][k] == pytest.approx(
        np.median(np.mean(shares, 0)), abs=0.02)
