"""The large-catalog study (`lab.study`): a tiny grid end to end, exact expected
recall against numpy, common random numbers, resume (`LazyAdam` is in test_lazy_adam.py)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from lab import study, study_grid

TINY = dict(num_items=2000, num_users=1000, num_topics=20, topic_sharpness=3.0,
            history_length=5, steps=12, batch_size=64, num_in_batch=64, num_uniform=32,
            embedding_dim=8, num_eval_users=128)


@pytest.fixture(scope="module")
def world():
    return study.World(study.Run(**TINY))


def test_common_random_numbers_two_corrections_see_the_same_batches_and_negatives(world):
    records = {}
    for correction in ("logq-tfrs", "corrected"):
        run = study.Run(**{**TINY, "sampler": "mixed", "correction": correction, "steps": 3})
        record: list = []
        model, _ = study.train(run, world.stream, study.proposal_log_q_table(run, world.log_q),
                               record)
        records[correction] = record
    a, b = records["logq-tfrs"], records["corrected"]
    assert len(a) == len(b) == 3
    for (batch_a, ids_a, valid_a), (batch_b, ids_b, valid_b) in zip(a, b):
        for key in batch_a:
            np.testing.assert_array_equal(batch_a[key], batch_b[key])
        np.testing.assert_array_equal(ids_a, ids_b)
        np.testing.assert_array_equal(valid_a, valid_b)
    # Negatives differ from step to step and from seed to seed, and so do batches.
    assert not np.array_equal(a[0][1], a[1][1])
    other = study.Run(**{**TINY, "sampler": "mixed", "seed": 1})
    batch = next(iter(study.train_batches(other, world.stream)))
    table = tf.zeros([other.num_items + 1])
    negatives = study.draw_negatives(other, batch["target"], tf.constant(0, tf.int64), table)
    assert not np.array_equal(negatives.ids.numpy(), a[0][1])
    assert not np.array_equal(batch["target"].numpy(), a[0][0]["target"])
    again = study.draw_negatives(other, batch["target"], tf.constant(0, tf.int64), table)
    np.testing.assert_array_equal(again.ids, negatives.ids)  # keyed by (seed, step) only


def test_same_seed_starts_from_the_same_weights():
    run = study.Run(**TINY)
    first = [w.numpy() for w in study.TowerModel(run).weights]
    second = [w.numpy() for w in study.TowerModel(dataclasses.replace(run, correction="none")
                                                  ).weights]
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)


def _numpy_true_probabilities(run: study.Run, users: np.ndarray) -> np.ndarray:
    """`[n, V + 1]` P(d|u) from the stream's definition (column 0: padding, 0)."""
    v, c = run.num_items, run.num_topics
    z = run.topic_sharpness * np.random.default_rng(run.world_seed).standard_normal(
        (run.num_users, c))
    logits = z[users]
    p_topic = np.exp(logits - logits.max(1, keepdims=True))
    p_topic /= p_topic.sum(1, keepdims=True)
    ids = np.arange(1, v + 1)
    topic = (ids - 1) % c
    pop = ids.astype(np.float64) ** -run.zipf_exponent
    z_topic = np.bincount(topic, weights=pop, minlength=c)
    p = p_topic[:, topic] * (pop / z_topic[topic])[None, :]
    return np.concatenate([np.zeros((len(users), 1)), p], axis=1)


def test_exact_expected_recall_is_the_true_mass_of_the_model_top_k(world):
    run = study.Run(**TINY)
    rng = np.random.default_rng(0)
    users = world.eval_batch["user_id"].numpy()
    queries = rng.standard_normal((len(users), 8)).astype(np.float32)
    items = rng.standard_normal((run.num_items + 1, 8)).astype(np.float32)
    top, _, _ = study.model_top_k(queries, items, 1000)
    got = study.exact_expected_recall(world.stream, users, top)
    p = _numpy_true_probabilities(run, users)
    scores = queries.astype(np.float64) @ items.T.astype(np.float64)
    scores[:, 0] = -np.inf  # padding is not an item
    order = np.argsort(-scores, axis=1, kind="stable")
    for k in study.KS:
        expected = np.take_along_axis(p, order[:, :k], axis=1).sum(1).mean()
        assert got[k] == pytest.approx(expected, rel=1e-5), k
    assert 0 < got[10] < got[100] < got[1000] <= 1.0
    # The oracle's top-k holds the most mass of any k items.
    oracle = np.sort(p, axis=1)[:, ::-1][:, :100].sum(1).mean()
    assert world.truth["oracle_exact_recall@100"] == pytest.approx(oracle, rel=1e-6)


def test_model_probability_rank_and_top_k_of_the_target_in_one_pass(monkeypatch):
    from tfrs_logq.metrics import target_ranks

    rng = np.random.default_rng(1)
    queries = rng.standard_normal((40, 4)).astype(np.float32)
    items = rng.standard_normal((300, 4)).astype(np.float32)
    items[0] = 100.0  # padding would top every list if it were scored
    targets = rng.integers(1, 300, 40)
    targets[:3] = [1, 299, 150]
    monkeypatch.setattr(study, "MAX_CHUNK_FLOATS", 7 * 299)  # chunks of 7 queries
    top, log_p, ranks = study.model_top_k(queries, items, 10, targets)
    s = queries.astype(np.float64) @ items[1:].T.astype(np.float64)
    expected = s[np.arange(40), targets - 1] - np.log(np.exp(s).sum(1))
    np.testing.assert_allclose(log_p, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(top, np.argsort(-s, axis=1, kind="stable")[:, :10] + 1)
    numpy_ranks = (s > s[np.arange(40), targets - 1][:, None]).sum(1)
    np.testing.assert_array_equal(ranks, numpy_ranks)
    np.testing.assert_array_equal(ranks, target_ranks(queries, items, targets))
    assert study.model_top_k(queries, items, 10)[1:] == (None, None)


def test_popularity_bands_split_the_interaction_mass_in_thirds(world):
    q = np.exp(world.log_q[1:])
    bands = world.bands[1:]
    for b in range(3):
        assert q[bands == b].sum() == pytest.approx(1 / 3, abs=0.05)
    assert q[bands == 0].min() >= q[bands == 1].max() >= q[bands == 2].max()


def test_tiny_grid_runs_end_to_end_writes_its_files_and_resumes(tmp_path, world):
    runs = study.grid({**TINY, "steps": 8},
                      {"negatives": [("mixed", 64, 32)], "proposal": ["unigram"],
                       "correction": ["logq-tfrs", "corrected"]}, seeds=[0])
    assert [r.correction for r in runs] == ["logq-tfrs", "corrected"]
    out = str(tmp_path / "study")
    said: list = []
    study_grid.run_grid(runs, out, max_runs=1, say=said.append)  # "killed" after one run
    assert len(study_grid.read_results(out)) == 1 and len(study_grid.pending(runs, out)) == 1
    first = study_grid.read_results(out)[0]
    said.clear()
    rows = study_grid.run_grid(runs, out, say=said.append)
    assert said[0].startswith("study: 1 of 2 runs already")
    assert sum(line.startswith("run ") for line in said) == 1  # the finished one is skipped
    assert [r["correction"] for r in rows] == ["logq-tfrs", "corrected"]
    assert rows[0] == first
    for name in ("results.csv", "table.md", "paired.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    with open(os.path.join(out, "results.csv"), newline="") as f:
        header = next(csv.reader(f))
    for column in ["num_items", "sampler", "num_in_batch", "num_uniform", "proposal",
                   "correction", "seed", "steps", "optimizer", "head_recall@1000",
                   "truth_p_over_q_q50", "model_p_over_q_q50"] + [
            f"{kind}_recall@{k}" for kind in ("exact", "observed") for k in study.KS]:
        assert column in header, column
    table = open(os.path.join(out, "table.md")).read()
    assert "corrected (unigram) − logq-tfrs (unigram)" in table
    assert "## Where the correction matters" in table and "| logq-tfrs (unigram) | 1 |" in table
    assert study_grid.run_grid(runs, out, say=said.append) and not study_grid.pending(runs, out)
    # The truth columns were computed once and cached for the next process.
    with open(os.path.join(out, "truth.json")) as f:
        assert list(json.load(f).values()) == [world.truth]


def test_world_reads_its_truth_columns_from_the_cache(tmp_path, monkeypatch, world):
    cache = str(tmp_path / "truth.json")
    first = study.World(study.Run(**TINY), cache)
    monkeypatch.setattr(study, "truth_columns", lambda *a: pytest.fail("not cached"))
    assert study.World(study.Run(**TINY), cache).truth == first.truth == world.truth


def test_grid_skips_duplicate_and_undefined_variants():
    runs = study.grid(TINY, {"negatives": [("in-batch", 64, 0), ("mixed", 64, 32)],
                             "proposal": list(study.PROPOSALS),
                             "correction": list(study.CORRECTIONS)}, seeds=[0])
    pairs = {(r.sampler, r.proposal, r.correction) for r in runs}
    assert ("in-batch", "mixture", "corrected") not in pairs  # a = 0: same as unigram
    assert ("mixed", "inclusion", "corrected") not in pairs
    assert ("in-batch", "inclusion", "corrected") in pairs
    assert sum(r.correction == "none" for r in runs) == 2  # none ignores Q
    assert len(runs) == 14
    with pytest.raises(ValueError, match="sampler='in-batch'"):
        study.Run(**{**TINY, "sampler": "mixed", "proposal": "inclusion"})


def test_mixture_for_pure_in_batch_runs_as_unigram_and_presets_are_distinct():
    runs = study.grid(TINY, {"negatives": [("in-batch", 64, 0), ("mixed", 64, 32)],
                             "proposal": ["mixture"], "correction": ["corrected"]}, seeds=[0])
    assert [(r.sampler, r.proposal) for r in runs] == [("in-batch", "unigram"),
                                                       ("mixed", "mixture")]
    for name in study.PRESETS:
        preset = study.preset_runs(name)
        assert len({r.run_id for r in preset}) == len(preset), name
    sweep = study.preset_runs("sweep")
    assert {r.num_topics for r in sweep} == {100, 1_000, 10_000}
    assert {(r.sampler, r.proposal) for r in sweep} == {("in-batch", "unigram"),
                                                        ("mixed", "mixture")}
    assert len(sweep) == 3 * 2 * 3 * 3
    samplers = study.preset_runs("samplers")
    assert {(r.sampler, r.proposal) for r in samplers} == {
        ("in-batch", "unigram"), ("in-batch", "inclusion"), ("uniform", "unigram"),
        ("uniform", "mixture"), ("mixed", "unigram"), ("mixed", "mixture")}
    main, extra = samplers[:6 * 2 * 3], samplers[6 * 2 * 3:]
    assert {r.num_topics for r in main} == {10_000}
    # The part after the main grid: the sweep's C = 1,000 in-batch cell, both proposals.
    assert len(extra) == 2 * 2 * 3 and {r.num_topics for r in extra} == {1_000}
    assert {(r.sampler, r.proposal) for r in extra} == {("in-batch", "unigram"),
                                                        ("in-batch", "inclusion")}
    sweep_ids = {r.run_id for r in sweep}
    assert sum(r.run_id in sweep_ids for r in extra) == 2 * 3  # the unigram half, re-run
    scale = study.preset_runs("scale")
    assert len(scale) == 3 * 3 * 3
    assert {(r.num_items, r.topic_sharpness) for r in scale} == {
        (100_000, 8.0), (1_000_000, 8.0), (100_000, 4.0)}
    # Its 100,000-item reference is the sweep's C = 10,000 in-batch cell, re-run on its pin.
    reference = [r for r in scale if (r.num_items, r.topic_sharpness) == (100_000, 8.0)]
    assert all(r.run_id in sweep_ids for r in reference)
    # The negatives preset's 256 + 256 cell is the samplers' (mixture proposal), same runs.
    negatives = study.preset_runs("negatives")
    assert len(negatives) == 2 * 2 * 3
    assert {(r.num_in_batch, r.num_uniform) for r in negatives} == {(256, 256), (1024, 1024)}
    samplers_ids = {r.run_id for r in samplers}
    assert sum(r.run_id in samplers_ids for r in negatives) == 2 * 3


def test_negatives_are_not_the_streams_draws_at_seed_0(world):
    """Seed 0 of world 0 once keyed its negatives like the stream's batch 0 ([0, 0]), so
    every uniform negative was the batch's user draw scaled (neg - 1 = user mod users)."""
    run = study.Run(**{**TINY, "sampler": "uniform", "num_uniform": 64, "seed": 0})
    batch = next(iter(study.train_batches(run, world.stream)))
    negatives = study.draw_negatives(run, batch["target"], tf.constant(0, tf.int64),
                                     tf.zeros([run.num_items + 1]))
    users = batch["user_id"].numpy()
    same = (negatives.ids.numpy() - 1) % run.num_users == users[:64] % run.num_users
    assert same.mean() < 0.1


def test_inclusion_runs_weight_with_the_inclusion_estimate():
    for proposal, expected in (("inclusion", "inclusion"), ("unigram", "per_draw")):
        run = study.Run(**{**TINY, "sampler": "in-batch", "proposal": proposal})
        assert study.make_task(run).proposal == expected


def test_proposals_and_the_positive_column():
    log_q = np.log(np.array([np.nan, 0.5, 0.3, 0.2]))
    log_q[0] = -np.inf
    base = {**TINY, "num_items": 3, "num_topics": 1, "batch_size": 4}
    mixed = study.Run(**{**base, "sampler": "mixed", "num_in_batch": 3, "num_uniform": 1,
                         "proposal": "mixture"})
    np.testing.assert_allclose(np.exp(study.proposal_log_q_table(mixed, log_q)[1:]),
                               0.25 / 3 + 0.75 * np.array([0.5, 0.3, 0.2]))
    inclusion = study.Run(**{**base, "sampler": "in-batch", "proposal": "inclusion"})
    np.testing.assert_allclose(np.exp(study.proposal_log_q_table(inclusion, log_q)[1:]),
                               1 - (1 - np.array([0.5, 0.3, 0.2])) ** 4)
    table = tf.constant([0.0, -1.0, -2.0, -3.0])
    positives = tf.constant([1, 3], tf.int64)
    for correction in ("logq-tfrs", "logq-official", "corrected"):
        run = study.Run(**{**TINY, "correction": correction})
        np.testing.assert_array_equal(study.positive_log_q(run, table, positives),
                                      [-1.0, -3.0])


@pytest.mark.parametrize("sampler", ["mixed", "in-batch"])
def test_logq_official_trains_as_logq_tfrs_with_the_positives_log_q_zeroed(world, monkeypatch,
                                                                          sampler):
    """The loop passes the task ``logq-official``; before, it passed ``logq-tfrs`` with
    ``log Q(p) = 0`` in the positives' columns. The trained weights are the same."""
    from tfrs_logq.tasks import CorrectedRetrieval
    from tfrs_logq.towers import loop

    run = study.Run(**{**TINY, "sampler": sampler, "correction": "logq-official", "steps": 4})
    table = study.proposal_log_q_table(run, world.log_q)
    new, _ = study.train(run, world.stream, table)
    monkeypatch.setattr(loop, "positive_log_q",
                        lambda run, table, positives: tf.zeros(tf.shape(positives)))
    monkeypatch.setattr(loop, "make_task", lambda run: CorrectedRetrieval(
        correction="logq-tfrs", remove_accidental_hits=True))
    old, _ = study.train(run, world.stream, table)
    for a, b in zip(new.weights, old.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    monkeypatch.undo()
    other, _ = study.train(study.Run(**{**TINY, "sampler": sampler, "steps": 4,
                                        "correction": "logq-tfrs"}), world.stream, table)
    assert not all(np.allclose(a.numpy(), b.numpy())
                   for a, b in zip(new.weights, other.weights))  # the test can fail


def test_eval_at_rows_equal_shorter_runs_and_survive_a_kill(tmp_path, world, monkeypatch):
    # Issue 38: one run evaluated along its learning curve. The row at step s is the
    # s-step run's (same batches, weights, negatives; constant learning rate), keyed as
    # it; a kill after an evaluation neither loses nor repeats it.
    curve = study.Run(**{**TINY, "steps": 6, "eval_at": (4, 2, 4)})
    assert curve.eval_at == (2, 4)
    assert curve.evaluations == tuple(study.Run(**{**TINY, "steps": s}).run_id
                                      for s in (2, 4, 6))
    assert "eval_at" not in study.Run(**TINY).run_id  # older grids keep their keys
    with pytest.raises(ValueError, match="eval_at"):
        study.Run(**{**TINY, "steps": 6, "eval_at": (6,)})
    out = str(tmp_path / "curve")
    rows = study_grid.run_grid([curve], out, say=lambda m: None)
    assert [int(r["steps"]) for r in rows] == [2, 4, 6] and "eval_at" not in rows[0]
    short = study.execute(study.Run(**{**TINY, "steps": 4}), world)
    for key in ("exact_recall@10", "exact_recall@1000", "observed_recall@100", "model_p_q50"):
        assert float(rows[1][key]) == pytest.approx(short[key], rel=1e-6), key
    assert float(rows[0]["exact_recall@100"]) != float(rows[2]["exact_recall@100"])

    # Killed while evaluating step 4 (after the step-2 row was written): the rerun writes
    # the rows of 4 and 6 once each, and step 2 is not evaluated again.
    out2 = str(tmp_path / "killed")
    real = study.evaluate
    calls = []

    def dies_at_the_second(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(study, "evaluate", dies_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        study_grid.run_grid([curve], out2, say=lambda m: None)
    assert [int(r["steps"]) for r in study_grid.read_results(out2)] == [2]
    assert study_grid.pending([curve], out2) == [curve]
    monkeypatch.setattr(study, "evaluate", real)
    again = study_grid.run_grid([curve], out2, say=lambda m: None)
    assert [int(r["steps"]) for r in again] == [2, 4, 6] and not study_grid.pending([curve], out2)
    for a, b in zip(rows, again):
        assert a["exact_recall@100"] == b["exact_recall@100"]


def test_budget_and_curve_presets():
    budget = study.preset_runs("budget")
    assert len(budget) == 27 and {r.eval_at for r in budget} == {(1000, 4000)}
    assert {r.num_in_batch + r.num_uniform for r in budget} == {256, 1024, 4096}
    assert all(r.num_in_batch <= r.batch_size for r in budget)
    curve = study.preset_runs("curve")
    assert [r.correction for r in curve] == ["logq-tfrs", "logq-official", "corrected"]
    assert curve[0].eval_at == (3000, 10_000, 30_000) and curve[0].steps == 100_000
