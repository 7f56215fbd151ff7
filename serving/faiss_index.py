"""A faiss inverted-file index (IVF-Flat, inner product): the approximate index where
ScaNN cannot load (TensorFlow 2.21), served by ``tfrs-logq serve`` only.

The catalog's item embeddings are partitioned by k-means into ``nlist`` lists (about
``sqrt(n)``, as the ScaNN tree's leaves); a query scores the items of the ``nprobe``
lists whose centroids have the largest inner product with it, exactly (the lists hold
the embeddings themselves: no quantisation, so ``nprobe = nlist`` is an exact search).
``nprobe`` is the one setting, and it is tuned like the ScaNN tree's leaves searched
(`tfrs_logq.serving.scann_tuning.tune_search`): the fewest lists whose recall@k, against
numpy brute force on held-apart queries, reaches the target, for each k tuned. A search
for ``n`` items uses the ``nprobe`` tuned for the smallest tuned k at least ``n`` (the
largest k's beyond it); a row whose lists hold fewer than ``n`` items is searched again
over every list, as the exported ScaNN module does.

Why faiss, and IVF: faiss is the most used and longest maintained library of its kind
(Meta, MIT, wheels for every platform), and an IVF-Flat index has an exact setting, so
tests build it as an exact search and compare with brute force, and its one knob is the
tree's, so one tuner serves both indexes.

The export writes the index as ``assets/index.faiss`` beside a SavedModel whose own
signatures search by brute force (stock TensorFlow ops): stock TF Serving serves the
same version exactly, and ``tfrs-logq serve`` answers ``serving_default`` and ``top_k``
through the index (`FaissIndex.load` checks the file against ``assets/export.json``).
"""

from __future__ import annotations

import math
import os
import time
from typing import Optional

import numpy as np

from tfrs_logq._util.fingerprint import file_fingerprint

FILE_NAME = "index.faiss"  # under the version's assets/
KIND = "IVF-Flat"
METRIC = "inner_product"
EXTRA = 'pip install -e ".[serving]"'  # the extra that installs faiss-cpu


def faiss_or_error():
    """The ``faiss`` module, or an ImportError whose one line names the extra to install."""
    try:
        import faiss
    except Exception as exc:  # ImportError, or a wheel that does not load here
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ImportError(
            f"--index faiss needs faiss-cpu, which does not import here ({reason}): install "
            f"the serving extra, {EXTRA} (or pip install 'tfrs-logq[serving]'; it pins "
            "faiss-cpu>=1.15,<1.16), or export with --index brute-force") from exc
    return faiss


def faiss_parameters(num_items: int, k: int, max_k: Optional[int] = None,
                     nlist: Optional[int] = None, max_search_fraction: float = 1.0) -> dict:
    """Settings by catalog size, before tuning: ``nlist`` (default ``round(sqrt(n))``, at
    least 1) lists, ``nprobe`` (before tuning: every list, an exact search), and the ks
    to tune for (``k``, ``max_k``, each at most the catalog). ``max_search_fraction``
    bounds the lists tuning may search (default 1: every list)."""
    if not 0.0 < max_search_fraction <= 1.0:
        raise ValueError(f"`max_search_fraction` must be in (0, 1], received "
                         f"{max_search_fraction}.")
    nlist = int(nlist or max(1, round(math.sqrt(num_items))))
    if not 1 <= nlist <= num_items:
        raise ValueError(f"`nlist` must be in [1, {num_items}] (the catalog), received {nlist}.")
    return {"type": KIND, "metric": METRIC, "nlist": nlist, "nprobe": nlist,
            "max_nprobe": max(1, math.floor(nlist * max_search_fraction + 1e-9)),
            "k": min(k, num_items), "max_k": min(max(k, max_k or k), num_items),
            "training_sample_size": min(num_items, 256 * nlist)}


class FaissIndex:
    """An IVF-Flat inner-product index over ``[n, d]`` item embeddings; ids are rows.

    Args:
        index: the faiss ``IndexIVFFlat``.
        params: `faiss_parameters` (with ``tuned``: ``[[k, nprobe], ...]`` by ascending k,
            once `tune` ran).
    """

    def __init__(self, index, params: dict) -> None:
        self.index, self.params = index, dict(params)
        self.report: Optional[dict] = None  # what `tune` measured

    @classmethod
    def build(cls, items: np.ndarray, params: dict, seed: int = 0) -> "FaissIndex":
        """Trains the lists' centroids on a seeded sample of ``items`` and adds them all."""
        faiss = faiss_or_error()
        items = np.ascontiguousarray(items, np.float32)
        n, d = items.shape
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, params["nlist"], faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        index.cp.min_points_per_centroid = 1  # small catalogs: no warning, same lists
        rng = np.random.default_rng(seed)
        sample = items if params["training_sample_size"] >= n else \
            items[np.sort(rng.choice(n, params["training_sample_size"], replace=False))]
        index.train(sample)
        index.add(items)
        return cls(index, params)

    @property
    def num_items(self) -> int:
        return int(self.index.ntotal)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def nprobe_for(self, n: int) -> int:
        """The lists searched for ``n`` results: the tuned ``nprobe`` of the smallest tuned
        k at least ``n`` (the largest k's beyond it), else ``params["nprobe"]``."""
        tuned = self.params.get("tuned")
        if not tuned:
            return int(self.params["nprobe"])
        return int(next((p for k, p in tuned if k >= n), tuned[-1][1]))

    def search(self, queries: np.ndarray, n: int, nprobe: Optional[int] = None,
               every_list_when_short: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The top ``n`` rows of each query: ``(ids int64 [m, n], scores float32 [m, n])``.

        ``nprobe`` lists are searched (default `nprobe_for`). Where they hold fewer than
        ``n`` items faiss fills a row with id -1; then the batch is searched again over
        every list (the whole catalog, ``n`` being at most its size), unless
        ``every_list_when_short`` is False (tuning: what the lists searched find).
        Thread-safe: the lists searched go with the call, not into the index.
        """
        faiss = faiss_or_error()
        queries = np.ascontiguousarray(queries, np.float32)
        nprobe = self.nprobe_for(n) if nprobe is None else int(nprobe)
        scores, ids = self.index.search(queries, n, params=faiss.SearchParametersIVF(
            nprobe=nprobe))
        if every_list_when_short and nprobe < self.params["nlist"] and (ids < 0).any():
            scores, ids = self.index.search(queries, n, params=faiss.SearchParametersIVF(
                nprobe=self.params["nlist"]))
        return ids.astype(np.int64), scores.astype(np.float32)

    def tune(self, items: np.ndarray, queries: np.ndarray, target_recall: float,
             queries_source: str = "given", tune: bool = True) -> dict:
        """Measures what the index keeps of the exact top-k and (``tune``) sets the fewest
        lists keeping ``target_recall``, for k = ``params["k"]`` and ``params["max_k"]``;
        returns the report.

        The queries are split in two halves: the first tunes (`scann_tuning.tune_search`,
        ``nprobe`` doubling from 1/100 of the lists up to ``max_nprobe``, then bisected
        to 5 %), the second measures recall@k at the chosen settings against numpy brute
        force (`scann_tuning.exact_top_k`). A row the lists searched fill with -1 counts
        it as missed, so the figure is a lower bound of what is served. Report:
        ``{"target_recall", "queries", "num_queries", "recall": {k: held-out recall@k},
        "tuning_recall", "reached" (every k reached the target on the tuning half within
        ``max_nprobe``), "tuned", "curve", "seconds"}``.
        """
        from tfrs_logq.serving.scann_tuning import (
            exact_top_k,
            recall_at_k,
            split_tuning_queries,
            tune_search,
        )

        start = time.perf_counter()
        items, tuning, held_out = split_tuning_queries(items, queries, target_recall)
        ks = sorted({self.params["k"], self.params["max_k"]})

        def search(q, k, nprobe=None, factor=None):
            return self.search(q, k, nprobe, every_list_when_short=False)[0]

        report: dict = {"target_recall": target_recall, "queries": queries_source,
                        "num_queries": {"tuning": len(tuning), "held_out": len(held_out)}}
        if tune:
            exact = {k: exact_top_k(tuning, items, k) for k in ks}
            result = tune_search(search, tuning, exact, self.params["max_nprobe"],
                                 target_recall, reorder_factor=1, max_reorder_factor=1)
            by_k = result["by_k"]
            self.params["tuned"] = [[k, by_k[k]["leaves"]] for k in ks]
            self.params["nprobe"] = by_k[ks[-1]]["leaves"]
            report["tuning_recall"] = {str(k): round(by_k[k]["recall"], 4) for k in ks}
            report["curve"] = {str(k): [[p, r] for p, _, r in c]
                               for k, c in result["curve"].items()}
            report["reached"] = bool(result["reached"])
        recall = {k: recall_at_k(search(held_out, k), exact_top_k(held_out, items, k))
                  for k in ks}
        report["recall"] = {str(k): round(r, 4) for k, r in recall.items()}
        report["tuned"] = self.params.get("tuned") or [[k, self.params["nprobe"]] for k in ks]
        if not tune:
            report["reached"] = all(r >= target_recall for r in recall.values())
        report["seconds"] = round(time.perf_counter() - start, 1)
        self.report = report
        return report

    def unreached_line(self, report: dict) -> Optional[str]:
        """One line saying which k cannot keep the target at any setting tried, or None."""
        if report.get("reached", True):
            return None
        got = report.get("tuning_recall") or report["recall"]
        short = {k: r for k, r in got.items() if r < report["target_recall"]}
        k, r = min(short.items(), key=lambda kv: kv[1])
        searched = self.params["max_nprobe"]
        return (f"the faiss index cannot keep --target-recall {report['target_recall']:g} of "
                f"the exact top-{k}: at most {r:.3f} with {searched} of {self.params['nlist']}"
                f" lists searched ({report['num_queries']['tuning']} tuning queries); nothing "
                "was exported: lower --target-recall, or export with --index brute-force")

    # -- files -------------------------------------------------------------------

    def save(self, assets_dir: str) -> dict:
        """Writes ``assets_dir/index.faiss``; returns what `load` checks it by."""
        faiss = faiss_or_error()
        path = os.path.join(assets_dir, FILE_NAME)
        faiss.write_index(self.index, path)
        return {"file": FILE_NAME, "sha256": file_fingerprint(path),
                "num_items": self.num_items,
                "dim": self.dim, "faiss_version": faiss.__version__}

    @classmethod
    def load(cls, version_dir: str, meta: dict) -> "FaissIndex":
        """The index of an export (``meta``: its ``assets/export.json``), checked: the
        file's sha256, its item count and dimension must be the export's, else
        ValueError (the version is then not served)."""
        faiss = faiss_or_error()
        params = meta.get("faiss") or {}
        stored = params.get("stored") or {}
        path = os.path.join(version_dir, "assets", stored.get("file", FILE_NAME))
        if not os.path.exists(path):
            raise FileNotFoundError(f"the faiss export has no {path}")
        digest = file_fingerprint(path)
        if stored.get("sha256") and digest != stored["sha256"]:
            raise ValueError(f"{path} is not the index this version was exported with "
                             f"(sha256 {digest[:12]}..., export.json says "
                             f"{stored['sha256'][:12]}...): export the version again")
        index = cls(faiss.read_index(path), params)
        if index.num_items != meta.get("num_items"):
            raise ValueError(f"{path} holds {index.num_items} items, the export "
                             f"{meta.get('num_items')}: export the version again")
        if stored.get("dim") is not None and index.dim != stored["dim"]:
            raise ValueError(f"{path} has dimension {index.dim}, the export {stored['dim']}")
        return index


__all__ = ["EXTRA", "FILE_NAME", "FaissIndex", "faiss_or_error", "faiss_parameters"]
