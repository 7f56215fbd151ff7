"""Specification of `tfrs_logq.sasrec.config`: `TrainConfig` refuses, from Python, what the
command line refuses, with one line naming the field and its flag; presets and
`resolve_config`; `examples_config` reads an ExampleGen artifact's data fields."""

import dataclasses
import json
import os

import pytest

from tfrs_logq.sasrec.config import (
    OBJECTIVES,
    PRESETS,
    TrainConfig,
    examples_config,
    resolve_config,
)


def _one_line_error(excinfo, *fragments):
    text = str(excinfo.value)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)


@pytest.mark.parametrize("bad, fragments", [
    ({"loss": "mns-correctd"}, ("`loss`", "--loss", "'mns-correctd'", "mns-corrected")),
    ({"dataset": "movielens"}, ("`dataset`", "--dataset", "'movielens'")),
    ({"split": "random"}, ("`split`", "--split", "'random'")),
    ({"strategy": "horovod"}, ("`strategy`", "--strategy")),
    ({"mixed_precision": "float8"}, ("`mixed_precision`",)),
    ({"data_format": "csv"}, ("`data_format`", "--data-format", "'csv'")),
    ({"batch_size": 0}, ("`batch_size`", "--batch-size", "0")),
    ({"max_length": -3}, ("`max_length`", "--max-length")),
    ({"num_negatives": 0}, ("`num_negatives`", "--num-negatives")),
    ({"learning_rate": 0.0}, ("`learning_rate`", "--learning-rate")),
    ({"dropout": 1.0}, ("`dropout`", "--dropout")),
    ({"temporal_fraction": 0.5}, ("`temporal_fraction`", "--temporal-fraction")),
    ({"max_validation_users": 0}, ("`max_validation_users`", "--max-validation-users")),
    ({"patience": -1}, ("`patience`", "--patience")),
    ({"seed": -1}, ("`seed`", "--seed")),
    ({"length_buckets": 0}, ("`length_buckets`", "--length-buckets")),
    ({"test_window": 5, "max_epochs": 4}, ("`test_window`", "--test-window")),
])
def test_train_config_rejects_what_the_command_line_rejects(bad, fragments):
    with pytest.raises(ValueError) as excinfo:
        TrainConfig(**bad)
    _one_line_error(excinfo, *fragments)
    with pytest.raises(ValueError) as excinfo:
        resolve_config("smoke", **bad)
    _one_line_error(excinfo, *fragments)


def test_resolve_config_rejects_a_bad_loss_name_in_one_line():
    """Issue 24: a bad loss name was accepted from Python and failed only in the CLI."""
    with pytest.raises(ValueError) as excinfo:
        resolve_config(None, loss="corrected")
    _one_line_error(excinfo, "`loss`", "'corrected'", *OBJECTIVES)


def test_replace_checks_again():
    config = TrainConfig()
    with pytest.raises(ValueError, match="`loss`"):
        dataclasses.replace(config, loss="nope")


def test_the_defaults_every_loss_and_every_preset_are_valid():
    TrainConfig()
    for loss in OBJECTIVES:
        assert TrainConfig(loss=loss).loss == loss
    for name, fields in PRESETS.items():
        config = resolve_config(name)
        assert config.preset == name
        assert all(getattr(config, k) == v for k, v in fields.items())


def test_an_unnamed_dataset_and_an_artifacts_own_format_are_accepted():
    """`pipeline run --input FILE` names no dataset; an ExampleGen artifact records the
    format it read (csv, steam), which is not one of ML-1M's files."""
    assert resolve_config("smoke", dataset="").dataset == ""
    assert TrainConfig(data_format="csv", examples="some/ExampleGen").data_format == "csv"


def test_resolve_config_unknown_preset_and_option():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        resolve_config("huge")
    with pytest.raises(ValueError, match=r"unknown training options: \['lossy'\]"):
        resolve_config(None, lossy=1)
    with pytest.raises(ValueError, match="`preset`"):
        TrainConfig(preset="huge")


def test_flags_override_the_preset_and_none_leaves_it():
    config = resolve_config("smoke", max_length=7, embedding_dim=None)
    assert config.max_length == 7
    assert config.embedding_dim == PRESETS["smoke"]["embedding_dim"]


def test_configs_written_before_0_2_load():
    assert TrainConfig(mixed_precision=False).mixed_precision == "none"
    assert TrainConfig(mixed_precision=True).mixed_precision == "float16"


def _example_gen(root, parameters):
    """A finished ExampleGen artifact: one data file and its manifest."""
    from tfrs_logq.pipelines.manifest import MANIFEST, output_fingerprints

    directory = root / "ExampleGen"
    directory.mkdir()
    (directory / "part-0.tfrecord").write_bytes(b"data")
    manifest = {"component": "ExampleGen", "parameters": parameters,
                "outputs": output_fingerprints(str(directory))}
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return str(directory)


def test_examples_config_takes_the_artifacts_data_fields(tmp_path):
    directory = _example_gen(tmp_path, {"dataset": "ml-1m", "split": "loo",
                                        "data_format": "sasrec",
                                        "split_options": {}})
    config = examples_config(resolve_config("smoke", examples=directory))
    assert (config.dataset, config.split, config.data_format) == ("ml-1m", "loo", "sasrec")
    with pytest.raises(ValueError, match="--split temporal disagrees with --examples"):
        examples_config(resolve_config("smoke", examples=directory, split="temporal"),
                        explicit={"split"})
    os.remove(os.path.join(directory, "part-0.tfrecord"))
    with pytest.raises(ValueError, match="part-0.tfrecord is missing"):
        examples_config(resolve_config("smoke", examples=directory))
