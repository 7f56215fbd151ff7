"""Specification of `tfrs_logq.sasrec.trained`: a finished run's directory loaded back (config,
vocabulary, the encoder with its best weights, the split it trained on). The runs here are
written without training: a config, a vocabulary and weights saved from a fresh encoder."""

import json

import numpy as np
import pytest
import tensorflow as tf
from pipeline_data import write_ratings

from tfrs_logq.sasrec import trained
from tfrs_logq.sasrec.models import SequentialRetrievalModel
from tfrs_logq.sasrec.objectives import make_objective
from tfrs_logq.sasrec.run import saved_config
from tfrs_logq.sasrec.training import build_encoder, resolve_config

NUM_ITEMS = 12


def _run(model_dir, raw_items=None, weights=True, **overrides):
    """A run directory as `train` leaves it; returns the encoder whose weights it holds."""
    train_config = resolve_config("smoke", **{"loss": "mns-corrected", "split": "loo",
                                              **overrides})
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(saved_config(train_config, NUM_ITEMS)))
    raw_items = raw_items or [str(100 + i) for i in range(NUM_ITEMS)]
    (model_dir / "vocabulary.json").write_text(json.dumps({"raw_items": raw_items}))
    encoder = build_encoder(train_config, NUM_ITEMS)
    model = SequentialRetrievalModel(encoder, make_objective(
        train_config.loss, NUM_ITEMS, np.ones(NUM_ITEMS + 1)))
    encoder(tf.zeros([1, train_config.max_length], tf.int32))
    if weights:
        model.save_weights(str(model_dir / "best.weights"))
    return encoder


@pytest.mark.parametrize("share", [True, False])
def test_load_trained_rebuilds_the_trained_encoder_with_its_best_weights(tmp_path, share):
    """A run trained with --share-item-embeddings exports the table it scored with."""
    encoder = _run(tmp_path / "model", share_item_embeddings=share)
    loaded, config, raw_ids = trained.load_trained(str(tmp_path / "model"))
    assert loaded.share_item_embeddings == share and config["num_items"] == NUM_ITEMS
    np.testing.assert_array_equal(loaded.item_embeddings().numpy(),
                                  encoder.item_embeddings().numpy())
    np.testing.assert_array_equal(raw_ids, np.arange(100, 100 + NUM_ITEMS))
    assert raw_ids.dtype == np.int64
    history = tf.constant([[0, 3, 5, 7]], tf.int32)
    np.testing.assert_allclose(loaded.last_query(history, training=False).numpy(),
                               encoder.last_query(history, training=False).numpy(), atol=1e-6)


def test_the_saved_config_is_a_train_config_again_and_build_encoder_takes_only_that(tmp_path):
    from tfrs_logq.sasrec.config import TrainConfig

    _run(tmp_path / "model", embedding_dim=24, num_heads=2, share_item_embeddings=True)
    config = trained.read_train_config(str(tmp_path / "model"))
    assert config == resolve_config("smoke", loss="mns-corrected", split="loo",
                                    embedding_dim=24, num_heads=2, share_item_embeddings=True)
    encoder = build_encoder(config, NUM_ITEMS)
    assert (encoder.share_item_embeddings, encoder.num_ids, encoder.dim, encoder.num_heads,
            encoder.length_buckets) == (True, NUM_ITEMS + 1, 24, 2, config.length_buckets)
    with pytest.raises(TypeError, match="must be a TrainConfig.*received dict"):
        build_encoder(config.to_dict(), NUM_ITEMS)
    # A config.json this version cannot read: one line naming the file, not a KeyError.
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    (tmp_path / "model" / "config.json").write_text(json.dumps({**saved, "heads": 2}))
    with pytest.raises(ValueError, match=r"config\.json: has unknown keys 'heads'"):
        trained.load_trained(str(tmp_path / "model"))
    assert isinstance(TrainConfig.from_dict(saved), TrainConfig)


def test_a_run_without_best_weights_is_a_clear_error(tmp_path):
    _run(tmp_path / "model", weights=False)
    with pytest.raises(FileNotFoundError, match="has no best.weights.*tfrs-logq train"):
        trained.load_trained(str(tmp_path / "model"))


def test_the_vocabulary_is_integers_when_every_id_is_one_else_strings(tmp_path):
    (tmp_path / "vocabulary.json").write_text(json.dumps({"raw_items": ["7", "-3", "12"]}))
    ids = trained.read_vocabulary(str(tmp_path))
    assert ids.dtype == np.int64 and ids.tolist() == [7, -3, 12]
    (tmp_path / "vocabulary.json").write_text(json.dumps({"raw_items": ["7", "tt0111"]}))
    assert trained.read_vocabulary(str(tmp_path)).tolist() == ["7", "tt0111"]


def test_the_run_split_is_its_datasets_or_its_artifacts_unless_data_dir_is_given(tmp_path,
                                                                                  monkeypatch):
    from tfrs_logq.pipelines.datasets import load_split
    from tfrs_logq.pipelines.manifest import ArtifactError

    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "cache"))
    data = write_ratings(tmp_path / "data", users=20, items=NUM_ITEMS, per_user=6)
    config = saved_config(resolve_config("smoke", split="loo", data_dir=data,
                                         data_format="ratings"), NUM_ITEMS)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    want = load_split("ml-1m", "loo", data, data_format="ratings")
    got = trained.load_run_split(str(tmp_path / "run"))
    np.testing.assert_array_equal(got.train_item_counts(), want.train_item_counts())
    # Trained on an ExampleGen artifact: read from it (this one does not exist) ...
    config["examples"] = str(tmp_path / "no-such-artifact")
    config["data_dir"] = str(tmp_path / "moved")
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    with pytest.raises((ArtifactError, FileNotFoundError), match="no-such-artifact"):
        trained.load_run_split(str(tmp_path / "run"))
    # ... unless the data is given: then the dataset, from there.
    got = trained.load_run_split(str(tmp_path / "run"), data_dir=data)
    np.testing.assert_array_equal(got.train_item_counts(), want.train_item_counts())


def test_the_serving_exports_load_trained_loads_a_run(tmp_path):
    """`tfrs_logq.serving.export.load_trained` (in its ``__all__``) loads a run as this one."""
    from tfrs_logq.serving import export

    encoder = _run(tmp_path / "model")
    loaded, config, raw_ids = export.load_trained(str(tmp_path / "model"))
    assert config["num_items"] == NUM_ITEMS
    np.testing.assert_array_equal(raw_ids, np.arange(100, 100 + NUM_ITEMS))
    np.testing.assert_array_equal(loaded.item_embeddings().numpy(),
                                  encoder.item_embeddings().numpy())
