"""How much of the exact top-k an approximate index keeps, and the search it takes.

An approximate index answers queries faster than brute force by scoring only part of the
catalog: a ScaNN tree searches the ``L`` leaves (partitions) nearest each query, scores
their items with hashed (quantised) embeddings, and reorders the best ``f x k`` of them
with exact dot products. What it keeps is measured here against exact search on a
sample of queries:

    recall@k = mean over queries q of |found_k(q) ∩ exact_k(q)| / k,

``exact_k(q)`` being the ``k`` items of largest dot product with ``q`` (`exact_top_k`,
numpy). `tune_search` then finds, for each ``k`` asked for, the reorder factor ``f``
that reaches a target with every leaf searched (doubling it), and the fewest leaves
``L`` that keep the target at that ``f`` (doubling ``L``, then bisecting). The index is
reached only through a ``search(queries, k, leaves, f) -> ids`` function, so this module
knows nothing of ScaNN (`tfrs_logq.serving.export.tune_scann` wires it to the exported
module's search).

Example (a fake index that finds the exact top-k once it searches 3 leaves or more):

>>> import numpy as np
>>> items = np.eye(4, dtype=np.float32)
>>> queries = np.array([[1.0, 0.5, 0.2, 0.0]], np.float32)
>>> exact_top_k(queries, items, 2).tolist()
[[0, 1]]
>>> recall_at_k(np.array([[0, 3]]), np.array([[0, 1]]))
0.5
>>> search = lambda q, k, leaves, f: np.array([[0, 1]] if leaves >= 3 else [[0, 3]])
>>> result = tune_search(search, queries, {2: exact_top_k(queries, items, 2)},
...                      num_leaves=8, target_recall=0.9)
>>> result["by_k"], result["reached"]
({2: {'leaves': 3, 'reorder_factor': 10, 'recall': 1.0}}, True)
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Optional

import numpy as np

Search = Callable[[np.ndarray, int, Optional[int], int], np.ndarray]


def exact_top_k(queries: np.ndarray, items: np.ndarray, k: int,
                batch_size: int = 64) -> np.ndarray:
    """The rows of ``items`` with the ``k`` largest dot products with each query, `[m, k]`,
    best first (brute force in numpy, ``batch_size`` queries at a time so that a 1M-item
    catalog needs ``batch_size x n`` floats, not ``m x n``).

    Args:
        queries: `[m, d]` float.
        items: `[n, d]` float.
        k: int in ``[1, n]``.
        batch_size: int. Queries scored at once. Defaults to 64.
    """
    queries, items = np.asarray(queries, np.float32), np.asarray(items, np.float32)
    if not 1 <= k <= len(items):
        raise ValueError(f"`k` must be in [1, {len(items)}] (the catalog), received {k}.")
    out = np.empty((len(queries), k), np.int64)
    for start in range(0, len(queries), batch_size):
        scores = queries[start:start + batch_size] @ items.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
        out[start:start + batch_size] = np.take_along_axis(top, order, 1)
    return out


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over rows of ``|found ∩ exact| / k``; ``exact`` is `[m, k]`, ``found`` `[m, >=k]`
    (its first ``k`` columns count; ids repeated in a row count once)."""
    found, exact = np.asarray(found), np.asarray(exact)
    k = exact.shape[1]
    if found.shape[0] != exact.shape[0] or found.shape[1] < k:
        raise ValueError(f"`found` must be [{exact.shape[0]}, >= {k}], received "
                         f"{list(found.shape)}.")
    return float(np.mean([len(set(a[:k].tolist()) & set(b.tolist())) / k
                          for a, b in zip(found, exact)]))


def tune_search(search: Search, queries: np.ndarray, exact: Mapping[int, np.ndarray],
                num_leaves: Optional[int], target_recall: float, reorder_factor: int = 10,
                max_reorder_factor: int = 80, start: int = 0, tolerance: float = 0.05) -> dict:
    """The cheapest search settings whose recall@k reaches ``target_recall``, for each k.

    For each ``k`` of ``exact`` (ascending): first the reordering, then the leaves.
    With every leaf searched, the reorder factor (a search for ``k`` items scores
    ``factor x k`` hashed candidates exactly) doubles from ``reorder_factor`` while
    recall@k misses the target, up to ``max_reorder_factor``: past it, the target is
    out of reach. Then ``L``, the leaves searched, starts at ``start`` (default
    ``ceil(num_leaves / 100)``) and doubles until recall@k reaches the target, and the
    interval is bisected until it is within ``tolerance`` of ``L`` (or one leaf). Recall
    is assumed to grow with ``L`` and the factor; only measured settings are returned.
    ``num_leaves=None`` (no tree: every item is scored) tunes the reordering only.

    Args:
        search: ``search(queries, k, leaves, reorder_factor) -> ids`` `[m, >= k]`.
        queries: `[m, d]` the tuning queries.
        exact: ``{k: exact_top_k(queries, items, k)}``.
        num_leaves: int or None. The tree's leaves (the most that can be searched).
        target_recall: float in ``(0, 1]``.
        reorder_factor: int. The first reorder factor tried. Defaults to 10.
        max_reorder_factor: int. The largest. Defaults to 80.
        start: int. The first ``L`` tried. Defaults to ``ceil(num_leaves / 100)``.
        tolerance: float. The bisection's relative resolution. Defaults to 0.05.

    Returns:
        ``{"by_k": {k: {"leaves": L (None without a tree), "reorder_factor": f,
        "recall": recall@k}}, "reached": bool (every k reached the target), "curve":
        {k: [[L, f, recall], ...] in the order measured]}``. A k that misses the target
        even with every leaf and ``max_reorder_factor`` gets those.
    """
    if not 0.0 < target_recall <= 1.0:
        raise ValueError(f"`target_recall` must be in (0, 1], received {target_recall}.")
    if num_leaves is not None and num_leaves < 1:
        raise ValueError(f"`num_leaves` must be positive, received {num_leaves}.")
    result: dict = {"by_k": {}, "reached": True, "curve": {}}
    for k in sorted(exact):
        curve: dict[tuple, float] = {}

        def measure(leaves: Optional[int], factor: int) -> float:
            if (leaves, factor) not in curve:
                found = search(queries, k, leaves, factor)
                curve[(leaves, factor)] = recall_at_k(found, exact[k])
            return curve[(leaves, factor)]

        factor = reorder_factor
        while measure(num_leaves, factor) < target_recall and factor < max_reorder_factor:
            factor = min(max_reorder_factor, 2 * factor)
        reached = measure(num_leaves, factor) >= target_recall
        leaves = num_leaves
        if num_leaves is not None and reached:
            low, high = 0, min(num_leaves, max(1, start or math.ceil(num_leaves / 100)))
            while measure(high, factor) < target_recall:  # ends at num_leaves at the latest
                low, high = high, min(num_leaves, 2 * high)
            while high - low > max(1, tolerance * high):
                middle = (low + high) // 2
                if measure(middle, factor) >= target_recall:
                    high = middle
                else:
                    low = middle
            leaves = high
        result["reached"] = result["reached"] and reached
        result["by_k"][k] = {"leaves": leaves, "reorder_factor": factor,
                             "recall": curve[(leaves, factor)]}
        result["curve"][k] = [[L, f, round(r, 4)] for (L, f), r in curve.items()]
    return result


def split_tuning_queries(items, queries, target_recall: float):
    """``(items, tuning, held_out)`` as float32: the queries' first half tunes the index,
    the second measures it; a target outside (0, 1] or fewer than 2 queries is refused."""
    if not 0.0 < target_recall <= 1.0:
        raise ValueError(f"`target_recall` must be in (0, 1], received {target_recall}.")
    items = np.asarray(items, np.float32)
    queries = np.asarray(queries, np.float32)
    if len(queries) < 2:
        raise ValueError(f"tuning needs at least 2 queries, received {len(queries)}.")
    half = len(queries) // 2
    return items, queries[:half], queries[half:]


__all__ = ["exact_top_k", "recall_at_k", "split_tuning_queries", "tune_search"]
