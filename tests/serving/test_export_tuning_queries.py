"""serving/export.py's `run_queries`: the line saying what the index was tuned on counts
the targets it drew and the users they belong to, and names the split they came from."""

import re
import types

import numpy as np

from tfrs_logq.pipelines.splits import EvalPart


class _Encoder:
    max_length = 4

    def last_query(self, padded, training=False):
        return types.SimpleNamespace(numpy=lambda: np.zeros((len(padded), 2), np.float32))


def _part(users):
    users = np.asarray(users, np.int64)
    return EvalPart(users=users, history_lengths=np.full(len(users), 2, np.int64),
                    targets=np.ones(len(users), np.int64))


def _split(validation, test, num_users):
    return types.SimpleNamespace(
        interactions=types.SimpleNamespace(raw_items=np.arange(1, 6), source="log.csv"),
        sequences=[np.array([1, 2, 3]) for _ in range(num_users)],
        validation=validation, test=test)


def _counts(source):
    """``{word: number}`` for each "NUMBER WORD" of the line (thousands separators read)."""
    return {word: int(number.replace(",", ""))
            for number, word in re.findall(r"(\d[\d,]*) (\w+)", source)}


def _run(monkeypatch, split, count):
    from tfrs_logq.serving import export

    monkeypatch.setattr(export, "load_run_split", lambda model_dir: split)
    return export.run_queries(_Encoder(), "run", np.arange(1, 6), count)


def test_the_line_counts_targets_and_the_users_they_belong_to(monkeypatch):
    # 400 users, 3 validation targets each: 1,000 targets drawn cover (nearly) all of them.
    users = np.repeat(np.arange(400), 3)
    queries, source = _run(monkeypatch, _split(_part(users), _part([]), 400), 1000)
    assert len(queries) == 1000
    counts = _counts(source)
    drawn = np.sort(np.random.default_rng(0).choice(len(users), 1000, replace=False))
    assert counts.get("validation") == 1000, source
    assert counts.get("users") == len(np.unique(users[drawn])) <= 400, source
    assert "test" not in source


def test_the_test_split_is_named_where_the_split_has_no_validation_part(monkeypatch):
    queries, source = _run(monkeypatch, _split(_part([]), _part(np.arange(50)), 50), 1000)
    assert len(queries) == 50
    counts = _counts(source)
    assert counts.get("test") == 50 and counts.get("users") == 50, source
    assert "validation" not in source
