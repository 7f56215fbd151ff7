"""Specification of `tfrs_logq._util.cache`: one variable for the cache location."""

import os
import warnings

import pytest

from tfrs_logq._util.cache import cache_dir


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("TFRS_LOGQ_CACHE_DIR", "TFRS_LOGQ_CACHE", "XDG_CACHE_HOME", "TFRS_LOGQ_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_tfrs_logq_cache_dir_chooses_it(clean_env, tmp_path):
    clean_env.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache_dir() == str(tmp_path)


def test_the_old_name_is_not_read(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path / "home"))
    clean_env.setenv("TFRS_LOGQ_CACHE", str(tmp_path / "old"))
    assert cache_dir() == os.path.join(str(tmp_path / "home"), ".cache", "tfrs_logq")


def test_defaults_to_xdg_cache_home_then_home(clean_env, tmp_path):
    clean_env.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == os.path.join(str(tmp_path / "home"), ".cache", "tfrs_logq")
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == os.path.join(str(tmp_path / "xdg"), "tfrs_logq")
    clean_env.setenv("TFRS_LOGQ_CACHE_DIR", "")  # empty counts as unset
    assert cache_dir() == os.path.join(str(tmp_path / "xdg"), "tfrs_logq")


def test_the_data_loaders_use_this_one_function(clean_env, tmp_path):
    from tfrs_logq.pipelines import datasets

    assert datasets.cache_dir is cache_dir
    clean_env.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path))
    assert datasets.data_root()[0] == str(tmp_path)
