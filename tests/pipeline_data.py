"""Helpers shared by the data-layer tests (test_datasets, test_splits, test_sequential):
ratings rows, a toy `Interactions`, the ../shared/data root, and a per-test data cache."""

import os

import numpy as np
import pytest

from tfrs_logq.pipelines.interactions import build_interactions

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
needs_shared = pytest.mark.skipif(not os.path.isdir(SHARED), reason="../shared/data absent")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TFRS_LOGQ_DATA_DIR", raising=False)


def _ratings_rows(seed=0, users=30, items=25, per_user=(4, 12)):
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(1, users + 1):
        n = rng.integers(*per_user)
        for i in rng.choice(items, size=n, replace=False) + 1:
            rows.append((u, int(i * 7), int(rng.integers(1, 5)),
                         int(1_000_000 + rng.integers(0, 50) * 100)))  # many time ties
    return rows


def _toy_interactions():
    rows = _ratings_rows(seed=5, users=12, items=6, per_user=(2, 7))
    u, i, _, t = map(np.array, zip(*rows))
    return build_interactions(u, i, t, min_item_interactions=1), rows
