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
    # The upper bounds (`LIMITS`), checked before any work.
    ({"max_length": 100_000_000}, ("`max_length`", "--max-length", "10,000", "100,000,000")),
    ({"embedding_dim": 4_097}, ("`embedding_dim`", "--embedding-dim", "4,096")),
    ({"num_negatives": 1_000_001}, ("`num_negatives`", "--num-negatives", "1,000,000")),
    ({"batch_size": 10**7}, ("`batch_size`", "--batch-size")),
    ({"steps_per_epoch": 10**8}, ("`steps_per_epoch`", "--steps-per-epoch")),
    ({"max_epochs": 10**7}, ("`max_epochs`", "--max-epochs")),
    ({"num_blocks": 65}, ("`num_blocks`", "--num-blocks")),
    ({"num_heads": 257}, ("`num_heads`", "--num-heads")),
    ({"length_buckets": 1_025}, ("`length_buckets`", "--length-buckets")),
    ({"max_tensor_gib": -1.0}, ("`max_tensor_gib`", "--max-tensor-gib")),
    # The types, as a config.json can get them wrong.
    ({"max_length": "200"}, ("`max_length`", "must be int", '"200"')),
    ({"mixed_precision": True}, ("`mixed_precision`", "must be str", "true")),
    ({"dropout": "0.1"}, ("`dropout`", "must be float")),
    ({"jit_compile": 1}, ("`jit_compile`", "must be bool")),
    ({"data_dir": 3}, ("`data_dir`", "must be None or str")),
])
def test_train_config_rejects_what_the_command_line_rejects(bad, fragments):
    with pytest.raises(ValueError) as excinfo:
        TrainConfig(**bad)
    _one_line_error(excinfo, *fragments)
    with pytest.raises(ValueError) as excinfo:
        resolve_config("smoke", **bad)
    _one_line_error(excinfo, *fragments)


def test_resolve_config_rejects_a_bad_loss_name_in_one_line():
    """A bad loss name was accepted from Python and failed only in the CLI."""
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
    """An ExampleGen artifact of a file that is no built-in dataset (`run_pipeline`'s, or
    `pipeline run --interactions LOG`'s) names no dataset, and records the format it read
    (csv, steam, user-log), which is not one of ML-1M's files."""
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


def test_sizes_at_their_bounds_and_numpy_integers_are_accepted():
    import numpy as np

    from tfrs_logq.sasrec.config import LIMITS

    for name, limit in LIMITS.items():
        assert getattr(TrainConfig(**{name: limit}), name) == limit
    assert TrainConfig(max_length=np.int64(50), dropout=np.float32(0.25)).max_length == 50
    assert TrainConfig(learning_rate=1).learning_rate == 1  # an int is a float's value


def _numpy_bytes(config, num_items=None):
    """The largest tensor of `largest_tensor`'s list, built from the formulas here."""
    b, n, d, h = (config.batch_size, config.max_length, config.embedding_dim,
                  config.num_heads)
    k = (num_items + 1 if num_items else 0) if config.loss == "full-softmax" else \
        config.num_negatives
    u = {"bce": 1, "gbce": config.num_negatives, "uniform": config.num_negatives}.get(
        config.loss, config.num_negatives - config.num_negatives // 2
        if config.loss.startswith("mns-") else 0)
    return 4 * max(b * h * n * n, b * n * d, b * n * k, b * n * u * d)


@pytest.mark.parametrize("loss", OBJECTIVES)
def test_largest_tensor_is_the_largest_of_the_steps_tensors(loss):
    from tfrs_logq.sasrec.config import largest_tensor

    for fields in ({}, {"max_length": 2_000, "batch_size": 8}, {"num_negatives": 4_096},
                   {"embedding_dim": 1_024, "num_heads": 8}):
        config = TrainConfig(loss=loss, **fields)
        assert largest_tensor(config)[1] == _numpy_bytes(config)
        assert largest_tensor(config, 1_000_000)[1] == _numpy_bytes(config, 1_000_000)


def test_validate_holds_the_largest_tensor_to_the_budget_in_one_line():
    # 32 x 1 x 10,000 x 10,000 attention scores: 11.9 GiB, over the 4 GiB default.
    with pytest.raises(ValueError) as excinfo:
        resolve_config("smoke", max_length=10_000)
    _one_line_error(excinfo, "`max_tensor_gib`", "--max-tensor-gib", "attention scores",
                    "11.9 GiB", "--max-length")
    assert resolve_config("smoke", max_length=10_000, max_tensor_gib=12.0).max_length == 10_000
    assert resolve_config("smoke", max_length=10_000, max_tensor_gib=0.0)  # 0: no check
    # The catalog counts for full-softmax once it is known: [32 x 30 x 10M + 1] scores.
    config = resolve_config("smoke", loss="full-softmax")
    assert config.validate(1_000) is config
    with pytest.raises(ValueError, match="negatives' scores"):
        config.validate(10_000_000)
    # Cross-field, so in validate (the command line checks each flag alone).
    assert TrainConfig(embedding_dim=30, num_heads=4)
    with pytest.raises(ValueError) as excinfo:
        resolve_config("smoke", embedding_dim=30, num_heads=4)
    _one_line_error(excinfo, "`num_heads`", "divide", "30")


@pytest.mark.parametrize("loss", OBJECTIVES)
def test_every_preset_and_loss_round_trip_through_config_json(loss, tmp_path):
    from tfrs_logq.sasrec.run import saved_config

    for preset in (None, *PRESETS):
        config = resolve_config(preset, loss=loss, data_dir=str(tmp_path), seed=7)
        assert TrainConfig.from_dict(config.to_dict()) == config
        path = tmp_path / "config.json"
        path.write_text(json.dumps(saved_config(config, 3_416)))  # as `train` writes it
        assert TrainConfig.from_json(str(path)) == config


def test_a_config_json_with_an_unknown_key_or_a_wrong_type_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    for fields, fragments in (({"max_lenght": 30}, ("unknown keys", "'max_lenght'")),
                              ({"max_length": "30"}, ("`max_length`", "must be int")),
                              ({"loss": "softmax"}, ("`loss`", "'softmax'")),
                              ([1, 2], ("JSON object",))):
        path.write_text(json.dumps(fields))
        with pytest.raises(ValueError) as excinfo:
            TrainConfig.from_json(str(path))
        _one_line_error(excinfo, str(path), *fragments)
    path.write_text("{not json")
    with pytest.raises(ValueError) as excinfo:
        TrainConfig.from_json(str(path))
    _one_line_error(excinfo, str(path), "not valid JSON")
    with pytest.raises(FileNotFoundError):
        TrainConfig.from_json(str(tmp_path / "missing.json"))
    # Fields left out take their defaults.
    assert TrainConfig.from_dict({"loss": "gbce", "num_items": 9}) == TrainConfig(loss="gbce")


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


def test_examples_config_refuses_a_synthetic_artifact_in_one_line(tmp_path):
    """`SyntheticExampleGen`'s parameters (dataset and data format "synthetic"), which no
    `TrainConfig` takes: the error says so, not that a --dataset (not given) is wrong."""
    directory = _example_gen(tmp_path, {"dataset": "synthetic", "data_format": "synthetic",
                                        "split": "loo", "split_options": {}})
    with pytest.raises(ValueError) as excinfo:
        examples_config(resolve_config("smoke", examples=directory))
    _one_line_error(excinfo, f"--examples {directory} is a synthetic ExampleGen artifact",
                    "cannot be trained on", "stops after Statistics")
    assert "--dataset)" not in str(excinfo.value)
