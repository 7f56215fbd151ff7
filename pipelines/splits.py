"""The paper's evaluation splits: leave-one-out (plus gSASRec's variant) and global temporal.

A `Split` keeps every user's full time-ordered sequence once, plus for each
part (train / validation / test):

- ``train_lengths[u]``: user ``u`` trains on ``sequences[u][:train_lengths[u]]``;
- validation and test: parallel arrays ``users``, ``history_lengths`` and
  ``targets``: target ``targets[j]`` is predicted from
  ``sequences[users[j]][:history_lengths[j]]``.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tfrs_logq.pipelines.interactions import Interactions

SPLITS = ("loo", "gsasrec", "temporal")


@dataclasses.dataclass
class EvalPart:
    users: np.ndarray
    history_lengths: np.ndarray
    targets: np.ndarray

    def __len__(self) -> int:
        return int(len(self.targets))


@dataclasses.dataclass
class Split:
    """A dataset split: the interactions, each user's training sequence (``sequences``,
    the first ``train_lengths`` items of each are training) and the held-out validation and
    test parts (`EvalPart`: the users, how much of their sequence is history, the targets).
    `leave_one_out`, `gsasrec_split` and `temporal_split` make one; `load_split` and
    `tfrs_logq.pipelines.load_user_log_split` load one."""

    name: str
    interactions: Interactions
    sequences: list
    train_lengths: np.ndarray
    validation: EvalPart
    test: EvalPart

    @property
    def num_items(self) -> int:
        return self.interactions.num_items

    def train_sequences(self) -> list:
        return [s[:n] for s, n in zip(self.sequences, self.train_lengths)]

    def train_weights(self) -> Optional[list]:
        """The training interactions' weights (a user log's weight column), parallel to
        `train_sequences`; None when the log has none."""
        weight = self.interactions.weight
        if weight is None:
            return None
        offsets = self.interactions.user_offsets()
        return [weight[offsets[u]:offsets[u] + n] for u, n in enumerate(self.train_lengths)]

    def train_item_counts(self) -> np.ndarray:
        """`[num_items + 1]` exact counts over the training interactions only."""
        counts = np.zeros(self.num_items + 1, np.int64)
        for seq, n in zip(self.sequences, self.train_lengths):
            np.add.at(counts, seq[:n], 1)
        return counts

    def train_log_q(self) -> np.ndarray:
        """`[num_items + 1]` ``log Q(d) = log(#d / N)`` from training counts (-inf if unseen)."""
        counts = self.train_item_counts().astype(np.float64)
        with np.errstate(divide="ignore"):
            return np.log(counts) - np.log(max(counts.sum(), 1.0))

    def stats(self) -> dict:
        inter = self.interactions
        return {
            "num_users": inter.num_users,
            "num_items": inter.num_items,
            "num_interactions": len(inter),
            "time_range": inter.time_range(),
            "train": {"num_interactions": int(self.train_lengths.sum()),
                      "num_users": int((self.train_lengths > 0).sum())},
            "validation": {"num_targets": len(self.validation),
                           "num_users": int(len(np.unique(self.validation.users)))},
            "test": {"num_targets": len(self.test),
                     "num_users": int(len(np.unique(self.test.users)))},
        }


def _part(users, lengths, sequences) -> EvalPart:
    users = np.asarray(users, np.int64)
    lengths = np.asarray(lengths, np.int64)
    targets = np.array([sequences[u][n] for u, n in zip(users, lengths)], np.int64)
    return EvalPart(users, lengths, targets)


def leave_one_out(interactions: Interactions) -> Split:
    """Last interaction of each user is the test target, the second-to-last the
    validation target; training uses everything before them. Users with fewer
    than 3 interactions only train (as in SASRec's split)."""
    sequences = interactions.sequences()
    lengths = np.array([len(s) for s in sequences], np.int64)
    eligible = np.flatnonzero(lengths >= 3)
    train = np.where(lengths >= 3, lengths - 2, lengths)
    return Split("loo", interactions, sequences, train,
                 _part(eligible, lengths[eligible] - 2, sequences),
                 _part(eligible, lengths[eligible] - 1, sequences))


def gsasrec_split(interactions: Interactions, num_validation_users: int = 512,
                  seed: int = 42) -> Split:
    """gSASRec's public split: validation on a fixed sample of users.

    ``numpy.random.RandomState(seed).choice(num_users, num_validation_users,
    replace=False)`` draws ids ``0..U-1`` that are compared against user ids
    ``1..U`` (as gSASRec's script does); those users train on ``seq[:-3]`` and
    validate on ``seq[-2]``, the others train on ``seq[:-2]``; every user is
    tested on ``seq[-1]`` from ``seq[:-1]``. On SASRec's ``ml-1m.txt`` this
    reproduces gSASRec's ``train/``, ``val/`` and ``test/`` files exactly.
    """
    sequences = interactions.sequences()
    lengths = np.array([len(s) for s in sequences], np.int64)
    drawn = np.random.RandomState(seed).choice(interactions.num_users, num_validation_users,
                                               replace=False)
    user_ids = np.arange(1, interactions.num_users + 1)  # the file's 1-based ids
    is_val = np.isin(user_ids, drawn) & (lengths >= 3)
    train = np.where(is_val, lengths - 3, lengths - 2).clip(min=0)
    val_users = np.flatnonzero(is_val)
    test_users = np.flatnonzero(lengths >= 2)
    return Split("gsasrec", interactions, sequences, train,
                 _part(val_users, lengths[val_users] - 2, sequences),
                 _part(test_users, lengths[test_users] - 1, sequences))


def temporal_split(interactions: Interactions, fraction: float = 0.1) -> Split:
    """Global temporal split: all interactions ordered by time across the dataset
    (ties: by user index, then the user's own order); the last ``fraction`` are
    test targets and the ``fraction`` before them validation targets. Each target
    is predicted from all of its user's interactions before it; training uses
    only interactions before the validation period.

    Raises:
      ValueError: if the interactions have no timestamps.
    """
    if interactions.timestamp is None:
        raise ValueError(
            f"a temporal split needs timestamps, and {interactions.name or 'this data'} has "
            "none (SASRec's ml-1m.txt keeps only the order). Use the official ratings.dat "
            "(fmt='ratings') or a leave-one-out split.")
    if not 0 < fraction < 0.5:
        raise ValueError(f"`fraction` must be in (0, 0.5), received {fraction!r}.")
    n = len(interactions)
    offsets = interactions.user_offsets()
    within = np.arange(n) - offsets[interactions.user]  # position in the user's sequence
    order = np.lexsort((within, interactions.user, interactions.timestamp))
    n_test = int(round(n * fraction))
    n_val = int(round(n * fraction))
    val_idx = order[n - n_test - n_val:n - n_test]
    test_idx = order[n - n_test:]
    train_idx = order[:n - n_test - n_val]
    train = np.bincount(interactions.user[train_idx], minlength=interactions.num_users)
    sequences = interactions.sequences()

    def part(idx):
        idx = np.sort(idx)
        return EvalPart(interactions.user[idx].astype(np.int64), within[idx].astype(np.int64),
                        interactions.item[idx].astype(np.int64))

    # Training per user is a prefix: every training interaction precedes, in the
    # user's own order, all of that user's validation and test interactions.
    return Split("temporal", interactions, sequences, train.astype(np.int64),
                 part(val_idx), part(test_idx))


MIN_TEST_USERS = 2
MIN_RANKED_ITEMS = 11  # Recall@10 of a catalog of 10 or fewer items is 1.0 for any model


def target_facts(split: Split, part: EvalPart, sent_length: int) -> dict:
    """What the evaluation of ``part`` can mean, for the report: ``num_targets``,
    ``num_users``, ``repeat_share`` (targets the user had interacted with before),
    ``sent_repeat_share`` (those among the last ``sent_length`` items, the history a
    request sends: the served ``top_k`` leaves them out, so they are misses under the
    exclude-seen policy) and ``cold_share`` (targets with no training interaction)."""
    n = len(part)
    counts = split.train_item_counts()
    repeat = sent = 0
    for u, length, target in zip(part.users, part.history_lengths, part.targets):
        history = split.sequences[u][:length]
        repeat += bool(np.any(history == target))
        sent += bool(np.any(history[-sent_length:] == target)) if sent_length else False
    return {"num_targets": n, "num_users": int(len(np.unique(part.users))),
            "repeat_share": repeat / n if n else float("nan"),
            "sent_repeat_share": sent / n if n else float("nan"),
            "cold_share": float(np.mean(counts[part.targets] == 0)) if n else float("nan")}


def check_evaluable(split: Split, part: EvalPart, name: str = "test") -> None:
    """Refuses, in one line, a split whose metrics could not mean anything: fewer than
    `MIN_TEST_USERS` users, a catalog too small for Recall@10, or every target cold (an
    item never seen in training: no trained model can rank it)."""
    users = int(len(np.unique(part.users)))
    if users < MIN_TEST_USERS:
        raise ValueError(f"the {name} split has {users} user(s) ({len(part)} targets): a "
                         f"metric over fewer than {MIN_TEST_USERS} users measures one "
                         f"person, not the model; use a log with more users.")
    if split.num_items < MIN_RANKED_ITEMS:
        raise ValueError(f"the catalog has {split.num_items} items after filtering: "
                         f"Recall@10 is 1.0 for any model below {MIN_RANKED_ITEMS}; use a larger "
                         f"log (or a lower --min-item-interactions, in the commands that "
                         f"take it).")
    counts = split.train_item_counts()
    if len(part) and not np.any(counts[part.targets] > 0):
        raise ValueError(f"every {name} target is an item never seen in training (cold): "
                         f"no trained model can rank it; use a split whose {name} items "
                         f"occur in training (e.g. --split loo) or more history.")


def duplicate_counts(interactions: Interactions) -> dict:
    """``rows``: rows repeating an earlier row exactly (user, item and time: a log
    written twice?); ``pairs``: rows repeating an earlier (user, item) pair at any time
    (repeat clicks or purchases; ``--deduplicate`` keeps only the first)."""
    user = np.asarray(interactions.user, np.int64)
    item = np.asarray(interactions.item, np.int64)
    pair = user * (int(item.max(initial=0)) + 1) + item
    pairs = int(len(pair) - len(np.unique(pair)))
    rows = pairs
    if interactions.timestamp is not None and len(pair):
        distinct = np.unique(np.stack([pair, interactions.timestamp]), axis=1).shape[1]
        rows = int(len(pair) - distinct)
    return {"rows": rows, "pairs": pairs}


def data_stats(split: Split, dataset: str) -> dict:
    """The JSON object ``tfrs-logq data stats --json`` prints, for any source: the
    dataset's name, the split's, where the data came from
    (`Interactions.provenance`), the counts (`Split.stats`), ``time_unit`` (that of
    ``time_range``, `Interactions.time_unit`), and a weight column's summary.

    Args:
      split: `Split`. The split, of a built-in dataset or of a user's log.
      dataset: str. The name reported (``ml-1m``, ``steam``, a log's name).
    """
    out = {"dataset": dataset, "split": split.name, **split.interactions.provenance(),
           **split.stats(), "duplicates": duplicate_counts(split.interactions)}
    facts = target_facts(split, split.test, sent_length=0)
    out["test"].update({k: facts[k] for k in ("repeat_share", "cold_share")})
    out["time_unit"] = split.interactions.time_unit
    weight = split.interactions.weight
    if weight is not None and len(weight):
        out["weights"] = {"min": float(weight.min()), "mean": finite_mean(weight),
                          "max": float(weight.max()), "zeros": int(np.sum(weight == 0))}
    return out


def finite_mean(values: np.ndarray) -> float:
    """The mean of finite float64 ``values`` without overflow: of the values scaled by
    the largest magnitude, scaled back (``[1e308, 1e308]`` has mean 1e308, where
    ``np.mean`` sums to inf)."""
    values = np.asarray(values, np.float64)
    scale = float(np.max(np.abs(values))) if len(values) else 0.0
    if scale == 0.0 or not np.isfinite(scale):
        return float(np.mean(values)) if len(values) else float("nan")
    return float(np.mean(values / scale) * scale)


def make_split(interactions: Interactions, name: str, **kwargs) -> Split:
    if name == "loo":
        return leave_one_out(interactions)
    if name == "gsasrec":
        return gsasrec_split(interactions, **kwargs)
    if name == "temporal":
        return temporal_split(interactions, **kwargs)
    raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}.")
