"""Specification of `tfrs_logq.pipelines.interactions`' cache entries: `save_cache` writes
a whole entry or none (through `tfrs_logq._util.atomic`), `load_cache` reads it back. (The
loaders that use the cache, and the parsing, are specified in test_datasets.py.)"""

import os

import numpy as np
import pytest

from tfrs_logq.pipelines.interactions import build_interactions, load_cache, save_cache


def _interactions(seed=0, n=200):
    rng = np.random.default_rng(seed)
    return build_interactions(rng.integers(0, 20, n), rng.integers(100, 130, n),
                              np.arange(n, dtype=np.int64), min_item_interactions=1,
                              name="toy")


def test_a_saved_entry_loads_back_whole(tmp_path):
    entry = tmp_path / "preprocessed" / "key"
    data = _interactions()
    save_cache(data, str(entry), {"params": {"x": 1}})
    assert sorted(os.listdir(entry)) == ["interactions.npz", "manifest.json"]
    assert os.listdir(tmp_path / "preprocessed") == ["key"]  # no staging left
    loaded = load_cache(str(entry))
    for field in ("user", "item", "timestamp", "raw_users", "raw_items"):
        np.testing.assert_array_equal(getattr(loaded, field), getattr(data, field))
    assert loaded.name == "toy"


def test_saving_again_replaces_the_entry_whole(tmp_path):
    entry = tmp_path / "key"
    save_cache(_interactions(0), str(entry), {})
    (entry / "stray.txt").write_text("from the old entry")
    newer = _interactions(1)
    save_cache(newer, str(entry), {})
    assert sorted(os.listdir(entry)) == ["interactions.npz", "manifest.json"]
    assert os.listdir(tmp_path) == ["key"]  # the old entry moved aside, then removed
    np.testing.assert_array_equal(load_cache(str(entry)).item, newer.item)


def test_a_failed_save_leaves_the_old_entry_and_no_staging(tmp_path, monkeypatch):
    entry = tmp_path / "key"
    old = _interactions(0)
    save_cache(old, str(entry), {})

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", boom)
    with pytest.raises(KeyboardInterrupt):
        save_cache(_interactions(1), str(entry), {})
    assert os.listdir(tmp_path) == ["key"]
    np.testing.assert_array_equal(load_cache(str(entry)).item, old.item)


def test_an_entry_has_the_usual_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        save_cache(_interactions(), str(tmp_path / "key"), {})
    finally:
        os.umask(mask)
    assert (tmp_path / "key").stat().st_mode & 0o777 == 0o755
