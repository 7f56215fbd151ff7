"""A comparison's data identity: ``--log-format`` given as the files' extensions say it
is the same data as the format inferred, so a rerun with the flag resumes."""

import types

from tfrs_logq.cli.compare import _data_identity
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split


def _args(path, log_format):
    return types.SimpleNamespace(
        interactions=str(path), dataset=None, split="loo", data_dir=None, user_column="user",
        item_column="item", time_column=None, weight_column=None, log_format=log_format,
        min_item_interactions=1, min_user_interactions=0, deduplicate=False)


def _write(path):
    path.write_text("user,item\n" + "".join(f"u{k % 4},i{k % 5}\n" for k in range(40)))
    return path


def test_an_explicit_format_equal_to_the_inferred_one_is_the_same_data(tmp_path):
    log = _write(tmp_path / "log.csv")
    inferred = load_user_log_split(UserLogSource(str(log), "user", "item"), "loo",
                                   min_item_interactions=1)
    explicit = load_user_log_split(UserLogSource(str(log), "user", "item", format="csv"),
                                   "loo", min_item_interactions=1)
    assert _data_identity(_args(log, "csv"), explicit) == _data_identity(_args(log, None),
                                                                         inferred)

