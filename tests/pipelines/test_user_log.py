"""A user's own log (`tfrs_logq.pipelines.user_log`): every format gives the built-in
loaders' preprocessing and splits on the same rows, ids map back, and every kind of
bad input is one line that names what is wrong."""

import calendar
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_data import SHARED, isolated_cache, needs_shared  # noqa: F401

from tfrs_logq.pipelines import log_readers
from tfrs_logq.pipelines.datasets import load_split
from tfrs_logq.pipelines.interactions import DataFormatError, build_interactions
from tfrs_logq.pipelines.splits import data_stats, make_split
from tfrs_logq.pipelines.user_log import (
    UserLogSource,
    load_user_log,
    load_user_log_split,
    merge_raw_logs,
    read_piece,
    read_user_log,
)
from tfrs_logq.pipelines.vocabulary import Vocabulary, load_vocabularies, save_vocabularies

COLUMNS = ("user", "item", "ts", "weight")


def toy_rows(seed=0, users=40, items=15, n=600):
    """Text user ids, integer item ids, many ties in time, a weight per row."""
    rng = np.random.default_rng(seed)
    return [(f"u{int(u)}", int(i) * 3 + 1, 1_000_000 + int(t) * 60, round(float(w), 2))
            for u, i, t, w in zip(rng.integers(0, users, n), rng.zipf(1.4, n) % items,
                                  rng.integers(0, 40, n), rng.random(n))]


def write_csv(path, rows, header=COLUMNS, sep=",", opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(sep.join(header) + "\n")
        for row in rows:
            f.write(sep.join(str(v) for v in row) + "\n")


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(dict(zip(COLUMNS, row))) + "\n")


def write_parquet(path, rows, row_group_size=128):
    table = pa.table({name: [r[k] for r in rows] for k, name in enumerate(COLUMNS)})
    pq.write_table(table, path, row_group_size=row_group_size)


def source(path, **options):
    return UserLogSource(str(path), "user", "item", time_column=options.pop("time", "ts"),
                         weight_column=options.pop("weight", "weight"), **options)


def reference(rows, **options):
    """The built-in preprocessing on the raw values themselves (no codes)."""
    users, items, times, weights = map(np.array, zip(*rows))
    return build_interactions(users, items, times.astype(np.int64), weight=weights,
                              **options)


def assert_same_interactions(got, ref):
    for name in ("user", "item", "timestamp", "raw_users", "raw_items", "weight"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)


def one_line(excinfo, *fragments):
    message = str(excinfo.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ----------------------------------------------------------------- the built-in figures


@needs_shared
def test_ml1m_ratings_as_a_csv_give_the_data_stats_of_the_ml1m_loader(tmp_path, capsys):
    """The CLI's JSON for `data stats --dataset ml-1m --split temporal` on ratings.dat
    (users 1-2999, the staged file) and `data_stats` of the same ratings as a CSV:
    the same keys and counts; the splits are equal array for array."""
    from tfrs_logq import cli

    partial = os.path.join(SHARED, "ml-1m-partial")
    csv_path = tmp_path / "ratings.csv"
    with gzip.open(os.path.join(partial, "ratings.dat.gz"), "rt", encoding="latin-1") as f, \
            open(csv_path, "w") as out:
        out.write("user_id,movie_id,rating,timestamp\n")
        for line in f:
            out.write(line.rstrip("\n").replace("::", ",") + "\n")
    code = cli.main(["data", "stats", "--dataset", "ml-1m", "--split", "temporal",
                     "--data-dir", partial, "--no-cache", "--json"])
    assert code == 0
    expected = json.loads(capsys.readouterr().out)
    split = load_user_log_split(UserLogSource(str(csv_path), "user_id", "movie_id",
                                              time_column="timestamp"), "temporal")
    got = data_stats(split, "ml-1m")
    assert list(got) == list(expected)
    differ = {"source", "data_format"}
    assert {k: v for k, v in got.items() if k not in differ} == \
        {k: v for k, v in expected.items() if k not in differ}
    assert (got["rows"], got["num_interactions"], got["test"]["num_targets"]) == \
        (487_650, 486_907, 48_691)
    assert got["data_format"] == "csv" and got["source"] == str(csv_path)
    ref = load_split("ml-1m", "temporal", partial, use_cache=False)
    assert_same_interactions(split.interactions, ref.interactions)
    np.testing.assert_array_equal(split.train_lengths, ref.train_lengths)
    for part in ("validation", "test"):
        for field in ("users", "history_lengths", "targets"):
            np.testing.assert_array_equal(getattr(getattr(split, part), field),
                                          getattr(getattr(ref, part), field))


# ----------------------------------------------------------------------------- formats


@pytest.mark.parametrize("kind", ["csv", "csv.gz", "tsv", "tsv.gz", "parquet", "jsonl",
                                  "jsonl.gz"])
def test_every_format_gives_the_builtin_preprocessing_of_its_rows(tmp_path, kind):
    rows = toy_rows()
    path = tmp_path / f"log.{kind}"
    opener = gzip.open if kind.endswith(".gz") else open
    if kind.startswith("csv"):
        write_csv(path, rows, opener=opener)
    elif kind.startswith("tsv"):
        write_csv(path, rows, sep="\t", opener=opener)
    elif kind == "parquet":
        write_parquet(path, rows)
    else:
        write_jsonl(path, rows, opener=opener)
    got = load_user_log(source(path), min_item_interactions=3)
    ref = reference(rows, min_item_interactions=3)
    assert_same_interactions(got, ref)
    assert got.raw_users.dtype.kind == "U" and got.raw_items.dtype == np.int64
    assert (got.num_rows, got.skipped_lines, got.name) == (len(rows), 0, "log")
    assert got.data_format == kind.split(".")[0]


def test_batches_stream_and_the_vocabulary_spans_them(tmp_path, monkeypatch):
    """Blocks far smaller than the file: many batches, the same result."""
    rows = toy_rows(seed=1, n=3000)
    write_csv(tmp_path / "log.csv", rows)
    write_jsonl(tmp_path / "log.jsonl", rows)
    write_parquet(tmp_path / "log.parquet", rows, row_group_size=1000)
    monkeypatch.setattr(log_readers, "CSV_BLOCK_BYTES", 4096)
    monkeypatch.setattr(log_readers, "JSON_BLOCK_BYTES", 4096)
    monkeypatch.setattr(log_readers, "PARQUET_BATCH_ROWS", 300)
    ref = reference(rows, min_item_interactions=1)
    for name in ("log.csv", "log.jsonl", "log.parquet"):
        piece = source(tmp_path / name).pieces()[0]
        assert len(list(log_readers.read_batches(piece, list(COLUMNS)))) > 3, name
        got = load_user_log(source(tmp_path / name), min_item_interactions=1)
        assert_same_interactions(got, ref)


def test_a_glob_or_a_directory_reads_its_files_in_path_order(tmp_path):
    rows = toy_rows(seed=2)
    parts = tmp_path / "log"
    (parts / "day=2").mkdir(parents=True)
    write_parquet(parts / "part-0.parquet", rows[:200], row_group_size=64)
    write_csv(parts / "day=2" / "part-1.csv.gz", rows[200:450], opener=gzip.open)
    write_jsonl(parts / "part-2.jsonl", rows[450:])
    (parts / "_SUCCESS").write_text("")
    (parts / ".part-0.parquet.crc").write_text("not data")
    ref = reference(rows[200:450] + rows[:200] + rows[450:], min_item_interactions=2)
    # sorted paths: day=2/part-1.csv.gz < part-0.parquet < part-2.jsonl
    got = load_user_log(source(parts), min_item_interactions=2)
    assert_same_interactions(got, ref)
    assert got.data_format == "csv,jsonl,parquet"
    write_csv(tmp_path / "a.csv", rows[:300])
    write_csv(tmp_path / "b.csv", rows[300:])
    assert_same_interactions(load_user_log(source(tmp_path / "?.csv"), min_item_interactions=2),
                             reference(rows, min_item_interactions=2))


def test_pieces_read_apart_and_merged_equal_one_reading(tmp_path):
    """What the Beam source does: a piece per file and Parquet row group, each with its
    own vocabularies, merged in reading order."""
    rows = toy_rows(seed=3, n=900)
    write_parquet(tmp_path / "a.parquet", rows[:500], row_group_size=100)
    write_csv(tmp_path / "b.csv", rows[500:])
    log = source(tmp_path)
    assert len(log.pieces()) == 6
    merged = merge_raw_logs([read_piece(log, p) for p in log.pieces()])
    whole = read_user_log(log)
    for name in ("user", "item", "timestamp", "weight"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(whole, name))
    np.testing.assert_array_equal(merged.users.values(), whole.users.values())
    assert merged.report.rows == whole.report.rows == 900


def test_explicit_format_and_extensions(tmp_path):
    rows = toy_rows(seed=4, n=50)
    write_csv(tmp_path / "log.txt", rows, sep="\t")
    got = load_user_log(source(tmp_path / "log.txt", format="tsv"), min_item_interactions=1)
    assert_same_interactions(got, reference(rows, min_item_interactions=1))
    with pytest.raises(ValueError) as excinfo:
        load_user_log(source(tmp_path / "log.txt"))
    one_line(excinfo, "cannot tell the format", "log.txt", "--log-format")
    with pytest.raises(ValueError, match="`format` must be one of"):
        source(tmp_path / "log.txt", format="xlsx")


def test_iso_8601_and_integer_times(tmp_path):
    times = ["2000-10-04T12:00:00Z", "2000-10-04 12:00:00", "2000-10-04T14:00:00+02:00",
             "2000-10-04", "970660800", "2000-10-04T12:00:00.75"]
    expected = [calendar.timegm((2000, 10, 4, 12, 0, 0)), calendar.timegm((2000, 10, 4, 12, 0, 0)),
                calendar.timegm((2000, 10, 4, 12, 0, 0)), calendar.timegm((2000, 10, 4, 0, 0, 0)),
                970660800, calendar.timegm((2000, 10, 4, 12, 0, 0))]
    rows = [(f"u{k}", "a" if k % 2 else "b", t, 1) for k, t in enumerate(times)]
    write_csv(tmp_path / "mixed.csv", rows)
    got = load_user_log(source(tmp_path / "mixed.csv"), min_item_interactions=1)
    by_user = dict(zip(got.raw_users[got.user], got.timestamp))
    assert [by_user[f"u{k}"] for k in range(len(times))] == expected
    for k, text in enumerate(times[:4]):  # one format per file: Arrow's vectorised parsers
        write_csv(tmp_path / f"one{k}.csv", [("u", "a", text, 1), ("v", "b", text, 1)])
        got = load_user_log(source(tmp_path / f"one{k}.csv"), min_item_interactions=1)
        assert got.timestamp.tolist() == [expected[k]] * 2, text
    table = pa.table({"user": [1, 2], "item": [5, 6], "ts": pa.array(
        [0, 90_000_000_000], pa.timestamp("ms", tz="UTC")), "weight": [1.0, 2.0]})
    pq.write_table(table, tmp_path / "ts.parquet")
    got = load_user_log(source(tmp_path / "ts.parquet"), min_item_interactions=1)
    assert sorted(got.timestamp.tolist()) == [0, 90_000_000]


def test_without_times_each_user_keeps_the_file_order(tmp_path):
    rows = [("b", 2), ("a", 1), ("b", 1), ("a", 3), ("b", 3)]
    write_csv(tmp_path / "pairs.csv", rows, header=("user", "item"))
    got = load_user_log(source(tmp_path / "pairs.csv", time=None, weight=None),
                        min_item_interactions=1)
    assert got.timestamp is None and got.weight is None
    assert [got.raw_items[s - 1].tolist() for s in got.sequences()] == [[2, 1, 3], [1, 3]]
    assert got.raw_users.tolist() == ["b", "a"]


def test_deduplication_and_minimum_counts(tmp_path):
    rows = [("a", "x", 5, 1), ("a", "x", 3, 2), ("a", "y", 4, 1), ("b", "x", 1, 1),
            ("b", "y", 2, 1), ("b", "y", 2, 7), ("c", "z", 9, 1)]
    write_csv(tmp_path / "dup.csv", rows)
    got = load_user_log(source(tmp_path / "dup.csv"), min_item_interactions=1,
                        deduplicate=True)
    pairs = sorted(zip(got.raw_users[got.user].tolist(), got.raw_items[got.item - 1].tolist(),
                       got.timestamp.tolist(), got.weight.tolist()))
    # (a, x) keeps its earliest (t=3); (b, y) ties in time: the first in the file
    assert pairs == [("a", "x", 3, 2.0), ("a", "y", 4, 1.0), ("b", "x", 1, 1.0),
                     ("b", "y", 2, 1.0), ("c", "z", 9, 1.0)]
    got = load_user_log(source(tmp_path / "dup.csv"), min_item_interactions=2,
                        min_user_interactions=2, deduplicate=True)
    assert sorted(got.raw_users.tolist()) == ["a", "b"] and len(got) == 4


def test_text_ids_that_are_integers_are_integers_unless_some_are_not(tmp_path):
    write_csv(tmp_path / "ints.csv", [(10, 7, 1, 1), (20, 7, 2, 1), (10, 8, 3, 1)])
    got = load_user_log(source(tmp_path / "ints.csv"), min_item_interactions=1)
    assert got.raw_users.dtype == np.int64 and got.raw_users.tolist() == [10, 20]
    write_csv(tmp_path / "zeros.csv", [("010", 7, 1, 1), ("10", 8, 2, 1)])
    got = load_user_log(source(tmp_path / "zeros.csv"), min_item_interactions=1)
    assert got.raw_users.tolist() == ["010", "10"]  # two users, kept as written
    with open(tmp_path / "mixed.jsonl", "w") as f:
        f.write('{"user": 7, "item": 1, "ts": 1, "weight": 1}\n'
                '{"user": "u7", "item": 2, "ts": 2, "weight": 1}\n')
    got = load_user_log(source(tmp_path / "mixed.jsonl"), min_item_interactions=1)
    assert got.raw_users.tolist() == ["7", "u7"]


def test_vocabularies_are_saved_atomically_and_map_back(tmp_path):
    rows = toy_rows(seed=5, n=200)
    write_csv(tmp_path / "log.csv", rows)
    inter = load_user_log(source(tmp_path / "log.csv"), min_item_interactions=1)
    paths = save_vocabularies(inter, str(tmp_path / "run" / "vocabulary"))
    assert sorted(os.listdir(tmp_path / "run" / "vocabulary")) == ["items.json", "users.json"]
    users, items = load_vocabularies(str(tmp_path / "run" / "vocabulary"))
    with open(paths["items"]) as f:
        assert json.load(f)["id_type"] == "int"
    np.testing.assert_array_equal(users.ids, inter.raw_users)
    np.testing.assert_array_equal(items.ids, inter.raw_items)
    # every interaction maps back to a (user, item) pair of the file, and all of them do
    mapped = set(zip(users.to_raw(inter.user).tolist(), items.to_raw(inter.item).tolist()))
    assert mapped == {(u, i) for u, i, _, _ in rows}
    np.testing.assert_array_equal(items.to_internal(items.ids), np.arange(1, len(items) + 1))
    np.testing.assert_array_equal(items.to_internal([str(items.ids[2])]), [3])  # REST text
    assert items.to_internal([999_999], missing=0).tolist() == [0]
    with pytest.raises(ValueError, match="unknown item id 999999"):
        items.to_internal([999_999])
    with pytest.raises(ValueError, match="outside 1.."):
        items.to_raw([0])  # padding has no raw id
    assert Vocabulary("users", np.array(["b", "a"])).to_internal(["a"]).tolist() == [1]


def test_weights_follow_their_rows(tmp_path):
    rows = [("a", "x", 2, 0.5), ("a", "y", 1, 1.5), ("b", "x", 3, 2.5)]
    write_parquet(tmp_path / "w.parquet", rows)
    got = load_user_log(source(tmp_path / "w.parquet"), min_item_interactions=1)
    found = dict(zip(zip(got.raw_users[got.user].tolist(),
                         got.raw_items[got.item - 1].tolist()), got.weight.tolist()))
    assert found == {("a", "x"): 0.5, ("a", "y"): 1.5, ("b", "x"): 2.5}
    assert got.raw_items[got.item - 1].tolist() == ["y", "x", "x"]  # a's in time order


def test_decimal_weights_are_numbers(tmp_path):
    import decimal

    table = pa.table({"user": ["a", "a", "b"], "item": ["x", "y", "x"], "ts": [2, 1, 3],
                      "weight": pa.array([decimal.Decimal("0.125"), decimal.Decimal("1.500"),
                                          None], pa.decimal128(10, 3))})
    pq.write_table(table, tmp_path / "d.parquet")
    got = load_user_log(source(tmp_path / "d.parquet", skip_bad_lines=True, max_bad_share=1.0),
                        min_item_interactions=1)
    assert sorted(got.weight.tolist()) == [0.125, 1.5]  # the null is a skipped bad row
    assert got.skipped_lines == 1


def test_every_split_matches_make_split_on_the_same_interactions(tmp_path):
    rows = toy_rows(seed=6, users=600, n=4000)
    write_csv(tmp_path / "log.csv", rows)
    ref = reference(rows, min_item_interactions=5)
    for name, options in (("temporal", {"fraction": 0.2}), ("loo", {}), ("gsasrec", {})):
        got = load_user_log_split(source(tmp_path / "log.csv"), name,
                                  temporal_fraction=options.get("fraction"))
        want = make_split(ref, name, **options)
        np.testing.assert_array_equal(got.train_lengths, want.train_lengths)
        np.testing.assert_array_equal(got.test.targets, want.test.targets)
        np.testing.assert_array_equal(got.validation.users, want.validation.users)
        assert got.stats() == want.stats()


# --------------------------------------------------------------------------- bad input


def test_a_missing_column_is_named_with_the_columns_the_file_has(tmp_path):
    rows = toy_rows(n=20)
    write_csv(tmp_path / "log.csv", rows)
    write_parquet(tmp_path / "log.parquet", rows)
    write_jsonl(tmp_path / "log.jsonl", rows)
    for name in ("log.csv", "log.parquet", "log.jsonl"):
        bad = UserLogSource(str(tmp_path / name), "user", "movie", time_column="ts")
        with pytest.raises(DataFormatError) as excinfo:
            load_user_log(bad)
        one_line(excinfo, name, "no column 'movie'", "'user', 'item', 'ts', 'weight'")


def test_a_malformed_row_names_file_and_line_and_skip_bad_lines_counts(tmp_path):
    rows = toy_rows(n=30)
    lines = ["user,item,ts,weight"] + [",".join(map(str, r)) for r in rows]
    lines.insert(4, "u1,2,3")  # line 5: three fields
    lines.insert(9, "u1,2,3,4,5")  # line 10: five
    (tmp_path / "bad.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "bad.csv"), min_item_interactions=1)
    one_line(excinfo, f"{tmp_path / 'bad.csv'}, line 5:", "expected 4 fields, found 3",
             "--skip-bad-lines")
    got = load_user_log(source(tmp_path / "bad.csv", skip_bad_lines=True, max_bad_share=1.0),
                        min_item_interactions=1)
    assert (got.skipped_lines, got.num_rows) == (2, len(rows))
    assert_same_interactions(got, reference(rows, min_item_interactions=1))
    text = "\n".join(json.dumps(dict(zip(COLUMNS, r))) for r in rows[:5])
    (tmp_path / "bad.jsonl").write_text(text + '\n{"user": "u1", "item": 2,\n' +
                                        json.dumps(dict(zip(COLUMNS, rows[5]))) + "\n")
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "bad.jsonl"), min_item_interactions=1)
    one_line(excinfo, f"{tmp_path / 'bad.jsonl'}, line 6:")
    got = load_user_log(source(tmp_path / "bad.jsonl", skip_bad_lines=True, max_bad_share=1.0),
                        min_item_interactions=1)
    assert (got.skipped_lines, got.num_rows) == (1, 6)


def test_an_empty_id_or_an_unparseable_timestamp_is_a_malformed_row(tmp_path):
    rows = [("a", "x", "2000-01-01", 1), ("b", "y", "5", 1), ("c", "x", "yesterday", 1),
            ("", "y", "7", 1), ("d", "y", "8", 1)]
    write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "t.csv"), min_item_interactions=1)
    one_line(excinfo, f"{tmp_path / 't.csv'}, line 4:", "unparseable timestamp",
             "'yesterday'")
    got = load_user_log(source(tmp_path / "t.csv", skip_bad_lines=True, max_bad_share=1.0),
                        min_item_interactions=1)
    assert got.skipped_lines == 2 and sorted(got.raw_users.tolist()) == ["a", "b", "d"]
    rows[2] = ("c", "x", "6", 1)
    write_csv(tmp_path / "t.csv", rows)
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "t.csv"), min_item_interactions=1)
    one_line(excinfo, f"{tmp_path / 't.csv'}, line 5:", "no user id in column 'user'")
    write_parquet(tmp_path / "t.parquet", [("a", "x", 1, 1.0)] * 3 + [("b", "x", None, 1.0)])
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "t.parquet"), min_item_interactions=1)
    one_line(excinfo, f"{tmp_path / 't.parquet'}, row 4:", "unparseable timestamp")


def test_empty_files(tmp_path):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("user,item,ts,weight\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    for name in ("empty.csv", "header.csv", "empty.jsonl"):
        with pytest.raises(DataFormatError) as excinfo:
            load_user_log(source(tmp_path / name))
        one_line(excinfo, name, "no interactions (0 rows read")
    with pytest.raises(FileNotFoundError, match="no file matches"):
        load_user_log(source(tmp_path / "nothing-*.csv"))
    (tmp_path / "broken.csv.gz").write_bytes(gzip.compress(b"user,item,ts,weight\n" +
                                                           b"a,1,2,3\n" * 5000)[:300])
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "broken.csv.gz"))
    one_line(excinfo, "broken.csv.gz")


def test_too_few_interactions_after_filtering_and_empty_splits(tmp_path):
    rows = toy_rows(seed=7, n=40)
    write_csv(tmp_path / "small.csv", rows)
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log(source(tmp_path / "small.csv"), min_item_interactions=100)
    one_line(excinfo, "too few interactions left after filtering", "min_item_interactions=100")
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log_split(source(tmp_path / "small.csv"), "temporal", temporal_fraction=0.001,
                            min_item_interactions=1)
    one_line(excinfo, "the temporal split leaves the validation and test parts empty",
             "--temporal-fraction")
    write_csv(tmp_path / "short.csv", [(f"u{k}", k % 3, k, 1) for k in range(12)])
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log_split(source(tmp_path / "short.csv"), "loo", min_item_interactions=1)
    one_line(excinfo, "the loo split leaves the validation and test parts empty")
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log_split(source(tmp_path / "short.csv"), "gsasrec", min_item_interactions=1)
    one_line(excinfo, "draws 512 validation users", "has 12")
    with pytest.raises(DataFormatError) as excinfo:
        load_user_log_split(source(tmp_path / "short.csv", time=None), "temporal")
    one_line(excinfo, "the temporal split needs times", "--time-column")
