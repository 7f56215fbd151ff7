"""pipelines/splits.py: leave-one-out, temporal and gSASRec splits, and the training counts
a split gives the frequency estimators."""

import hashlib
import os

import numpy as np
import pytest
from pipeline_data import SHARED, _toy_interactions, isolated_cache, needs_shared  # noqa: F401

from tfrs_logq.pipelines.datasets import load_movielens_1m
from tfrs_logq.pipelines.interactions import build_interactions
from tfrs_logq.pipelines.splits import gsasrec_split, leave_one_out, temporal_split


def test_leave_one_out_split():
    inter, _ = _toy_interactions()
    split = leave_one_out(inter)
    seqs = inter.sequences()
    for j, u in enumerate(split.test.users):
        assert split.test.targets[j] == seqs[u][-1]
        assert split.test.history_lengths[j] == len(seqs[u]) - 1
    for j, u in enumerate(split.validation.users):
        assert split.validation.targets[j] == seqs[u][-2]
    for u, s in enumerate(seqs):
        assert split.train_lengths[u] == (len(s) - 2 if len(s) >= 3 else len(s))
    counts = split.train_item_counts()
    expected = np.bincount(np.concatenate([s[:n] for s, n in zip(seqs, split.train_lengths)]),
                           minlength=inter.num_items + 1)
    np.testing.assert_array_equal(counts, expected)


def test_temporal_split_properties():
    inter, _ = _toy_interactions()
    split = temporal_split(inter, fraction=0.2)
    n = len(inter)
    assert len(split.test) == round(0.2 * n) and len(split.validation) == round(0.2 * n)
    offsets = inter.user_offsets()
    t_of = lambda u, k: inter.timestamp[offsets[u] + k]  # noqa: E731
    val_start = min(t_of(u, k) for u, k in zip(split.validation.users,
                                                split.validation.history_lengths))
    test_start = min(t_of(u, k) for u, k in zip(split.test.users, split.test.history_lengths))
    assert test_start >= max(t_of(u, k) for u, k in zip(split.validation.users,
                                                        split.validation.history_lengths))
    for u, n_train in enumerate(split.train_lengths):
        if n_train:
            assert t_of(u, n_train - 1) <= val_start  # training only before validation
    for u, k, target in zip(split.test.users, split.test.history_lengths, split.test.targets):
        assert inter.sequences()[u][k] == target  # history = everything before the target
    assert test_start >= val_start
    no_times = build_interactions(np.array([1, 1]), np.array([1, 2]), None,
                                  min_item_interactions=1)
    with pytest.raises(ValueError, match="needs timestamps"):
        temporal_split(no_times)


@needs_shared
def test_sasrec_ml1m_counts_and_gsasrec_split_reproduced():
    inter = load_movielens_1m(os.path.join(SHARED, "ml-1m-sasrec"), fmt="sasrec",
                              download_ok=False)
    assert (len(inter), inter.num_users, inter.num_items) == (999_611, 6040, 3416)
    split = gsasrec_split(inter)
    seqs = split.sequences
    # gSASRec's test/input.txt: git blob 009c2fef..., 4,205,164 bytes (shared/data/README.md).
    test_input = "".join(" ".join(map(str, seqs[u][:n])) + "\n"
                         for u, n in zip(split.test.users, split.test.history_lengths))
    blob = test_input.encode()
    assert len(blob) == 4_205_164
    assert hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest().startswith("009c2fef")
    # gSASRec's val/output.txt: 512 targets, 2,196 bytes, starting 139, 1176, 938, 14, 921.
    val_output = "".join(f"{t}\n" for t in split.validation.targets)
    assert len(split.validation) == 512 and len(val_output) == 2196
    assert list(split.validation.targets[:5]) == [139, 1176, 938, 14, 921]
    # Training: val users lose 3 items, others 2.
    assert split.train_lengths.sum() == 999_611 - 2 * 6040 - 512


def test_training_counts_are_the_reference_for_the_estimators():
    from tfrs_logq import CountMinSketch, ExactFrequency

    inter, _ = _toy_interactions()
    split = temporal_split(inter, fraction=0.2)
    counts = split.train_item_counts()
    train_items = np.concatenate(split.train_sequences())
    np.testing.assert_array_equal(counts, np.bincount(train_items, minlength=len(counts)))
    # No leakage: validation/test targets after the cut are not counted.
    assert counts.sum() == len(inter) - len(split.validation) - len(split.test)
    exact = ExactFrequency.from_counts(counts)
    seen = np.flatnonzero(counts)
    np.testing.assert_allclose(exact.log_q(seen).numpy(), split.train_log_q()[seen], rtol=1e-6)
    sketch = CountMinSketch(depth=4, width=4096)
    sketch.update(train_items)
    np.testing.assert_allclose(sketch.count(seen).numpy(), counts[seen])  # no collisions here
