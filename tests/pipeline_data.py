"""Helpers shared by the data-layer tests (test_datasets, test_splits, test_sequential):
ratings rows, a toy `Interactions`, the ../shared/data root, and a per-test data cache;
and the one fake MovieLens-1M ``ratings.dat`` writer every training test uses (conftest's
fixtures, test_trained, test_diagnose)."""

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


def write_ratings(directory, users=40, items=30, seed=0, per_user=(8, 14), first_item=100,
                  zipf=1.4, rating=4, clusters=0, jitter=False) -> str:
    """Writes a small MovieLens-1M ``ratings.dat`` (``user::item::rating::time``) into
    ``directory`` (made if absent) and returns the directory.

    User ``u`` (1..``users``) rates ``per_user`` items (an int, or a ``[low, high)`` range
    drawn per user), each ``first_item + (offset + Zipf(zipf)) % items``: popular items are
    the first ones. ``clusters > 0`` gives each user a favourite cluster ``c`` in
    ``[0, clusters)`` and the offset ``10 c``, else the offset is 0. The ``k``-th rating's
    time is ``1_000_000 + 1000 k`` plus ``u`` (or, with ``jitter``, a draw in ``[0, 999)``).
    """
    rng = np.random.default_rng(seed)
    lines = []
    for u in range(1, users + 1):
        offset = int(rng.integers(0, clusters)) * 10 if clusters else 0
        count = per_user if isinstance(per_user, int) else int(rng.integers(*per_user))
        for k in range(count):
            item = first_item + (offset + int(rng.zipf(zipf))) % items
            extra = int(rng.integers(0, 999)) if jitter else u
            lines.append(f"{u}::{item}::{rating}::{1_000_000 + 1000 * k + extra}\n")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "ratings.dat"), "w") as f:
        f.writelines(lines)
    return str(directory)


def _toy_interactions():
    rows = _ratings_rows(seed=5, users=12, items=6, per_user=(2, 7))
    u, i, _, t = map(np.array, zip(*rows))
    return build_interactions(u, i, t, min_item_interactions=1), rows
