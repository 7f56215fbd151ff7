"""ExampleGen's user-log source (`UserLogExampleGen`) on Beam's local FnApiRunner: the
artifact holds the split `load_user_log_split` gives on the same log and options.
One Beam job per test (about 5 s each on two busy cores), so they are few."""

import numpy as np
import pytest

apache_beam = pytest.importorskip("apache_beam")

from tfrs_logq.pipelines.beam import artifacts, read_split, run_components  # noqa: E402
from tfrs_logq.pipelines.beam.user_log_source import UserLogExampleGen  # noqa: E402
from tfrs_logq.pipelines.interactions import DataFormatError  # noqa: E402
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split  # noqa: E402


def write_log(directory, seed=0, users=80, n=1500):
    """Two CSV files (one gzip'd would do as well) with text users, integer items,
    ties in time and a malformed line in the second file."""
    rng = np.random.default_rng(seed)
    rows = [f"u{int(u)},{int(i) * 7},{1000 + int(t) * 60}"
            for u, i, t in zip(rng.integers(0, users, n), rng.zipf(1.3, n) % 40,
                               rng.integers(0, 30, n))]
    directory.mkdir()
    (directory / "part-0.csv").write_text("user,item,time\n" + "\n".join(rows[:700]) + "\n")
    (directory / "part-1.csv").write_text("user,item,time\n" + "\n".join(rows[700:720])
                                          + "\nu1,5\n" + "\n".join(rows[720:]) + "\n")
    return directory


def assert_same_split(got, ref):
    a, b = got.interactions, ref.interactions
    for name in ("user", "item", "timestamp", "raw_users", "raw_items"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(got.train_lengths, ref.train_lengths)
    for part in ("validation", "test"):
        for field in ("users", "history_lengths", "targets"):
            np.testing.assert_array_equal(getattr(getattr(got, part), field),
                                          getattr(getattr(ref, part), field))
    assert got.stats() == ref.stats()


def test_user_log_example_gen_equals_load_user_log_split(tmp_path):
    source = UserLogSource(str(write_log(tmp_path / "log")), "user", "item",
                           time_column="time", skip_bad_lines=True)
    root = tmp_path / "root"
    run_components([UserLogExampleGen(source, "temporal", temporal_fraction=0.15,
                                      min_item_interactions=3, num_shards=3)], str(root))
    got = read_split(str(root / "ExampleGen"))
    ref = load_user_log_split(source, "temporal", temporal_fraction=0.15,
                              min_item_interactions=3)
    assert_same_split(got, ref)
    assert got.interactions.raw_users.dtype.kind == "U"
    assert got.interactions.raw_items.dtype == np.int64
    counts = artifacts.read_manifest(str(root / "ExampleGen"))["counts"]
    assert (counts["num_rows"], counts["skipped_lines"]) == (1500, 1)
    assert counts["skipped_examples"][0].startswith(f"{tmp_path / 'log' / 'part-1.csv'}, line 22:")


def test_user_log_example_gen_fails_as_the_library_does(tmp_path):
    source = UserLogSource(str(write_log(tmp_path / "log")), "user", "item",
                           time_column="time")
    with pytest.raises(DataFormatError) as library:
        load_user_log_split(source, "temporal")
    with pytest.raises(DataFormatError) as beam:
        run_components([UserLogExampleGen(source, "temporal")], str(tmp_path / "root"))
    assert str(beam.value) == str(library.value)
    assert f"{tmp_path / 'log' / 'part-1.csv'}, line 22:" in str(beam.value)
