"""How much of the exact top-k the index ``tfrs-logq export --index auto`` builds keeps, on
given embeddings: what ``tfrs-logq compare`` records beside its exact Recall@k.

``compare`` ranks every candidate exactly, as a brute-force export serves; ``export
--index auto`` serves ScaNN where its ops load, else a faiss IVF-Flat index where faiss
imports, else brute force (`tfrs_logq.serving.export.resolve_index`), the approximate
indexes tuned to keep ``DEFAULT_TARGET_RECALL`` of the exact top-k at the export's k
(``--k``, 100) and ``--max-k`` (1000). `served_recall` builds that index over a trained
model's candidate embeddings with the export's own functions (`export.scann_parameters`,
`export.build_scann_searcher`, `export.tune_scann`, `export.search_scann`;
`faiss_index.faiss_parameters`, `faiss_index.FaissIndex`), tunes it as the export does on
a seeded sample of the queries (the export tunes on validation users' queries; here the
given queries stand in), and measures, on the other queries, for each k asked,

    recall@k = mean over queries q of |found_k(q) ∩ exact_k(q)| / k,

``found_k`` the index's top k as served (a search whose lists or leaves hold too few
items searched again over all of them), ``exact_k`` numpy brute force
(`scann_tuning.exact_top_k`, `scann_tuning.recall_at_k`). It is the raw top-k overlap:
the history a request sends is not left out of either list, so it says how far the
served ranking can move from the exact one, not the served Recall@k itself.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import numpy as np

from tfrs_logq.serving.export import (
    DEFAULT_MAX_K,
    DEFAULT_SEARCH_FRACTION,
    DEFAULT_TARGET_RECALL,
    DEFAULT_TUNING_QUERIES,
    build_scann_searcher,
    export_version,
    resolve_index,
    scann_parameters,
    search_scann,
    tune_scann,
)
from tfrs_logq.serving.indexes import index_record
from tfrs_logq.serving.scann_tuning import exact_top_k, recall_at_k

DEFAULT_K = inspect.signature(export_version).parameters["default_k"].default
"""The export's k (``tfrs-logq export --k``'s default): the index is tuned for it and
``DEFAULT_MAX_K``."""


def split_queries(queries: np.ndarray, tuning_queries: int = DEFAULT_TUNING_QUERIES,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(tuning, measured)``: a seeded sample of at most ``tuning_queries`` queries, and at
    most half of them, that tunes the index; the others, that measure it (each in the
    queries' order)."""
    if len(queries) < 4:
        raise ValueError(f"`query_embeddings` must hold at least 4 queries (half tune the "
                         f"index, half measure it), received {len(queries)}.")
    order = np.random.default_rng(seed).permutation(len(queries))
    count = max(2, min(int(tuning_queries), len(queries) // 2))
    return queries[np.sort(order[:count])], queries[np.sort(order[count:])]


def served_recall(item_embeddings, query_embeddings, ks: Sequence[int], *,
                  index: str = "auto", default_k: int = DEFAULT_K,
                  max_k: int = DEFAULT_MAX_K,
                  target_recall: float = DEFAULT_TARGET_RECALL,
                  tuning_queries: int = DEFAULT_TUNING_QUERIES, seed: int = 0) -> dict:
    """The index ``export --index index`` builds over ``item_embeddings``, and its recall@k
    against exact top-k on ``query_embeddings`` (the raw top-k overlap, no history left
    out), for each k of ``ks`` at most the catalog.

    Args:
      item_embeddings: `[num_items, dim]` the candidates' embeddings (no padding row).
      query_embeddings: `[num_queries, dim]`, at least 4: a seeded sample of at most
        ``tuning_queries`` of them, and at most half, tunes the index; the rest measure it.
      ks: the cut-offs measured.
      index: str. ``export --index`` (`tfrs_logq.serving.indexes.INDEXES`). Defaults to
        ``"auto"``.
      default_k: int. The export's ``--k``. Defaults to 100.
      max_k: int. The export's ``--max-k``. Defaults to 1000.
      target_recall: float. The export's ``--target-recall``. Defaults to 0.95.
      tuning_queries: int. The most queries that tune. Defaults to 1000.
      seed: int. The sample's seed. Defaults to 0.

    Returns:
      `tfrs_logq.serving.indexes.index_record`'s record of the index (``kind``,
      ``parameters``, ``target_recall``, ``description``), its ``recall`` the measured
      recall@k by k (text keys; 1.0 for brute force, exact), with ``index`` (the
      ``--index`` given, ``kind`` what it resolved to), ``reached`` (the tuning
      kept ``target_recall``: else ``export`` refuses a faiss index and warns of a ScaNN
      one), ``settings`` (what a search for k items uses, by k: faiss ``nprobe``, ScaNN
      ``leaves`` and ``reorder_factor``), ``num_items``, ``num_queries`` (``tuning``,
      ``measured``) and ``history_excluded`` (False).
    """
    items = np.ascontiguousarray(item_embeddings, np.float32)
    queries = np.ascontiguousarray(query_embeddings, np.float32)
    if items.ndim != 2 or queries.ndim != 2 or items.shape[1] != queries.shape[1]:
        raise ValueError(f"`item_embeddings` and `query_embeddings` must be [n, d] and "
                         f"[m, d], received shapes {list(items.shape)} and "
                         f"{list(queries.shape)}.")
    measured_ks = sorted({int(k) for k in ks if 1 <= int(k) <= len(items)})
    if not measured_ks:
        raise ValueError(f"`ks` must hold a k in [1, {len(items)}] (the catalog), received "
                         f"{list(ks)}.")
    kind = resolve_index(index)
    tuning, measured = split_queries(queries, tuning_queries, seed)
    settings: dict = {}
    if kind == "brute-force":  # exact by construction: nothing to tune or measure
        meta: dict = {"index": kind}
        recall = {k: 1.0 for k in measured_ks}
        reached = True
        tuning, measured = queries[:0], queries[:0]
    else:
        if kind == "faiss":
            from tfrs_logq.serving.faiss_index import FaissIndex, faiss_parameters

            params = faiss_parameters(len(items), min(default_k, len(items)), max_k=max_k)
            faiss = FaissIndex.build(items, params)
            report = faiss.tune(items, tuning, target_recall,
                                queries_source=f"{len(tuning):,} of the given queries")
            params = faiss.params

            def search(k: int) -> np.ndarray:
                settings[str(k)] = {"nprobe": faiss.nprobe_for(k)}
                return faiss.search(measured, k)[0]
        else:  # scann
            params = scann_parameters(len(items), min(default_k, len(items)),
                                      DEFAULT_SEARCH_FRACTION, max_k=max_k)
            searcher = build_scann_searcher(items, params)
            params, report = tune_scann(searcher, items, tuning, params, target_recall,
                                        queries_source=f"{len(tuning):,} of the given "
                                                       f"queries")

            def search(k: int) -> np.ndarray:
                row = next((r for r in params["tuned"] if r[0] >= k), params["tuned"][-1])
                settings[str(k)] = {"leaves": row[1], "reorder_factor": row[2]}
                return search_scann(searcher, measured, k, params)[0].numpy()

        recall = {k: recall_at_k(search(k), exact_top_k(measured, items, k))
                  for k in measured_ks}
        reached = bool(report.get("reached", True))
        meta = {"index": kind, kind: params, f"{kind}_tuning": {
            **report, "recall": {str(k): round(r, 4) for k, r in recall.items()},
            "num_queries": {"tuning": len(tuning), "held_out": len(measured)}}}
    record = index_record(meta)
    record.update(index=index, recall={str(k): round(float(r), 4) for k, r in recall.items()},
                  target_recall=target_recall, reached=reached, settings=settings,
                  num_items=len(items),
                  num_queries={"tuning": len(tuning), "measured": len(measured)},
                  history_excluded=False)
    record.pop("held_out_queries", None)
    return record


__all__ = ["DEFAULT_K", "served_recall", "split_queries"]
