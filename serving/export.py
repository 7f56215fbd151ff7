"""`tfrs-logq export`: a trained model as a TF Serving SavedModel with a retrieval index.

Layout: ``BASE/VERSION/`` (an integer version per SavedModel), ``BASE`` being
TF Serving's ``--model_base_path`` (`export_version`; `export` writes
``PARENT/NAME/VERSION``, one directory per servable). A
version is written under a hidden temporary name in the same directory and
renamed into place, so a server polling the directory never sees half of one.

Signatures (history in the dataset's own item ids, ``[batch, length]`` with
``length <= max_length``; padding is 0 for integer ids and ``""`` for string ids,
anywhere in the row; unknown ids are ignored like padding; string ids are trimmed of
the white space around them first, as the training log's were,
`tfrs_logq.pipelines.ids.normalize_id`):

- ``serving_default``: ``history`` -> ``item_ids``, ``scores`` `[batch, default_k]`,
  the history's own items left out;
- ``top_k``: ``history``, ``k`` (int32 scalar), ``exclude_history`` (bool scalar;
  ``tfrs-logq serve`` fills in True when a request leaves it out) -> ``item_ids``,
  ``scores`` `[batch, k]`;
- ``query_embedding``: ``history`` -> ``query_embedding`` `[batch, dim]`.

Index: ``scann`` (ScaNN ops; loads where ``import scann`` registered them, e.g. the
``google/tf-serving-scann`` image), ``faiss`` (`tfrs_logq.serving.faiss_index`: an
IVF-Flat index in ``assets/index.faiss`` beside a brute-force SavedModel; ``tfrs-logq
serve`` searches the index, a stock ``tensorflow_model_server`` the SavedModel, exactly)
or ``brute-force`` (stock TensorFlow ops only: runs in a stock ``tensorflow_model_server``).
``assets/export.json`` records the index, its parameters and the recall measured against
exact search, the vocabulary size, the padding value and the model config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq._util.atomic import publish_directory, remove_stale_staging, staging_directory
from tfrs_logq.pipelines.ids import normalize_id, normalize_id_tensor
from tfrs_logq.sasrec import trained as sasrec_trained
from tfrs_logq.serving.indexes import INDEXES, describe_index
from tfrs_logq.towers import run as tower_run

# A servable name is one path component: no separators, no "..", nothing hidden.
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TMP_PREFIX = ".tmp-"
logger = logging.getLogger(__name__)


def check_model_name(name: str) -> str:
    """``name`` if it is a valid servable name (letters, digits, ``._-``), else ValueError."""
    if not isinstance(name, str) or not _MODEL_NAME.match(name) or ".." in name:
        raise ValueError(
            f"--model_name {name!r} is not a valid servable name: use letters, digits, '.', "
            "'_' and '-' (one path component, not starting with '.' or '-', no '..').")
    return name


def load_trained(model_dir: str):
    """``(encoder, config, raw_item_ids)`` of a finished training run, SASRec
    (`tfrs_logq.sasrec.trained.load_trained`) or two-tower (`tfrs_logq.towers.run.load_run`):
    the encoder has ``max_length``, ``last_query(history)`` and ``item_embeddings()``."""
    if tower_run.is_two_tower_run(model_dir):
        return tower_run.load_run(model_dir)
    return sasrec_trained.load_trained(model_dir)


def load_run_split(model_dir: str, split_name: Optional[str] = None):
    """The `Split` a training run (SASRec or two-tower) trained on, reloaded from the data
    fields of its ``config.json``; ``split_name``: another split of the same data."""
    if tower_run.is_two_tower_run(model_dir):
        from tfrs_logq.sasrec.config import DATA_FIELDS, TrainConfig
        from tfrs_logq.sasrec.training import load_recorded_split

        with open(os.path.join(model_dir, "config.json")) as f:
            record = json.load(f)
        fields = {k: record[k] for k in DATA_FIELDS if record.get(k) is not None}
        if split_name:
            fields["split"] = split_name
        return load_recorded_split(TrainConfig(**fields), record)
    return sasrec_trained.load_run_split(model_dir, split_name=split_name)


def run_fingerprint(model_dir: str) -> str:
    """sha256 over a training run's ``config.json``, ``vocabulary.json`` and weights (a
    SASRec run's best, a two-tower run's final)."""
    digest = hashlib.sha256()
    names = ["config.json", "vocabulary.json"] + sorted(
        f for f in os.listdir(model_dir)
        if f.startswith("best.weights") or f.startswith(tower_run.WEIGHTS))
    for name in names:
        digest.update(name.encode())
        with open(os.path.join(model_dir, name), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def remove_stale_temporaries(base: str) -> list[str]:
    """Deletes ``.tmp-*`` directories that crashed exports left in ``base``.

    A temporary is named ``.tmp-VERSION-PID-RANDOM``; it is stale when that process
    is gone (an export in progress in a live process is left alone; so is a name
    without a PID). Returns the removed paths (`tfrs_logq._util.atomic.remove_stale_staging`).
    """
    return [os.path.join(base, name)
            for name in remove_stale_staging(base, (_TMP_PREFIX,))]


# The share of a ScaNN tree's leaves a query searches when the export does not tune it
# (a `RetrievalModule` built without tuning queries; `scann_parameters`' default).
DEFAULT_SEARCH_FRACTION = 0.05
# What `export --index scann` tunes for: the share of the exact top-k the index keeps
# (recall@k) on a sample of queries, for k = the export's --k and --max-k.
DEFAULT_TARGET_RECALL = 0.95
DEFAULT_MAX_K = 1000
DEFAULT_TUNING_QUERIES = 1000
# Each search reorders (scores exactly) at least this many times the items it returns;
# tuning doubles it, up to MAX_REORDER_FACTOR, where the leaves alone cannot reach the target.
REORDER_FACTOR = 10
MAX_REORDER_FACTOR = 80
_TREE_FROM = 20_000  # catalogs this large or larger get a partitioning tree


def scann_parameters(num_items: int, k: int,
                     search_fraction: float = DEFAULT_SEARCH_FRACTION,
                     max_k: Optional[int] = None) -> dict:
    """ScaNN settings by catalog size, before tuning.

    Small catalogs (< 20,000 items) are scored exhaustively with asymmetric hashing;
    larger ones use a partitioning tree of ``sqrt(n)`` leaves (ScaNN's guidance: about
    ``sqrt(n)``) of which ``search_fraction`` are searched (default 1/20; `tune_scann`
    replaces it by the fewest leaves that keep a target recall). A search for ``n``
    items reorders (scores exactly) the best ``max(reorder_factor * n, reorder)``
    hashed candidates: ``REORDER_FACTOR`` (10) times every k served, at least 500.
    ``k`` and ``max_k`` are the ks `tune_scann` tunes for.
    """
    if not 0.0 < search_fraction <= 1.0:
        raise ValueError(f"`search_fraction` must be in (0, 1], received {search_fraction}.")
    common = {"dims_per_block": 2, "anisotropic_threshold": 0.2,
              "reorder": min(num_items, 500), "reorder_factor": REORDER_FACTOR,
              "k": k, "max_k": min(max(k, max_k or k), num_items)}
    if num_items < _TREE_FROM:
        return {"tree": False, **common}
    leaves = int(round(math.sqrt(num_items)))
    return {"tree": True, "num_leaves": leaves,
            "num_leaves_to_search": max(1, math.floor(leaves * search_fraction + 1e-9)),
            "training_sample_size": min(num_items, 250_000), **common}


def resolve_index(index: str) -> str:
    """``index``, with ``"auto"`` made ``"scann"`` where ScaNN's ops load, else
    ``"faiss"`` where faiss imports, else ``"brute-force"`` (saying so in one log line).

    Raises:
      ValueError: ``index`` is not one of `INDEXES`.
      ImportError: ``"scann"`` where ScaNN cannot load (`scann_ops_or_error`'s line), or
        ``"faiss"`` where faiss does not import (`faiss_index.faiss_or_error`'s line).
    """
    from tfrs_logq.serving.faiss_index import EXTRA, faiss_or_error

    if index not in INDEXES:
        raise ValueError(f"`index` must be one of {INDEXES}, received {index!r}.")
    if index == "brute-force":
        return index
    if index == "faiss":
        faiss_or_error()
        return index
    try:
        scann_ops_or_error()
    except ImportError:
        if index == "scann":
            raise
    else:
        return "scann"
    try:
        faiss_or_error()
    except ImportError:
        logger.warning("--index auto: neither ScaNN (it does not load with TensorFlow %s) nor "
                       "faiss imports, so the export uses brute force (exact, stock "
                       "TensorFlow ops; for a faiss index: %s)", tf.__version__, EXTRA)
        return "brute-force"
    logger.warning("--index auto: ScaNN does not load with TensorFlow %s, so the export uses "
                   "a faiss index tuned to --target-recall (served by tfrs-logq serve; stock "
                   "TF Serving serves the same version by brute force)", tf.__version__)
    return "faiss"


def scann_ops_or_error():
    """``scann.scann_ops``, or an ImportError whose one line says why and what to do.

    scann 1.4.2's TF ops load only with TensorFlow 2.20.x: with 2.21 the import fails
    (an undefined absl symbol, or pip could not install it beside 2.21 at all).
    """
    try:
        from scann import scann_ops
    except Exception as exc:  # ImportError, or TF's NotFoundError from the ops library
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ImportError(
            f"--index scann needs ScaNN, which does not load with TensorFlow {tf.__version__} "
            f"({reason}); scann 1.4.2 loads only with TensorFlow 2.20: install it with "
            "pip install 'tfrs-logq[scann]' (TensorFlow 2.20), or export with "
            "--index brute-force") from exc
    return scann_ops


def build_scann_searcher(embeddings: np.ndarray, params: dict):
    scann_ops = scann_ops_or_error()
    builder = scann_ops.builder(embeddings, params["k"], "dot_product")
    if params["tree"]:
        builder = builder.tree(num_leaves=params["num_leaves"],
                               num_leaves_to_search=params["num_leaves_to_search"],
                               training_sample_size=params["training_sample_size"])
    builder = builder.score_ah(params["dims_per_block"],
                               anisotropic_quantization_threshold=params["anisotropic_threshold"])
    return builder.reorder(params["reorder"]).build()


def search_settings(n, params: dict):
    """``(leaves, reorder_factor)`` of a search for ``n`` items: those tuned for the
    smallest tuned k at least ``n`` (the largest k's beyond it; ``tuned``, `tune_scann`),
    else ``num_leaves_to_search`` (None without a tree) and ``reorder_factor``."""
    tuned = params.get("tuned")
    if not tuned:
        return params.get("num_leaves_to_search"), params.get("reorder_factor", 1)
    ks = tf.constant([int(row[0]) for row in tuned], tf.int32)
    at = tf.searchsorted(ks, tf.reshape(tf.cast(n, tf.int32), [1]), side="left")[0]
    at = tf.minimum(at, len(tuned) - 1)
    leaves = (tf.gather(tf.constant([int(row[1]) for row in tuned], tf.int32), at)
              if params["tree"] else None)
    return leaves, tf.gather(tf.constant([int(row[2]) for row in tuned], tf.int32), at)


def search_scann(searcher, queries, n, params: dict, leaves=None, reorder_factor=None,
                 every_leaf_when_short: bool = True):
    """ScaNN's top ``n`` of each query: ``(ids, scores)``, ids 0-based rows of the index.

    Searches ``leaves`` leaves of a tree and reorders (scores exactly) the best
    ``max(reorder_factor * n, reorder)`` hashed candidates; either, when not given,
    comes from the settings tuned for ``n`` (`tune_scann`), else from ``params``
    (`scann_parameters`). Where the leaves searched hold fewer than ``n`` items, scann
    1.4.2 returns as many columns as the best-served query found and fills the shorter
    rows with id 0 and a NaN score (measured), so a served list would repeat the first
    item or be short. Then the batch is searched again over every leaf, which holds the
    whole catalog (``n`` is at most its size); with ``every_leaf_when_short=False``
    (tuning: what the leaves searched find) the short answer is returned as it is.
    Works in a graph (the exported module) and eagerly (tuning, benchmarks).
    """
    tuned_leaves, tuned_factor = search_settings(n, params)
    leaves = tuned_leaves if leaves is None else leaves
    factor = tuned_factor if reorder_factor is None else reorder_factor
    reorder = tf.maximum(n * factor, params["reorder"])
    if not params["tree"]:
        idx, scores = searcher.search_batched(queries, final_num_neighbors=n,
                                              pre_reorder_num_neighbors=reorder)
        return tf.cast(idx, tf.int64), scores
    idx, scores = searcher.search_batched(queries, final_num_neighbors=n,
                                          pre_reorder_num_neighbors=reorder,
                                          leaves_to_search=leaves)
    if not every_leaf_when_short:
        return tf.cast(idx, tf.int64), scores

    def every_leaf():
        found = searcher.search_batched(queries, final_num_neighbors=n,
                                        pre_reorder_num_neighbors=reorder,
                                        leaves_to_search=params["num_leaves"])
        return tuple(found)  # a namedtuple in a graph: tf.cond wants plain tuples
    short = tf.logical_or(tf.shape(scores)[1] < n, tf.reduce_any(tf.math.is_nan(scores)))
    idx, scores = tf.cond(short, every_leaf, lambda: (idx, scores))
    return tf.cast(idx, tf.int64), scores


def tune_scann(searcher, items: np.ndarray, queries: np.ndarray, params: dict,
               target_recall: float = DEFAULT_TARGET_RECALL, tune: bool = True,
               queries_source: str = "given") -> tuple[dict, dict]:
    """Measures what the index keeps of the exact top-k and tunes its search to keep
    ``target_recall`` of it; returns ``(params, report)``.

    Recall counts what the leaves searched find (a row that ScaNN pads because they
    hold too few items counts its padding as missed; the served module searches every
    leaf then, at a brute-force-like cost), so it is a lower bound of the served recall.
    The queries are split in two halves. The first tunes (`scann_tuning.tune_search`),
    for k = ``params["k"]`` and ``params["max_k"]``: the reorder factor reaching the
    target with every leaf searched (doubled from ``reorder_factor``, at most
    ``MAX_REORDER_FACTOR``), then the fewest leaves keeping it. The second measures
    recall@k at the chosen settings, searched as the exported module searches
    (`search_scann`), against numpy brute force (`scann_tuning.exact_top_k`). With
    ``tune=False`` (fixed settings) the settings are only measured. Logs one warning
    line per k whose target is not met (by the tuning half at the most searching, or by
    the held-out half when not tuned).

    Args:
        searcher: the built ScaNN searcher (`build_scann_searcher` of ``items``).
        items: `[n, d]` the indexed embeddings.
        queries: `[m, d]` query embeddings (m >= 2).
        params: `scann_parameters` (or custom) settings the searcher was built with.
        target_recall: float in ``(0, 1]``. Defaults to 0.95.
        tune: bool. Tune the search. Defaults to True.
        queries_source: str. Where the queries come from, recorded in the report.

    Returns:
        The settings (with ``tuned``: ``[[k, leaves, reorder_factor], ...]`` by
        ascending k, which `search_scann` follows, when tuned) and the report:
        ``{"target_recall", "queries", "num_queries", "recall": {k: held-out recall@k},
        "tuning_recall", "reached", "tuned", "curve", "seconds"}``.
    """
    import time

    from tfrs_logq.serving.scann_tuning import (
        exact_top_k,
        recall_at_k,
        split_tuning_queries,
        tune_search,
    )

    start = time.perf_counter()
    items, tuning, held_out = split_tuning_queries(items, queries, target_recall)
    ks = sorted({min(params["k"], len(items)),
                 min(params.get("max_k") or params["k"], len(items))})
    params = dict(params)

    def search(q, k, leaves=None, factor=None):
        # What the leaves searched find: ScaNN's padding (NaN scores, short rows) counts
        # as missed, not the every-leaf search the served module falls back to.
        ids, scores = search_scann(searcher, q, k, params, leaves, factor,
                                   every_leaf_when_short=False)
        ids = np.where(np.isnan(scores.numpy()), -1, ids.numpy())
        return np.pad(ids, ((0, 0), (0, k - ids.shape[1])), constant_values=-1)

    report: dict = {"target_recall": target_recall, "queries": queries_source,
                    "num_queries": {"tuning": len(tuning), "held_out": len(held_out)}}
    if tune:
        exact = {k: exact_top_k(tuning, items, k) for k in ks}
        result = tune_search(search, tuning, exact,
                             params["num_leaves"] if params["tree"] else None, target_recall,
                             reorder_factor=params.get("reorder_factor", 1),
                             max_reorder_factor=MAX_REORDER_FACTOR)
        by_k = result["by_k"]
        params["tuned"] = [[k, by_k[k]["leaves"], by_k[k]["reorder_factor"]] for k in ks]
        if params["tree"]:
            params["num_leaves_to_search"] = by_k[ks[-1]]["leaves"]
        report["tuning_recall"] = {str(k): round(by_k[k]["recall"], 4) for k in ks}
        report["curve"] = {str(k): c for k, c in result["curve"].items()}
    recall = {k: recall_at_k(search(held_out, k), exact_top_k(held_out, items, k))
              for k in ks}
    report["recall"] = {str(k): round(r, 4) for k, r in recall.items()}
    report["tuned"] = params.get("tuned") or [
        [k, params.get("num_leaves_to_search"), params.get("reorder_factor", 1)] for k in ks]
    short = ([k for k in ks if by_k[k]["recall"] < target_recall] if tune else
             [k for k in ks if recall[k] < target_recall])
    report["reached"] = not short
    report["seconds"] = round(time.perf_counter() - start, 1)
    for k in short:
        leaves, factor = next((row[1], row[2]) for row in report["tuned"] if row[0] == k)
        how = (f"with every leaf searched and {factor} x k reordered" if tune else
               f"with {leaves} of {params['num_leaves']} leaves searched and {factor} x k "
               "reordered" if params["tree"] else f"with {factor} x k reordered")
        logger.warning(
            "the ScaNN index keeps %.3f of the exact top-%d %s (%d held-out queries), "
            "below --target-recall %g: serve --index brute-force, or accept it with a "
            "lower --target-recall", recall[k], k, how, len(held_out), target_recall)
    return params, report


class RetrievalModule(tf.Module):
    """Query encoder + vocabulary + index, with the three serving signatures.

    ``encoder``: a `SASRecEncoder` or a two-tower run's `tfrs_logq.towers.run.TowerEncoder`
    (``max_length``, ``last_query``, ``item_embeddings``).

    Args (ScaNN): ``scann_params`` fixes the settings (measured, not tuned); else
    `scann_parameters` of the catalog, ``default_k`` and ``max_k``, with the leaves
    searched tuned to ``target_recall`` on ``tuning_queries`` (`tune_scann`) unless a
    ``search_fraction`` fixes them. Without ``tuning_queries`` nothing is measured and
    ``search_fraction`` (default 1/20) applies. ``self.scann_tuning`` is the report.

    Args (faiss): the SavedModel searches by brute force (its signatures run in stock TF
    Serving); ``self.faiss_index`` (`faiss_index.FaissIndex`, written beside it by
    `export_version`) is what ``tfrs-logq serve`` searches. ``faiss_params`` fixes the
    settings (`faiss_index.faiss_parameters`; measured, not tuned, when they hold
    ``tuned`` or ``nprobe`` below ``nlist``); else the lists searched are tuned to
    ``target_recall`` at ``default_k`` and ``max_k`` on ``tuning_queries``. An index that
    cannot keep the target with every list it may search is refused (ValueError, one
    line). ``self.faiss_tuning`` is the report (None without ``tuning_queries``).
    """

    def __init__(self, encoder, raw_item_ids: np.ndarray, index: str,
                 default_k: int = 100, scann_params: Optional[dict] = None,
                 search_fraction: Optional[float] = None, *,
                 max_k: int = DEFAULT_MAX_K, target_recall: float = DEFAULT_TARGET_RECALL,
                 tuning_queries: Optional[np.ndarray] = None,
                 queries_source: str = "given",
                 faiss_params: Optional[dict] = None) -> None:
        super().__init__(name="retrieval")
        if index not in ("scann", "faiss", "brute-force"):
            raise ValueError(f"`index` must be 'scann', 'faiss' or 'brute-force', received "
                             f"{index!r}.")
        self.encoder = encoder
        self.max_length = encoder.max_length
        self.num_items = len(raw_item_ids)
        self.default_k = int(min(default_k, self.num_items))
        self.string_ids = raw_item_ids.dtype.kind in ("U", "S", "O")
        key_dtype = tf.string if self.string_ids else tf.int64
        keys = tf.constant(_normalized_keys(raw_item_ids) if self.string_ids
                           else raw_item_ids.astype(np.int64), key_dtype)
        self.vocabulary = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, tf.range(1, self.num_items + 1,
                                                               dtype=tf.int64)),
            default_value=0)
        self.raw_ids = tf.Variable(keys, trainable=False, name="raw_item_ids")
        table = encoder.item_embeddings().numpy()[1:].astype(np.float32)  # row 0 is padding
        self.index_kind = index
        self.scann_params, self.scann_tuning = None, None
        self.faiss_params, self.faiss_tuning, self.faiss_index = None, None, None
        if index == "scann":
            params = scann_params or scann_parameters(
                self.num_items, self.default_k,
                DEFAULT_SEARCH_FRACTION if search_fraction is None else search_fraction,
                max_k=max_k)
            searcher = build_scann_searcher(table, params)
            if tuning_queries is not None:
                params, self.scann_tuning = tune_scann(
                    searcher, table, tuning_queries, params, target_recall,
                    tune=scann_params is None and search_fraction is None,
                    queries_source=queries_source)
            self.scann_params = params
            self.scann_index = searcher.serialize_to_module()
        else:  # brute force, and the faiss export's own signatures
            self.item_table = tf.Variable(table, trainable=False, name="item_embeddings")
        if index == "faiss":
            self._build_faiss(table, faiss_params, max_k, target_recall, tuning_queries,
                              queries_source)
        history_spec = tf.TensorSpec([None, None], key_dtype, name="history")
        self.serving_default = tf.function(self._serve, input_signature=[history_spec])
        self.top_k = tf.function(
            self._serve_k, input_signature=[
                history_spec, tf.TensorSpec([], tf.int32, name="k"),
                tf.TensorSpec([], tf.bool, name="exclude_history")])
        self.query_embedding = tf.function(self._query, input_signature=[history_spec])
        # Not a signature: what `tfrs-logq serve` runs on the candidates an index outside
        # the graph (faiss) found: the history's items left out, the best k, raw ids.
        self.finish_search = tf.function(
            self._finish, input_signature=[
                history_spec, tf.TensorSpec([None, None], tf.int64, name="candidates"),
                tf.TensorSpec([None, None], tf.float32, name="candidate_scores"),
                tf.TensorSpec([], tf.int32, name="k"),
                tf.TensorSpec([], tf.bool, name="exclude_history")])

    def _build_faiss(self, table, faiss_params, max_k, target_recall, tuning_queries,
                     queries_source) -> None:
        from tfrs_logq.serving.faiss_index import FaissIndex, faiss_parameters

        params = dict(faiss_params) if faiss_params else faiss_parameters(
            self.num_items, self.default_k, max_k=max_k)
        fixed = bool(params.get("tuned")) or params["nprobe"] < params["nlist"]
        index = FaissIndex.build(table, params)
        if tuning_queries is not None:
            self.faiss_tuning = index.tune(table, tuning_queries, target_recall,
                                           queries_source=queries_source, tune=not fixed)
            refusal = index.unreached_line(self.faiss_tuning)
            if refusal:
                raise ValueError(refusal)
            for k, recall in self.faiss_tuning["recall"].items():
                if recall < target_recall:  # reached on the tuning half, not on the other
                    logger.warning(
                        "the faiss index keeps %.3f of the exact top-%s on the %d held-out "
                        "queries, below --target-recall %g (the tuning queries reached it)",
                        recall, k, self.faiss_tuning["num_queries"]["held_out"], target_recall)
        self.faiss_params, self.faiss_index = index.params, index

    def _lookup(self, history: tf.Tensor) -> tf.Tensor:
        """Raw ids -> internal ids (0: padding or unknown), text ids normalised first
        (`tfrs_logq.pipelines.ids.normalize_id`, as the log's ids were)."""
        if self.string_ids:
            history = normalize_id_tensor(history)
        return self.vocabulary.lookup(history)

    def _aligned(self, history: tf.Tensor) -> tf.Tensor:
        """Raw ids -> internal ids, padding/unknown dropped, right-aligned in [batch, L]."""
        tf.debugging.assert_less_equal(
            tf.shape(history)[1], self.max_length,
            message=f"history is longer than the model takes ({self.max_length} items)")
        ids = self._lookup(history)
        valid = ids > 0
        from_right = tf.cumsum(tf.cast(valid, tf.int32), axis=1, reverse=True)
        keep = tf.logical_and(valid, from_right <= self.max_length)
        rows = tf.cast(tf.where(keep)[:, 0], tf.int32)
        cols = self.max_length - tf.boolean_mask(from_right, keep)
        batch = tf.shape(history)[0]
        return tf.scatter_nd(tf.stack([rows, cols], axis=1), tf.boolean_mask(ids, keep),
                             tf.stack([batch, self.max_length]))

    def _query(self, history):
        query = self.encoder.last_query(tf.cast(self._aligned(history), tf.int32), training=False)
        return {"query_embedding": tf.cast(query, tf.float32)}

    def _search(self, history, k, exclude_history):
        query = self._query(history)["query_embedding"]
        tf.debugging.assert_greater(k, 0, message="k must be positive")
        tf.debugging.assert_less_equal(k, self.num_items,
                                       message=f"k must be at most {self.num_items}")
        n = tf.minimum(k + tf.where(exclude_history, tf.shape(history)[1], 0), self.num_items)
        if self.index_kind == "scann":
            scann_ops = scann_ops_or_error()
            searcher = scann_ops.searcher_from_module(self.scann_index)
            idx, scores = search_scann(searcher, query, n, self.scann_params)
        else:
            scores, idx = tf.math.top_k(tf.matmul(query, self.item_table, transpose_b=True), n)
            idx = tf.cast(idx, tf.int64)
        return self._finish(history, idx, scores, k, exclude_history)

    def _finish(self, history, idx, scores, k, exclude_history):
        """Candidates (0-based rows, `[batch, n]`, best first) -> the best ``k`` that are
        not in the history (when ``exclude_history``), as raw ids and scores."""
        tf.debugging.assert_greater(k, 0, message="k must be positive")
        tf.debugging.assert_less_equal(k, tf.shape(idx)[1],
                                       message="k must be at most the candidates found")
        # Items of the history are left out (the gSASRec protocol): search k + width
        # candidates, drop the history's, keep the best k.
        history_ids = self._lookup(history)  # internal ids, 0 = padding/unknown
        seen = tf.reduce_any(tf.equal((idx + 1)[:, :, None], history_ids[:, None, :]), axis=-1)
        scores = tf.where(tf.logical_and(seen, exclude_history), float("-inf"), scores)
        scores, best = tf.math.top_k(scores, k)
        idx = tf.gather(idx, best, batch_dims=1)
        return {"item_ids": tf.gather(self.raw_ids, idx), "scores": scores}

    def _serve(self, history):
        return self._search(history, tf.constant(self.default_k, tf.int32), tf.constant(True))

    def _serve_k(self, history, k, exclude_history):
        return self._search(history, k, exclude_history)


def _normalized_keys(raw_item_ids: np.ndarray) -> np.ndarray:
    """Text item ids through `normalize_id` (a run's are already); refuses a catalog in
    which two ids become one, or one becomes empty (the padding)."""
    keys = np.asarray([normalize_id(str(x)) for x in raw_item_ids], dtype=object)
    if any(key == "" for key in keys):
        raise ValueError("the item vocabulary holds an id of only white space; it would "
                         "equal the padding \"\": remove it from the log and train again.")
    seen: dict = {}
    for raw, key in zip(raw_item_ids, keys):
        if seen.setdefault(key, raw) != raw:
            raise ValueError(f"the item ids {str(seen[key])!r} and {str(raw)!r} are one id "
                             "once the white space around them is trimmed; merge them in the "
                             "log and train again.")
    return keys.astype(str)


_MAX_VERSION = 2**63 - 1  # TF Serving's versions are int64


def next_version(base: str) -> int:
    versions = [int(d) for d in os.listdir(base) if re.fullmatch(r"[0-9]+", d)] \
        if os.path.isdir(base) else []
    return max(versions, default=0) + 1


def _free_version_path(base: str, version: int) -> str:
    """``base/version`` if ``version`` is a positive integer within int64 (TF Serving's
    versions are int64) not yet written, else an error."""
    if int(version) < 1:
        raise ValueError(f"`version` must be a positive integer, received {version}.")
    if int(version) > _MAX_VERSION:
        raise ValueError(f"`version` must be at most {_MAX_VERSION} (TF Serving's versions "
                         f"are int64), received {str(version)[:40]}.")
    final = os.path.join(base, str(int(version)))
    if os.path.exists(final):
        raise FileExistsError(f"{final} exists; versions are immutable, choose another.")
    return final


def run_queries(encoder, model_dir: str, raw_ids: np.ndarray,
                count: int = DEFAULT_TUNING_QUERIES, seed: int = 0) -> tuple[np.ndarray, str]:
    """Query embeddings of a seeded sample of ``count`` validation targets of the run's own
    data (the user's history before each target; the test split's where the split has no
    validation part), and a line saying so (how many targets of how many users, of which
    split); where the data cannot be loaded (moved, another vocabulary), random histories
    of the catalog's items instead, with a one-line warning."""
    from tfrs_logq.pipelines.sequential import left_pad

    rng = np.random.default_rng(seed)
    try:
        split = load_run_split(model_dir)
        if [str(x) for x in split.interactions.raw_items] != [str(x) for x in raw_ids]:
            raise ValueError(f"{split.interactions.source} is not the data the run trained on")
        name, part = (("validation", split.validation) if len(split.validation)
                      else ("test", split.test))
        pick = np.sort(rng.choice(len(part), min(count, len(part)), replace=False))
        histories = [split.sequences[u][:n]
                     for u, n in zip(part.users[pick], part.history_lengths[pick])]
        users = len(np.unique(part.users[pick]))  # a user may have several targets
        source = (f"{len(pick):,} {name} target{'s' if len(pick) != 1 else ''} of "
                  f"{users:,} user{'s' if users != 1 else ''} of "
                  f"{split.interactions.source} (the history before each target), "
                  f"seed {seed}")
    except Exception as exc:  # noqa: BLE001 (any failure to read the data: say it, go on)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        logger.warning("ScaNN tuning: could not load the run's data (%s); tuning on %d random "
                       "histories instead, which need not resemble real queries", reason, count)
        histories = list(rng.integers(1, len(raw_ids) + 1, (count, encoder.max_length)))
        source = f"{count:,} random histories (the run's data could not be loaded: {reason})"
    padded = left_pad(histories, encoder.max_length).astype(np.int32)
    queries = np.concatenate([encoder.last_query(padded[i:i + 256], training=False).numpy()
                              for i in range(0, len(padded), 256)])
    return queries.astype(np.float32), source


def export(model_dir: str, model_base_path: str, model_name: str, version: Optional[int] = None,
           index: str = "auto", default_k: int = 100, scann_params: Optional[dict] = None,
           module: Optional[RetrievalModule] = None) -> str:
    """Writes ``model_base_path/model_name/version`` atomically; returns its path.

    ``model_base_path`` is here the parent of one directory per servable (a
    multi-model layout). `export_version` writes into TF Serving's base path itself.
    """
    check_model_name(model_name)
    return export_version(model_dir, os.path.join(model_base_path, model_name), version=version,
                          index=index, default_k=default_k, scann_params=scann_params,
                          module=module)


def export_version(model_dir: str, base_path: str, version: Optional[int] = None,
                   index: str = "auto", default_k: int = 100,
                   scann_params: Optional[dict] = None,
                   module: Optional[RetrievalModule] = None,
                   search_fraction: Optional[float] = None,
                   target_recall: float = DEFAULT_TARGET_RECALL,
                   max_k: int = DEFAULT_MAX_K,
                   tuning_queries: int = DEFAULT_TUNING_QUERIES,
                   faiss_params: Optional[dict] = None) -> str:
    """Writes ``base_path/VERSION`` atomically (TF Serving's ``--model_base_path``
    layout: ``base_path`` holds the integer versions); returns its path.

    The next free version is used unless ``version`` is given; versions are
    immutable. ``.tmp-*`` directories left by crashed exports are removed first.
    A ScaNN index is measured on the query embeddings of ``tuning_queries`` validation
    users (`run_queries`) and, unless ``scann_params`` or ``search_fraction`` fix its
    settings, its leaves searched are tuned to keep ``target_recall`` of the exact top-k
    at ``default_k`` and ``max_k`` (`tune_scann`); ``assets/export.json`` records the
    settings (``scann``) and what was measured (``scann_tuning``). A faiss index is tuned
    likewise (`faiss_index.FaissIndex.tune`; ``faiss_params`` fixes its settings) and
    written as ``assets/index.faiss``, recorded as ``faiss`` and ``faiss_tuning``; one that
    cannot keep ``target_recall`` is refused before anything is written (ValueError).
    """
    if version is not None:  # refused before the model is loaded and the index built
        _free_version_path(base_path, version)
    if module is None:  # where ScaNN cannot load, say so (or fall back) before any work
        index = resolve_index(index)
    elif index not in INDEXES:
        raise ValueError(f"`index` must be one of {INDEXES}, received {index!r}.")
    config, fingerprint = {}, None
    if module is None:
        encoder, config, raw_ids = load_trained(model_dir)
        if default_k > len(raw_ids):
            logger.warning("--k %d is larger than the catalog (%d items): the export "
                           "answers at most %d items.", default_k, len(raw_ids), len(raw_ids))
        fingerprint = run_fingerprint(model_dir)
        queries, source = (run_queries(encoder, model_dir, raw_ids, tuning_queries)
                           if index in ("scann", "faiss") else (None, ""))
        module = RetrievalModule(encoder, raw_ids, index, default_k, scann_params,
                                 search_fraction, max_k=max_k, target_recall=target_recall,
                                 tuning_queries=queries, queries_source=source,
                                 faiss_params=faiss_params)
    base = base_path
    os.makedirs(base, exist_ok=True)
    for path in remove_stale_temporaries(base):
        logger.warning("removed %s, left by an export that did not finish", path)
    version = next_version(base) if version is None else int(version)
    final = _free_version_path(base, version)  # again: another export may have taken it
    # 0o755, not mkdtemp's 0o700: a server run by another user reads it.
    with staging_directory(base, f"{_TMP_PREFIX}{version}-{os.getpid()}-", mode=0o755) as tmp:
        signatures = {
            tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: module.serving_default,
            "top_k": module.top_k,
            "query_embedding": module.query_embedding,
        }
        options = tf.saved_model.SaveOptions(namespace_whitelist=["Scann"])
        tf.saved_model.save(module, tmp, signatures=signatures, options=options)
        meta = {
            "index": module.index_kind, "scann": module.scann_params,
            "scann_tuning": module.scann_tuning,
            "faiss": None, "faiss_tuning": module.faiss_tuning,
            "num_items": module.num_items, "max_length": module.max_length,
            "default_k": module.default_k,
            "history_dtype": "string" if module.string_ids else "int64",
            "padding": "" if module.string_ids else 0,
            # Inputs a client may leave out (tfrs-logq serve fills them in).
            "input_defaults": {"top_k": {"exclude_history": True}},
            "model": config,
            "run": None if fingerprint is None else {
                "model_dir": os.path.abspath(model_dir), "fingerprint": fingerprint},
        }
        os.makedirs(os.path.join(tmp, "assets"), exist_ok=True)
        if module.faiss_index is not None:
            stored = module.faiss_index.save(os.path.join(tmp, "assets"))
            # the index's own dicts: a tf.Module wraps those assigned to it for tracking
            meta["faiss"] = {**module.faiss_index.params, "stored": stored}
            meta["faiss_tuning"] = module.faiss_index.report
        with open(os.path.join(tmp, "assets", "export.json"), "w") as f:
            json.dump(meta, f, indent=2)
        publish_directory(tmp, final, replace=False)  # versions are immutable
    return final


__all__ = ["DEFAULT_MAX_K", "DEFAULT_SEARCH_FRACTION", "DEFAULT_TARGET_RECALL",
           "DEFAULT_TUNING_QUERIES", "INDEXES", "MAX_REORDER_FACTOR", "REORDER_FACTOR",
           "RetrievalModule", "build_scann_searcher", "check_model_name", "describe_index",
           "export", "export_version", "load_run_split", "load_trained", "remove_stale_temporaries",
           "resolve_index", "run_fingerprint", "run_queries", "scann_ops_or_error",
           "scann_parameters", "search_scann", "search_settings", "tune_scann"]
