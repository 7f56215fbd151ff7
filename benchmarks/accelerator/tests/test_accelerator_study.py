"""The accelerator study (`benchmarks/accelerator/`) against numpy references (its loss:
test_loss.py).

Runs without TensorFlow, on JAX:

    KERAS_BACKEND=jax .venv-keras/bin/python -m pytest -q benchmarks/accelerator/tests
"""

import dataclasses
import os
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "keras-logq"))
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.accelerator import driver, evaluate, model, runs, world  # noqa: E402

TINY = dict(num_items=300, num_users=40, num_topics=6, topic_sharpness=3.0, batch_size=32,
            embedding_dim=8, learning_rate=1e-2, num_eval_users=64, sampler="mixed",
            num_in_batch=16, num_uniform=16, proposal="mixture")


# ---------------------------------------------------------------------------- CRN

def test_common_random_numbers_across_corrections_and_proposals():
    a = runs.Run(**TINY, correction="corrected", eval_at=(5,))
    b = dataclasses.replace(a, correction="logq-tfrs", proposal="unigram")
    c = dataclasses.replace(a, seed=1)
    ca, cb, cc = (driver.step_config(r) for r in (a, b, c))
    w = world.World(a.world(), a.num_eval_users)
    tables = world.device_tables(w)
    for step in (0, 1, 7):
        batch_a, ids_a, valid_a = model.step_inputs(ca, tables, step)
        batch_b, ids_b, valid_b = model.step_inputs(cb, tables, step)
        for key in batch_a:
            np.testing.assert_array_equal(batch_a[key], batch_b[key])
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(valid_a, valid_b)
    params_a, params_b = model.init_params(ca), model.init_params(cb)
    for name in params_a:
        np.testing.assert_array_equal(params_a[name], params_b[name])
    # Another seed draws other batches, negatives and weights.
    batch_c, ids_c, _ = model.step_inputs(cc, tables, 0)
    batch_a, ids_a, _ = model.step_inputs(ca, tables, 0)
    assert not np.array_equal(batch_a["target"], batch_c["target"])
    assert not np.array_equal(ids_a, ids_c)
    assert not np.array_equal(model.init_params(cc)["item_embedding"],
                              params_a["item_embedding"])
    # The in-batch negatives are the batch's distinct targets; the uniform ones in 1..V.
    batch, ids, valid = model.step_inputs(ca, tables, 3)
    in_batch = np.asarray(ids)[16:][np.asarray(valid)[16:]]
    assert len(set(in_batch)) == len(in_batch)
    assert set(in_batch) <= set(np.asarray(batch["target"]))
    assert len(in_batch) == min(16, len(set(np.asarray(batch["target"]))))
    assert np.all((np.asarray(ids)[:16] >= 1) & (np.asarray(ids)[:16] <= a.num_items))


# ---------------------------------------------------------------------------- the world

def test_device_stream_draws_from_the_world():
    """Items drawn on the device follow Q = E_u P(d|u) (users are uniform): a chi-square
    statistic over the catalog within 6 standard deviations of its mean."""
    cfg = world.WorldConfig(num_items=60, num_users=50, num_topics=4, topic_sharpness=2.0)
    w = world.World(cfg, 8)
    tables = world.device_tables(w)
    counts = np.zeros(cfg.num_items + 1)
    for i in range(6):
        batch = world.sample_batch(tables, cfg, 4096, jax.random.PRNGKey(i))
        items = np.concatenate([np.asarray(batch["history"]).ravel(),
                                np.asarray(batch["target"])])
        counts += np.bincount(items, minlength=cfg.num_items + 1)
    n = counts.sum()
    expected = n * np.exp(w.log_q[1:])
    chi2 = ((counts[1:] - expected) ** 2 / expected).sum()
    dof = cfg.num_items - 1
    assert abs(chi2 - dof) < 6 * np.sqrt(2 * dof), chi2
    assert counts[0] == 0


def test_truth_against_brute_force():
    """``log P(d|u)`` and Q from the generative model written out item by item."""
    cfg = world.WorldConfig(num_items=50, num_users=30, num_topics=7, topic_sharpness=2.0)
    w = world.World(cfg, 16)
    z = cfg.topic_sharpness * np.random.default_rng(cfg.seed).standard_normal(
        (cfg.num_users, cfg.num_topics))
    p_topic = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    topic = (np.arange(1, cfg.num_items + 1) - 1) % cfg.num_topics
    pop = np.arange(1, cfg.num_items + 1, dtype=float) ** -cfg.zipf_exponent
    z_c = np.array([pop[topic == c].sum() for c in range(cfg.num_topics)])
    p = p_topic[:, topic] * pop / z_c[topic]  # [users, V]
    np.testing.assert_allclose(p.sum(1), 1.0)
    np.testing.assert_allclose(np.exp(w.log_q[1:]), p.mean(0), rtol=1e-12)
    users = w.eval_batch["user_id"]
    all_items = np.tile(np.arange(1, cfg.num_items + 1), (len(users), 1))
    np.testing.assert_allclose(np.exp(w.true_log_prob(np.arange(len(users)), all_items)),
                               p[users], rtol=1e-12)


def test_exact_recall_and_ranks_against_brute_force():
    r = runs.Run(**TINY, eval_at=(1,))
    w = world.World(r.world(), r.num_eval_users)
    params = model.init_params(driver.step_config(r))
    queries = np.asarray(model.query_embeddings(params, jnp.asarray(w.eval_batch["history"])))
    items = np.asarray(params["item_embedding"])[1:]
    scores = queries @ items.T
    targets = w.eval_batch["target"]
    # Small chunks: several device chunks and a padded last one.
    top, log_p, ranks = evaluate.model_top_k(queries, params["item_embedding"], targets, 100,
                                             chunk_floats=7 * r.num_items)
    want_top = np.argsort(-scores, axis=1, kind="stable")[:, :100] + 1
    true_p = np.exp(w.true_log_prob(np.arange(len(targets)),
                                    np.tile(np.arange(1, r.num_items + 1), (len(targets), 1))))
    for k in (1, 10, 100):
        got = np.take_along_axis(true_p, top[:, :k] - 1, 1).sum(1).mean()
        want = np.take_along_axis(true_p, want_top[:, :k] - 1, 1).sum(1).mean()
        assert abs(got - want) < 1e-6
        assert abs(w.exact_expected_recall(top, ks=(k,))[k] - want) < 1e-6
    target_scores = scores[np.arange(len(targets)), targets - 1]
    np.testing.assert_array_equal(ranks, (scores > target_scores[:, None]).sum(1))
    shifted = scores - scores.max(1, keepdims=True)
    want_log_p = target_scores - scores.max(1) - np.log(np.exp(shifted).sum(1))
    np.testing.assert_allclose(log_p, want_log_p, atol=1e-5)
    # The oracle: the sum of each user's largest k probabilities.
    truth = evaluate.truth_columns(w, chunk_floats=5 * r.num_items)
    for k in (10, 100):
        want = np.sort(true_p, axis=1)[:, ::-1][:, :k].sum(1).mean()
        assert abs(truth[f"oracle_exact_recall@{k}"] - want) < 1e-6


# ---------------------------------------------------------------------------- resume

class _Budget:
    """A clock with ``calls`` checks of plenty of time, then none."""

    def __init__(self, calls):
        self.calls = calls
        self.compile_seconds = 0.0

    def left(self):
        self.calls -= 1
        return 1e9 if self.calls >= 0 else 0.0


def test_resume_from_checkpoint_equals_uninterrupted(tmp_path):
    run = runs.Run(**TINY, correction="corrected", eval_at=(15, 30))
    w = world.World(run.world(), run.num_eval_users)
    truth = evaluate.truth_columns(w)

    def ctx(out, clock):
        return driver.Context(str(out), w, truth, clock, log=lambda m: None)

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    for out in (straight, stopped):
        out.mkdir()
    assert driver.run_one(run, ctx(straight, driver.Clock(None)), set()) == 2
    done = set()
    with pytest.raises(driver.OutOfTime):  # no time to start
        driver.run_one(run, ctx(stopped, _Budget(0)), done)
    assert not (stopped / "runs").exists() or not list((stopped / "runs").glob("*.npz"))
    with pytest.raises(driver.OutOfTime):  # stops after its first block of 10 steps
        driver.run_one(run, ctx(stopped, _Budget(2)), done)
    ckpt = list((stopped / "runs").glob("*.npz"))
    assert len(ckpt) == 1 and int(np.load(ckpt[0])["step"]) == 10
    # Then: 5 steps, the evaluation at 15, 15 steps, and no time to evaluate at 30.
    with pytest.raises(driver.OutOfTime):
        driver.run_one(run, ctx(stopped, _Budget(4)), done)
    assert int(np.load(ckpt[0])["step"]) == 30 and len(done) == 1
    assert driver.run_one(run, ctx(stopped, driver.Clock(None)), done) == 1
    assert int(np.load(ckpt[0])["step"]) == 30  # kept: a longer horizon goes on from it

    import csv

    def rows(out):
        with open(out / "results.csv") as f:
            return list(csv.DictReader(f))

    a, b = rows(straight), rows(stopped)
    assert [r["steps"] for r in a] == [r["steps"] for r in b] == ["15", "30"]
    metrics = driver.METRIC_COLUMNS
    for ra, rb in zip(a, b):
        assert {m: ra[m] for m in metrics} == {m: rb[m] for m in metrics}
        ha = driver.load_hits(str(straight), ra["run_id"])
        hb = driver.load_hits(str(stopped), rb["run_id"])
        assert sorted(ha) == sorted(hb)
        for name in ha:  # the resumed run's hits per user are the uninterrupted run's
            np.testing.assert_array_equal(ha[name], hb[name])
    assert b[0]["resumed_from_step"] == "10" and b[1]["resumed_from_step"] == "30"
    # A finished run is not run again; asked for more steps, it continues from 30.
    finished = driver.finished_rows(str(stopped / "results.csv"))
    assert driver.run_one(run, ctx(stopped, driver.Clock(None)), finished) == 0
    longer = dataclasses.replace(run, eval_at=(15, 30, 35))
    assert driver.run_one(longer, ctx(stopped, driver.Clock(None)), finished) == 1
    assert rows(stopped)[-1]["resumed_from_step"] == "30" and rows(stopped)[-1]["steps"] == "35"


def test_saved_hits_per_user_average_to_the_reported_recall(tmp_path):
    run = runs.Run(**TINY, correction="corrected", eval_at=(5, 20))  # the resume test's loop
    w = world.World(run.world(), run.num_eval_users)
    ctx = driver.Context(str(tmp_path), w, evaluate.truth_columns(w), driver.Clock(None),
                         log=lambda m: None)
    assert driver.run_one(run, ctx, set()) == 2
    import csv

    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(list((tmp_path / "hits").glob("*.npz"))) == 2
    n = run.num_eval_users
    for row in rows:
        hits = driver.load_hits(str(tmp_path), row["run_id"])
        assert hits["exact"].shape == hits["observed"].shape == (n, len(world.KS))
        assert hits["observed"].dtype == bool and list(hits["ks"]) == list(world.KS)
        np.testing.assert_array_equal(hits["user_id"], w.eval_batch["user_id"])
        np.testing.assert_array_equal(hits["target"], w.eval_batch["target"])
        np.testing.assert_array_equal(hits["band"], w.bands[w.eval_batch["target"]])
        for i, k in enumerate(world.KS):
            assert abs(hits["exact"][:, i].mean() - float(row[f"exact_recall@{k}"])) < 1e-12
            assert hits["observed"][:, i].mean() == float(row[f"observed_recall@{k}"])
            for b, band in enumerate(world.BANDS):
                in_band = hits["observed"][hits["band"] == b, i]
                assert in_band.mean() == float(row[f"{band}_recall@{k}"])
    # The last evaluation's hits against brute force over the saved weights.
    with np.load(next((tmp_path / "runs").glob("*.npz"))) as ckpt:
        assert int(ckpt["step"]) == 20
        params = {name.split("/", 1)[1]: jnp.asarray(ckpt[name]) for name in ckpt.files
                  if name.startswith("params/")}
    queries = np.asarray(model.query_embeddings(params, jnp.asarray(w.eval_batch["history"])))
    scores = queries @ np.asarray(params["item_embedding"])[1:].T
    targets = w.eval_batch["target"]
    true_p = np.exp(w.true_log_prob(np.arange(n), np.tile(np.arange(1, run.num_items + 1),
                                                         (n, 1))))
    order = np.argsort(-scores, axis=1, kind="stable")
    ranks = (scores > scores[np.arange(n), targets - 1][:, None]).sum(1)
    hits = driver.load_hits(str(tmp_path), rows[-1]["run_id"])
    for i, k in enumerate(world.KS):
        want = np.take_along_axis(true_p, order[:, :k], 1).sum(1)
        np.testing.assert_allclose(hits["exact"][:, i], want, atol=1e-6)
        np.testing.assert_array_equal(hits["observed"][:, i], ranks < k)
    with pytest.raises(FileNotFoundError, match="no hits"):
        driver.load_hits(str(tmp_path), run.row_id(7))


def test_presets_have_the_grid_of_the_issue():
    curve = runs.preset_runs("curve", seeds=[0])
    assert {(r.proposal, r.correction) for r in curve} == {
        (p, c) for p in ("mixture", "unigram")
        for c in ("corrected", "logq-tfrs", "logq-official", "corrected-w1")} | {
        ("mixture", "none")}
    assert all(r.eval_at == (3000, 10_000, 30_000, 100_000) and r.num_items == 1_000_000
               and r.num_uniform == r.num_in_batch == 4096 for r in curve)
    cell = runs.preset_runs("crosscheck")
    assert len(cell) == 6 and {r.seed for r in cell} == {0, 1, 2}


def test_count_overrides_replace_the_presets_negatives():
    small = runs.preset_runs("curve", seeds=[0], num_in_batch=32, num_uniform=16)
    assert {(r.sampler, r.num_in_batch, r.num_uniform) for r in small} == {("mixed", 32, 16)}
    with pytest.raises(ValueError, match="sampler"):
        runs.preset_runs("curve", sampler="uniform")
