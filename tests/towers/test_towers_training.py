"""The two-tower trainer on a `Split` (`tfrs_logq.towers.training`): its examples against
a direct construction, common random numbers, learning, exact resume, bad configs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tfrs_logq.corrections import LossName
from tfrs_logq.pipelines.interactions import build_interactions
from tfrs_logq.pipelines.splits import make_split
from tfrs_logq.towers import training
from tfrs_logq.towers.config import TwoTowerConfig
from tfrs_logq.towers.training import Examples


def _topic_log(num_users=300, num_items=120, length=14, seed=0):
    """Each user reads items of one of 6 topics (item % 6), in time order."""
    rng = np.random.default_rng(seed)
    users, items, times = [], [], []
    for u in range(num_users):
        topic = u % 6
        chosen = rng.choice(np.arange(topic, num_items, 6), length, replace=True)
        users += [u] * length
        items += list(chosen)
        times += list(range(u * 100, u * 100 + length))
    return build_interactions(np.array(users), np.array(items), np.array(times),
                              min_item_interactions=1)


@pytest.fixture(scope="module")
def split():
    return make_split(_topic_log(), "loo")


def test_examples_are_every_training_target_but_the_first_with_the_items_before_it(split):
    examples = Examples(split, history_length=4)
    expected = []
    for seq in split.train_sequences():
        for t in range(1, len(seq)):
            history = list(seq[max(0, t - 4):t])
            expected.append((tuple([0] * (4 - len(history)) + history), int(seq[t])))
    assert len(examples) == len(expected)
    batch = examples.batch(seed=3, step=7, batch_size=256)
    pairs = set(expected)
    for history, target in zip(batch["history"], batch["target"]):
        assert (tuple(int(x) for x in history), int(target)) in pairs
    again = examples.batch(seed=3, step=7, batch_size=256)  # a function of (seed, step)
    np.testing.assert_array_equal(again["history"], batch["history"])
    assert not np.array_equal(examples.batch(3, 8, 256)["target"], batch["target"])
    assert not np.array_equal(examples.batch(4, 7, 256)["target"], batch["target"])


def test_losses_map_to_the_studys_forms():
    spec = training.run_spec(TwoTowerConfig(loss="mns-logq-tfrs", batch_size=64,
                                            num_negatives=32), num_items=100)
    assert spec.loss_name == LossName("mns", "logq-tfrs")  # parsed once, held by the spec
    assert (spec.proposal, spec.correction) == ("mixture", "logq-tfrs")
    assert (spec.num_in_batch_negatives, spec.num_uniform_negatives) == (64, 32)
    spec = training.run_spec(TwoTowerConfig(loss="inbatch-logq-official"), num_items=100)
    assert (spec.proposal, spec.correction, spec.num_uniform_negatives) == (
        "unigram", "logq-official", 0)
    assert TwoTowerConfig(steps=1200, eval_every=500).eval_steps == (500, 1000, 1200)


def test_the_loss_is_parsed_and_stays_out_of_the_fields():
    config = TwoTowerConfig(loss="mns-logq-official")
    assert config.loss_name == LossName("mns", "logq-official")
    replaced = dataclasses.replace(config, loss="inbatch-none")
    assert replaced.loss_name == LossName("inbatch", "none")
    assert "loss_name" not in config.run_id and "loss_name" not in dataclasses.asdict(config)
    assert TwoTowerConfig(**config.__dict__) == config
    assert replaced == TwoTowerConfig(loss="inbatch-none")


@pytest.mark.parametrize("field, value", [("loss", "inbatch-nope"), ("steps", 0),
                                          ("embedding_dim", 100_000), ("batch_size", 1.5),
                                          ("history_length", 10**6), ("optimizer", "sgd"),
                                          ("learning_rate", 0.0)])
def test_bad_configs_are_one_line_errors(field, value):
    with pytest.raises(ValueError, match=field) as error:
        TwoTowerConfig(**{field: value})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("loss", ["mns-corrected", "inbatch-corrected"])
def test_two_corrections_see_the_same_batches_negatives_and_initial_weights(split, loss):
    """Common random numbers, what compare's pairing rests on: runs that differ only in the
    correction train on the same batches, draw the same negatives and start from the same
    weights; another seed draws other negatives. The model trained is the public
    `TwoTowerModel`."""
    from tfrs_logq.towers.loop import build_model, tower_weights, train_loop
    from tfrs_logq.two_tower import TwoTowerModel

    def recorded(correction_loss, seed=0):
        config = TwoTowerConfig(loss=correction_loss, steps=3, batch_size=32, embedding_dim=8,
                                history_length=6, num_negatives=16, seed=seed)
        spec = training.run_spec(config, split.num_items)
        record: list = []
        # Seeded by the spec's seed alone.
        first = [w.numpy() for w in tower_weights(build_model(spec))]
        batches = Examples(split, 6).batches(seed, 32, 3)
        model, _ = train_loop(spec, batches, split.train_log_q(), record=record)
        assert isinstance(model, TwoTowerModel)
        return first, record

    base = loss.replace("-corrected", "")
    weights, steps = recorded(loss)
    for other in (f"{base}-logq-tfrs", f"{base}-logq-official"):
        other_weights, other_steps = recorded(other)
        for a, b in zip(weights, other_weights):
            np.testing.assert_array_equal(a, b)
        assert len(steps) == len(other_steps) == 3
        for (batch, ids, valid), (other_batch, other_ids, other_valid) in zip(steps, other_steps):
            for key in batch:
                np.testing.assert_array_equal(batch[key], other_batch[key])
            np.testing.assert_array_equal(ids, other_ids)
            np.testing.assert_array_equal(valid, other_valid)
    _, reseeded = recorded(loss, seed=1)
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(steps, reseeded))


def test_training_learns_and_a_killed_run_resumes_to_the_same_metrics(split, tmp_path):
    config = TwoTowerConfig(loss="mns-corrected", steps=40, batch_size=64, embedding_dim=16,
                            history_length=6, num_negatives=32, learning_rate=2e-2,
                            eval_every=20)
    rows = []
    last = training.train(config, split, on_eval=rows.append)
    assert [r["steps"] for r in rows] == [20, 40] and rows[-1] == last
    # Six topics of 20 items: a random ranking has Recall@10 about 10 / 119.
    assert last["recall@10"] > 3 * 10 / 119, last
    assert 0 < last["positive_share_q50"] < 1 and 0 < last["model_p_q50"] < 1

    directory = str(tmp_path / "ckpt")

    def killed(step):
        if step == 29:
            raise KeyboardInterrupt

    first = []
    with pytest.raises(KeyboardInterrupt):
        training.train(config, split, checkpoint_dir=directory, on_eval=first.append,
                       on_step=killed, checkpoint_seconds=0.0)
    assert [r["steps"] for r in first] == [20]
    second = []
    resumed = training.train(config, split, checkpoint_dir=directory, on_eval=second.append,
                             done=(20,), checkpoint_seconds=0.0)
    assert [r["steps"] for r in second] == [40] and resumed["resumed_from_step"] == 30
    for key in ("recall@10", "ndcg@10", "recall@100", "positive_share_q50"):
        assert resumed[key] == pytest.approx(last[key], abs=1e-6), key


def _weighted_split(weight_of_position, num_users=120):
    """The topic log with a weight per interaction: ``weight_of_position(t)`` for the
    user's ``t``-th interaction (time order)."""
    plain = _topic_log(num_users=num_users)
    weights = np.array([weight_of_position(int(t) % 100) for t in plain.timestamp], np.float64)
    users = plain.user
    return make_split(build_interactions(users, plain.item, plain.timestamp, weight=weights,
                                         min_item_interactions=1), "loo")


def test_train_weights_and_example_weights_follow_the_target_interaction():
    split = _weighted_split(lambda t: t + 1.0)
    for seq, weights in zip(split.train_sequences(), split.train_weights()):
        np.testing.assert_array_equal(weights, np.arange(1, len(seq) + 1))
    examples = Examples(split, history_length=20)
    batch = examples.batch(seed=0, step=1, batch_size=256)
    assert batch["weight"].dtype == np.float32
    # The target at position t has t items before it (all within 20) and weight t + 1,
    # scaled (one factor for all) to mean 1 over the training examples.
    ratio = batch["weight"] / (np.count_nonzero(batch["history"], 1) + 1)
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-6)
    assert examples.weights.mean() == pytest.approx(1.0, rel=1e-5)
    assert "weight" not in Examples(make_split(_topic_log(num_users=20), "loo"), 4).batch(0, 0, 8)


def test_weights_scale_each_examples_loss():
    config = TwoTowerConfig(loss="inbatch-corrected", steps=12, batch_size=64,
                            embedding_dim=8, history_length=6, eval_every=12)
    plain = training.train(config, _weighted_split(lambda t: 1.0))
    unweighted = training.train(config, make_split(_topic_log(num_users=120), "loo"))
    skewed = training.train(config, _weighted_split(lambda t: 0.0 if t < 8 else 5.0))
    for key in ("recall@10", "ndcg@10", "recall@100"):
        assert plain[key] == pytest.approx(unweighted[key], abs=1e-7), key  # weight 1: same
    assert any(abs(skewed[k] - unweighted[k]) > 1e-4 for k in ("recall@10", "ndcg@10",
                                                                "recall@100"))


@pytest.mark.parametrize("scale", [1e30, 1e-50, 3.0])
def test_uniform_weights_of_any_size_train_as_weight_one(scale):
    examples = Examples(_weighted_split(lambda t: scale, num_users=12), history_length=4)
    np.testing.assert_array_equal(examples.weights, np.ones(len(examples), np.float32))


@pytest.mark.parametrize("weight, message", [
    (lambda t: t - 3.0, "negative weights"),
    (lambda t: -1.0 if t == 0 else 1.0, "negative weights"),  # a first interaction only
    (lambda t: 0.0, "every training example")])
def test_bad_weights_are_one_line_errors(weight, message):
    with pytest.raises(ValueError, match=message) as error:
        Examples(_weighted_split(weight, num_users=12), history_length=4)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("correction", ["none", "logq-tfrs", "logq-official"])
def test_the_public_models_loss_with_sampled_negatives_is_the_formula(correction):
    """`TwoTowerModel.retrieval_loss`, the step the trainer takes: each row's softmax over
    its own positive and the shared valid negatives (the other rows' positives, padding
    and accidental hits dropped), every negative corrected by its ``log Q``, the positive
    too for ``logq-tfrs``; the losses summed over rows, each weighted."""
    import tensorflow as tf
    from scipy.special import logsumexp

    from tfrs_logq.sampling import SampledNegatives
    from tfrs_logq.tasks import CorrectedRetrieval
    from tfrs_logq.two_tower import TwoTowerModel

    tf.keras.utils.set_random_seed(1)
    model = TwoTowerModel(10, 4, CorrectedRetrieval(correction=correction,
                                                    remove_accidental_hits=True))
    history = tf.constant([[1, 2, 0], [3, 0, 0], [4, 5, 6]], tf.int64)
    positives = tf.constant([2, 7, 5], tf.int64)
    positive_log_q = tf.constant([-1.0, -2.0, -0.5])
    negatives = SampledNegatives(tf.constant([7, 8, 9, 0], tf.int64),
                                 tf.constant([-2.0, -3.0, -1.5, 0.0]),
                                 tf.constant([True, True, True, False]))
    weight = tf.constant([1.0, 0.5, 2.0])
    loss = model.retrieval_loss(history, positives, positive_log_q, negatives,
                                sample_weight=weight).numpy()
    queries = model.query_tower(history).numpy().astype(np.float64)
    table = model.item_embeddings().numpy().astype(np.float64)
    expected = 0.0
    for i in range(3):
        p = int(positives[i])
        s_p = queries[i] @ table[p] - (positive_log_q.numpy()[i]
                                       if correction == "logq-tfrs" else 0.0)
        logits = [s_p]
        for d, lq, valid in zip(negatives.ids.numpy(), negatives.log_q.numpy(),
                                negatives.is_valid.numpy()):
            if valid and d != p:
                logits.append(queries[i] @ table[d] - (lq if correction != "none" else 0.0))
        expected += float(weight[i]) * (logsumexp(logits) - s_p)
    assert loss == pytest.approx(expected, rel=1e-5)
