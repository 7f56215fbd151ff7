"""`TrainConfig(interactions=...)`: SASRec on a user's own log."""

from __future__ import annotations

import numpy as np
import pytest

from tfrs_logq.sasrec import config as config_lib
from tfrs_logq.sasrec import training


def _log(path, num_users=60, length=8):
    rng = np.random.default_rng(0)
    lines = ["uid,movie,ts"]
    for u in range(num_users):
        for t in range(length):
            lines.append(f"user-{u},m{rng.integers(0, 25)},{1_000_000 + 100 * u + t}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_split_of_a_users_log_is_the_user_log_readers(tmp_path):
    from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split

    path = _log(tmp_path / "log.csv")
    config = config_lib.resolve_config("smoke", interactions=path, user_column="uid",
                                       item_column="movie", time_column="ts", split="loo",
                                       length_buckets=1)
    split = training.load_config_split(config)
    expected = load_user_log_split(UserLogSource(path, "uid", "movie", time_column="ts"), "loo")
    np.testing.assert_array_equal(split.test.targets, expected.test.targets)
    assert split.num_items == expected.num_items and split.name == "loo"
    result = training.train(config, str(tmp_path / "run"), verbose=0)
    assert 0.0 <= result["test"]["recall@10"] <= 1.0

    # The export answers in the log's own ids (text here), as exact scoring does.
    import tensorflow as tf

    from tfrs_logq.serving.export import RetrievalModule, load_run_split, load_trained

    encoder, saved, raw_ids = load_trained(str(tmp_path / "run"))
    assert saved["interactions"] == path and raw_ids.dtype.kind == "U"
    assert load_run_split(str(tmp_path / "run")).num_items == split.num_items
    module = RetrievalModule(encoder, raw_ids, "brute-force", default_k=4)
    answer = module.top_k(tf.constant([["m1", "m2"]]), tf.constant(4), tf.constant(True))
    index = {str(r): i + 1 for i, r in enumerate(raw_ids)}
    history = np.zeros((1, encoder.max_length), np.int32)
    history[0, -2:] = [index["m1"], index["m2"]]
    scores = tf.matmul(encoder.last_query(history, training=False),
                       encoder.item_embeddings()[1:], transpose_b=True).numpy()[0]
    scores[[index["m1"] - 1, index["m2"] - 1]] = -np.inf
    assert [x.decode() for x in answer["item_ids"].numpy()[0]] == list(
        raw_ids[np.argsort(-scores, kind="stable")[:4]])


@pytest.mark.parametrize("fields, match", [
    (dict(interactions="x.csv", item_column="movie"), "user_column"),
    (dict(interactions="x.csv", user_column="uid"), "item_column"),
    (dict(user_column="uid"), "interactions"),
    (dict(interactions="x.csv", user_column="u", item_column="i", log_format="xlsx"),
     "log_format"),
])
def test_user_log_fields_are_checked_in_one_line(fields, match):
    with pytest.raises(config_lib.ConfigError, match=match) as error:
        config_lib.TrainConfig(**fields).validate()
    assert "\n" not in str(error.value)
