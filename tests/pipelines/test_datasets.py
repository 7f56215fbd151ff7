"""Specification of the dataset loaders and preprocessing (the splits are in test_splits.py,
the sequential pipelines in test_sequential.py).

Fixtures are written by the tests. Tests on the real files in ../shared/data skip
cleanly when that directory is absent.
"""

import gzip
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from collections import defaultdict

import numpy as np
import pytest
from pipeline_data import SHARED, _ratings_rows, isolated_cache, needs_shared  # noqa: F401

from tfrs_logq.pipelines import datasets as ds_mod
from tfrs_logq.pipelines.datasets import (
    DataNotFoundError,
    load_movielens_1m,
    load_steam,
    read_ratings_dat,
    read_steam_reviews,
)
from tfrs_logq.pipelines.interactions import DataFormatError, ParseReport, build_interactions


def _write_ratings(path, rows, compress=False):
    text = "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows)
    if compress:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)


def _reference_preprocess(rows, min_item=5):
    """numpy/dict reference: drop items with < min_item, order each user's rows by
    (timestamp, file order), map ids by first appearance."""
    counts = defaultdict(int)
    for _, i, _, _ in rows:
        counts[i] += 1
    kept = [(pos, r) for pos, r in enumerate(rows) if counts[r[1]] >= min_item]
    user_ids, item_ids = {}, {}
    for _, (u, i, _, _) in kept:
        user_ids.setdefault(u, len(user_ids))
        item_ids.setdefault(i, len(item_ids) + 1)
    seqs = defaultdict(list)
    for pos, (u, i, _, t) in sorted(kept, key=lambda x: (user_ids[x[1][0]], x[1][3], x[0])):
        seqs[user_ids[u]].append((item_ids[i], t))
    return seqs, user_ids, item_ids


@pytest.mark.parametrize("form", ["plain", "gz", "zip"])
def test_movielens_ratings_loading_matches_reference(tmp_path, form):
    rows = _ratings_rows()
    data = tmp_path / "data"
    data.mkdir()
    if form == "zip":
        with zipfile.ZipFile(data / "ml-1m.zip", "w") as z:
            z.writestr("ml-1m/ratings.dat", "".join(f"{u}::{i}::{r}::{t}\n" for u, i, r, t in rows))
    else:
        _write_ratings(data / ("ratings.dat.gz" if form == "gz" else "ratings.dat"), rows,
                       compress=form == "gz")
    inter = load_movielens_1m(str(data), download_ok=False)
    seqs, user_ids, item_ids = _reference_preprocess(rows)
    assert inter.num_users == len(user_ids) and inter.num_items == len(item_ids)
    got = inter.sequences()
    offsets = inter.user_offsets()
    for u, expected in seqs.items():
        np.testing.assert_array_equal(got[u], [i for i, _ in expected])
        np.testing.assert_array_equal(inter.timestamp[offsets[u]:offsets[u + 1]],
                                      [t for _, t in expected])
    assert inter.item.min() >= 1  # 0 is padding
    np.testing.assert_array_equal(inter.raw_items[[v - 1 for v in item_ids.values()]],
                                  list(item_ids.keys()))


def test_cache_makes_second_run_fast_and_is_atomic(tmp_path, monkeypatch):
    data = tmp_path / "d"
    data.mkdir()
    _write_ratings(data / "ratings.dat", _ratings_rows())
    first = load_movielens_1m(str(data), download_ok=False)
    calls = []
    with monkeypatch.context() as patch:
        patch.setattr(ds_mod, "read_ratings_dat", lambda *a, **k: calls.append(1))
        second = load_movielens_1m(str(data), download_ok=False)
    assert not calls  # served from the cache
    np.testing.assert_array_equal(first.item, second.item)
    # An interrupted write leaves nothing a later run trusts.
    cache_root = tmp_path / "cache" / "preprocessed"
    for entry in cache_root.iterdir():
        for f in entry.iterdir():
            f.unlink()
        entry.rmdir()

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(KeyboardInterrupt):
        load_movielens_1m(str(data), download_ok=False)
    assert list(cache_root.iterdir()) == []  # temp dir removed, no half cache


def test_malformed_lines_error_with_file_and_line_or_are_counted(tmp_path):
    path = tmp_path / "ratings.dat"
    path.write_text("1::10::5::100\n2::20::oops::200\n3::30\n4::40::1::400\n")
    with pytest.raises(DataFormatError, match=r"ratings\.dat, line 3"):
        read_ratings_dat(str(path))
    report = ParseReport()
    users, items, times = read_ratings_dat(str(path), skip_bad_lines=True, report=report)
    # "oops" sits in the rating column, which implicit feedback ignores: line 2 is valid.
    assert report.skipped == 1 and report.lines == 4
    np.testing.assert_array_equal(users, [1, 2, 4])


def test_offline_without_files_names_what_to_fetch(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"ml-1m\.zip.*--data-dir"):
        load_movielens_1m(str(tmp_path), download_ok=False)
    with pytest.raises(DataNotFoundError, match=r"steam_reviews\.json\.gz"):
        load_steam(str(tmp_path), download_ok=False)


def _write_steam(path, rows):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for user, item, date in rows:
            record = {"username": user, "hours": 1.5, "products": 3, "product_id": item,
                      "page_order": 0, "date": date, "text": "a 'quoted' review",
                      "early_access": False, "page": 1}
            f.write(repr(record) + "\n")


def test_steam_reviews_and_csv_loaders(tmp_path):
    rng = np.random.default_rng(3)
    rows = []
    for u in range(20):
        for _ in range(rng.integers(3, 9)):
            rows.append((f"user {u}", str(int(rng.integers(0, 8)) + 1000),
                         f"2017-0{int(rng.integers(1, 9))}-1{int(rng.integers(0, 9))}"))
    data = tmp_path / "steam"
    data.mkdir()
    _write_steam(data / "steam_reviews.json.gz", rows)
    inter = load_steam(str(data), download_ok=False)
    users, items, times = read_steam_reviews(str(data / "steam_reviews.json.gz"))
    assert list(users[:2]) == [rows[0][0], rows[1][0]] and times.dtype == np.int64
    assert len(inter) == sum(1 for r in rows if sum(x[1] == r[1] for x in rows) >= 5)
    # Same data as a user,item,timestamp CSV gives the same preprocessing.
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    with open(csv_dir / "steam.csv", "w") as f:
        f.write("user,item,timestamp\n")
        for u, i, t in zip(users, items, times):
            f.write(f"{u},{i},{t}\n")
    from_csv = load_steam(str(csv_dir), download_ok=False)
    np.testing.assert_array_equal(inter.item, from_csv.item)
    np.testing.assert_array_equal(inter.timestamp, from_csv.timestamp)
    bad = tmp_path / "bad"
    bad.mkdir()
    with gzip.open(bad / "steam_reviews.json.gz", "wt") as f:
        f.write("{'username': 'a', 'product_id': '1', 'date': '2017-01-01'}\nnot a dict\n")
    with pytest.raises(DataFormatError, match="line 2"):
        load_steam(str(bad), download_ok=False)


# ----------------------------------------------------------------------- real data (shared/)


@needs_shared
def test_time_order_tie_break_matches_sasrec_on_timestamped_users():
    partial = os.path.join(SHARED, "ml-1m-partial", "ratings.dat.gz")
    users, items, times = read_ratings_dat(partial)
    sas = load_movielens_1m(os.path.join(SHARED, "ml-1m-sasrec"), fmt="sasrec",
                            download_ok=False)
    with gzip.open(os.path.join(SHARED, "ml-1m-sasrec", "sas_to_original_items.txt.gz"), "rt") as f:
        item_map = dict(tuple(map(int, line.split())) for line in f)
    with gzip.open(os.path.join(SHARED, "ml-1m-sasrec", "sas_to_original_users.txt.gz"), "rt") as f:
        user_map = dict(tuple(map(int, line.split())) for line in f)
    keep = np.isin(items, list(item_map.values()))
    ours = build_interactions(users[keep], items[keep], times[keep], min_item_interactions=1)
    ours_seqs = {int(ours.raw_users[u]): ours.raw_items[s - 1] for u, s in
                 enumerate(ours.sequences())}
    sas_seqs = sas.sequences()
    checked = 0
    for sas_user, original in user_map.items():
        if original in ours_seqs:
            expected = [item_map[i] for i in sas_seqs[sas_user - 1]]
            np.testing.assert_array_equal(ours_seqs[original], expected)
            checked += 1
    assert checked == 2999


@needs_shared
def test_partial_ratings_temporal_stats_via_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "data", "stats", "--dataset", "ml-1m",
         "--split", "temporal", "--data-dir", os.path.join(SHARED, "ml-1m-partial"),
         "--no-download", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (stats["num_users"], stats["num_items"], stats["num_interactions"]) == \
        (2999, 3266, 486_907)
    assert stats["time_range"] == [970620734, 1046388675]
    assert stats["test"]["num_targets"] == round(0.1 * 486_907)
    assert stats["validation"]["num_targets"] == round(0.1 * 486_907)
    assert stats["train"]["num_interactions"] == 486_907 - 2 * round(0.1 * 486_907)


def test_cli_temporal_without_timestamps_is_a_clear_error(tmp_path):
    (tmp_path / "ml-1m.txt").write_text("1 1\n1 2\n1 3\n2 1\n2 2\n2 3\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "data", "stats", "--dataset", "ml-1m",
         "--split", "temporal", "--data-format", "sasrec", "--data-dir", str(tmp_path),
         "--no-download"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "TFRS_LOGQ_CACHE_DIR": str(tmp_path / "c")},
    )
    assert proc.returncode == 2 and "needs timestamps" in proc.stderr


def test_tfds_loader_reads_movielens_1m_ratings_features():
    tfds = pytest.importorskip("tensorflow_datasets")
    from tfrs_logq.pipelines.datasets import load_movielens_1m_tfds

    with tfds.testing.mock_data(num_examples=200):
        inter = load_movielens_1m_tfds(min_item_interactions=1)
    assert len(inter) == 200 and inter.timestamp is not None
    assert inter.item.min() >= 1


def test_download_verifies_checksum_over_loopback_http(tmp_path):
    import functools
    import http.server
    import threading

    served = tmp_path / "served"
    served.mkdir()
    payload = b"1::10::5::100\n" * 50
    (served / "ml-1m.zip").write_bytes(payload)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        url = f"{base}/ml-1m.zip"
        dest = tmp_path / "dl" / "ml-1m.zip"
        with pytest.raises(OSError, match="checksum mismatch") as mismatch:
            ds_mod.download(url, "0" * 64, str(dest))
        assert "\n" not in str(mismatch.value)
        assert not dest.exists() and list(dest.parent.iterdir()) == []  # nothing half-written
        with pytest.raises(OSError, match=r"downloading .*/missing\.zip failed.*404") as missing:
            ds_mod.download(f"{base}/missing.zip", "0" * 64, str(tmp_path / "dl" / "m.zip"))
        assert "\n" not in str(missing.value) and list(dest.parent.iterdir()) == []
        digest = hashlib.sha256(payload).hexdigest()
        assert ds_mod.download(url, digest, str(dest)) == str(dest)
        assert dest.read_bytes() == payload
    finally:
        server.shutdown()
        server.server_close()
    # A verified copy is not fetched again (the server is gone).
    assert ds_mod.download(url, digest, str(dest)) == str(dest)
    # The loader's error for a download that cannot happen: one line, the hint included.
    with pytest.raises(DataNotFoundError, match=r"download failed: downloading .* failed") as e:
        ds_mod._fetch_or_explain(f"{base}/ml-1m.zip", digest, "ml-1m.zip", "ratings",
                                 str(tmp_path / "cache"), "cache", True)
    assert "\n" not in str(e.value) and not (tmp_path / "cache" / "ml-1m.zip").exists()


# ------------------------------------------------------ resolution, errors and the cache


def _sasrec_dir(root, name="sasrec"):
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "ml-1m.txt").write_text(
        "".join(f"{u} {i}\n" for u in range(1, 9) for i in range(1, 7)))
    return directory


def _no_download(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nothing may be downloaded here")

    monkeypatch.setattr(ds_mod, "download", refuse)


def test_temporal_on_a_sasrec_only_directory_says_timestamps_are_missing(tmp_path, monkeypatch):
    _no_download(monkeypatch)
    data = _sasrec_dir(tmp_path)
    with pytest.raises(ValueError, match=r"temporal split needs timestamps.*ml-1m\.txt.*"
                                         r"--split loo.*ratings\.dat"):
        ds_mod.load_dataset("ml-1m", str(data), needs_timestamps=True)
    with pytest.raises(ValueError, match="temporal split needs timestamps"):
        ds_mod.load_dataset("ml-1m", str(data), needs_timestamps=True, fmt="sasrec")


def test_data_dir_always_wins_and_is_checked(tmp_path, monkeypatch):
    _no_download(monkeypatch)
    elsewhere = tmp_path / "env"
    elsewhere.mkdir()
    _write_ratings(elsewhere / "ratings.dat", _ratings_rows())
    monkeypatch.setenv("TFRS_LOGQ_DATA_DIR", str(elsewhere))
    with pytest.raises(ValueError, match="--data-dir is empty"):
        ds_mod.load_dataset("ml-1m", "")
    missing = tmp_path / "nope"
    with pytest.raises(DataNotFoundError, match=r"--data-dir .*nope.* does not exist"):
        ds_mod.load_dataset("ml-1m", str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataNotFoundError, match=r"empty"):  # not the env directory's file
        ds_mod.load_dataset("ml-1m", str(empty), needs_timestamps=True)
    monkeypatch.setenv("TFRS_LOGQ_DATA_DIR", str(missing))
    with pytest.raises(DataNotFoundError, match=r"TFRS_LOGQ_DATA_DIR.*nope.*does not exist"):
        ds_mod.load_dataset("ml-1m")


def test_several_candidate_files_are_an_error_naming_them_and_the_flag(tmp_path, monkeypatch):
    _no_download(monkeypatch)
    data = tmp_path / "data"
    (data / "partial").mkdir(parents=True)
    _write_ratings(data / "partial" / "ratings.dat", _ratings_rows())
    _sasrec_dir(data, "sasrec")
    with pytest.raises(ds_mod.AmbiguousDataError,
                       match=r"partial/ratings\.dat.*sasrec/ml-1m\.txt.*--data-format"):
        ds_mod.load_dataset("ml-1m", str(data))  # loo/gsasrec: either format would do
    sas = ds_mod.load_dataset("ml-1m", str(data), fmt="sasrec")
    assert sas.source.endswith("ml-1m.txt") and sas.timestamp is None
    temporal = ds_mod.load_dataset("ml-1m", str(data), needs_timestamps=True)
    assert temporal.source.endswith("ratings.dat") and temporal.timestamp is not None
    # Two files of the same format: name both and the flag that narrows the choice.
    _write_ratings(data / "ratings.dat.gz", _ratings_rows(), compress=True)
    with pytest.raises(ds_mod.AmbiguousDataError, match=r"ratings\.dat.*ratings\.dat\.gz.*"
                                                        r"--data-dir"):
        ds_mod.load_dataset("ml-1m", str(data), needs_timestamps=True)


def test_sasrec_file_has_no_download_and_the_error_says_so(tmp_path, monkeypatch):
    _no_download(monkeypatch)
    with pytest.raises(DataNotFoundError, match=r"no official download.*--data-format ratings"):
        ds_mod.load_dataset("ml-1m", str(tmp_path))
    with pytest.raises(DataNotFoundError, match=r"no official download"):
        ds_mod.load_dataset("ml-1m", str(tmp_path), fmt="sasrec")


def test_loaded_data_names_its_file_rows_and_skipped_lines_also_from_the_cache(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    rows = _ratings_rows()
    _write_ratings(data / "ratings.dat", rows)
    with open(data / "ratings.dat", "a") as f:
        f.write("broken line\n")
    for _ in range(2):  # built, then read from the cache
        inter = load_movielens_1m(str(data), download_ok=False, skip_bad_lines=True)
        assert inter.source == str(data / "ratings.dat")
        assert (inter.num_rows, inter.skipped_lines) == (len(rows), 1)


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_damaged_gzip_is_a_data_error_naming_the_file(tmp_path, damage):
    data = tmp_path / "d"
    data.mkdir()
    path = data / "ratings.dat.gz"
    _write_ratings(path, _ratings_rows(users=300), compress=True)
    blob = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(blob[:len(blob) // 2])
    else:
        path.write_bytes(blob[:20] + bytes(range(256)) * 4 + blob[20 + 1024:])
    with pytest.raises(DataFormatError, match=r"ratings\.dat\.gz.*(truncated|corrupt)"):
        load_movielens_1m(str(data), download_ok=False)


def test_a_gz_file_that_is_not_gzip_is_a_one_line_error_naming_the_file(tmp_path, capsys):
    # Random bytes named .gz were read as latin-1 text and the parse error
    # quoted them.
    from tfrs_logq import cli

    data = tmp_path / "d"
    data.mkdir()
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    assert noise[:2] != b"\x1f\x8b"
    (data / "ratings.dat.gz").write_bytes(noise)
    with pytest.raises(DataFormatError, match=r"ratings\.dat\.gz is not a gzip file") as info:
        load_movielens_1m(str(data), download_ok=False)
    message = str(info.value)
    assert message.isprintable() and len(message) < 300, message  # no bytes of the file
    code = cli.main(["data", "stats", "--dataset", "ml-1m", "--data-dir", str(data)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "not a gzip file" in err, err
    assert str(data / "ratings.dat.gz") in err and err.isprintable()


def _cache_entry(tmp_path):
    (entry,) = (tmp_path / "cache" / "preprocessed").iterdir()
    return entry


@pytest.mark.parametrize("damage", ["garbage", "truncated", "ids out of range"])
def test_a_damaged_cache_is_rebuilt_not_trusted(tmp_path, damage):
    data = tmp_path / "d"
    data.mkdir()
    _write_ratings(data / "ratings.dat", _ratings_rows())
    first = load_movielens_1m(str(data), download_ok=False)
    npz = _cache_entry(tmp_path) / "interactions.npz"
    if damage == "garbage":
        npz.write_bytes(b"not a zip file at all" * 10)
    elif damage == "truncated":
        npz.write_bytes(npz.read_bytes()[:-200])
    else:
        with np.load(npz) as z:
            arrays = dict(z)
        arrays["item"] = arrays["item"] + 1000  # past num_items
        np.savez(npz, **arrays)
        manifest_path = npz.parent / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        if "npz_sha256" in manifest:  # a consistent manifest: only the range check can tell
            manifest["npz_sha256"] = hashlib.sha256(npz.read_bytes()).hexdigest()
            manifest_path.write_text(json.dumps(manifest))
    again = load_movielens_1m(str(data), download_ok=False)
    np.testing.assert_array_equal(again.item, first.item)
    np.testing.assert_array_equal(again.user, first.user)
    third = load_movielens_1m(str(data), download_ok=False)  # the rebuilt cache is good
    np.testing.assert_array_equal(third.item, first.item)


def test_no_cache_neither_reads_nor_writes_it(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    _write_ratings(data / "ratings.dat", _ratings_rows())
    load_movielens_1m(str(data), download_ok=False, use_cache=False)
    assert not (tmp_path / "cache").exists()


def test_a_cache_directory_that_is_a_file_is_a_clear_error(tmp_path, monkeypatch):
    data = tmp_path / "d"
    data.mkdir()
    _write_ratings(data / "ratings.dat", _ratings_rows())
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(blocker))
    with pytest.raises(NotADirectoryError, match=r"cache-file.*TFRS_LOGQ_CACHE_DIR.*--no-cache"):
        load_movielens_1m(str(data), download_ok=False)
    assert len(load_movielens_1m(str(data), download_ok=False, use_cache=False)) > 0


def test_every_data_error_names_its_file(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "ratings.dat").write_text("")
    with pytest.raises(DataFormatError, match=r"empty/ratings\.dat.*no interactions"):
        load_movielens_1m(str(empty), download_ok=False)
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "ml-1m.txt").write_text("".join(f"{u} 1\n" for u in range(6)))
    with pytest.raises(DataFormatError, match=r"zero/ml-1m\.txt.*start at 1"):
        load_movielens_1m(str(zero), fmt="sasrec", download_ok=False)
    rare = tmp_path / "rare"
    rare.mkdir()
    (rare / "ml-1m.txt").write_text("1 1\n1 2\n2 3\n")  # every item below 5 interactions
    with pytest.raises(DataFormatError, match=r"rare/ml-1m\.txt.*no interactions left"):
        load_movielens_1m(str(rare), fmt="sasrec", download_ok=False)
    bad_zip = tmp_path / "zip"
    bad_zip.mkdir()
    (bad_zip / "ml-1m.zip").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataFormatError, match=r"ml-1m\.zip"):
        load_movielens_1m(str(bad_zip), download_ok=False)


def test_load_split_uses_each_dataset_default_temporal_fraction(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    _write_ratings(data / "ratings.dat", _ratings_rows())
    split = ds_mod.load_split("ml-1m", "temporal", str(data), download_ok=False)
    n = len(split.interactions)
    assert len(split.test) == round(ds_mod.DEFAULT_TEMPORAL_FRACTION["ml-1m"] * n)
    assert ds_mod.load_split("ml-1m", "loo", str(data), data_format="ratings").name == "loo"


@needs_shared
def test_shared_data_root_is_ambiguous_for_loo_and_resolves_with_data_format():
    with pytest.raises(ds_mod.AmbiguousDataError, match=r"ml-1m-partial.*ml-1m-sasrec"):
        ds_mod.load_dataset("ml-1m", SHARED, download_ok=False)
    inter = ds_mod.load_dataset("ml-1m", SHARED, fmt="sasrec", download_ok=False)
    assert inter.source.endswith("ml-1m-sasrec/ml-1m.txt.gz") and inter.num_rows == 999_611


@pytest.mark.parametrize("split_name, fraction", [("temporal", None), ("temporal", 0.2),
                                                  ("loo", None)])
def test_training_load_config_split_gives_the_data_layer_split(tmp_path, split_name, fraction):
    """`tfrs_logq.sasrec.training.load_config_split(config)` and `pipelines.datasets.load_split`
    (the one implementation, with `DEFAULT_TEMPORAL_FRACTION`) give the same split."""
    from tfrs_logq.sasrec import training
    from tfrs_logq.sasrec.config import TrainConfig

    data = tmp_path / "d"
    data.mkdir()
    _write_ratings(data / "ratings.dat", _ratings_rows())
    config = TrainConfig(dataset="ml-1m", split=split_name, data_dir=str(data),
                         temporal_fraction=fraction)
    ours = ds_mod.load_split("ml-1m", split_name, str(data), temporal_fraction=fraction)
    theirs = training.load_config_split(config)
    assert not hasattr(training, "load_split")  # one name: load_config_split
    assert ours.name == theirs.name == split_name
    np.testing.assert_array_equal(ours.train_lengths, theirs.train_lengths)
    for part in ("validation", "test"):
        for field in ("users", "history_lengths", "targets"):
            np.testing.assert_array_equal(getattr(getattr(ours, part), field),
                                          getattr(getattr(theirs, part), field))
