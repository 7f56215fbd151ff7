"""Evaluation on the device, in chunks of queries: top-k, the model's softmax, ranks.

The same measures as the TensorFlow study's `evaluate` and `truth_columns` (d9f8357), on
the held-out examples (`world.World.eval_batch`, the TF study's to the bit):

- exact expected Recall@k = mean over users of ``sum_{d in model top-k} P(d|u)``: the
  top-k is brute force over ids ``1..V`` on the device (``chunk x V`` scores at a time);
  ``P(d|u)`` of the `[n, 1000]` ids is summed on the host in float64 (the truth's dtype);
- observed Recall@k of the held-out targets, overall and by popularity band: the target's
  0-based rank counts the items scoring at least as high (ties against the target, as
  `tfrs_logq.metrics.ranks_from_scores`);
- quantiles of ``P(p|u)`` and ``P(p|u)/Q(p)`` under the model's full-catalog softmax and
  under the truth; the oracle's exact recall (the true top-k, ranked on the device in
  float32 and summed in float64: a near-tie swapped by rounding changes the sum by the
  difference of two nearly equal probabilities).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .model import query_embeddings
from .world import BANDS, KS, World

QUANTILES = (10, 50, 90)
DEFAULT_CHUNK_FLOATS = 1 << 25  # 128 MB of float32 scores per chunk


@partial(jax.jit, static_argnames=("k",))
def _score_chunk(queries, items, targets, k: int):
    scores = queries @ items.T  # column j is item j + 1
    top = jax.lax.top_k(scores, k)[1] + 1
    target_scores = jnp.take_along_axis(scores, (targets - 1)[:, None], axis=1)
    log_p = target_scores[:, 0] - jax.nn.logsumexp(scores, axis=1)
    ranks = jnp.maximum((scores >= target_scores).sum(1) - 1, 0)
    return top, log_p, ranks


@partial(jax.jit, static_argnames=("k",))
def _truth_chunk(log_pc, item_topic, base, k: int):
    return jax.lax.top_k(log_pc[:, item_topic] + base[None, :], k)[1] + 1


def _chunks(n: int, num_items: int, chunk_floats: int):
    size = max(1, min(n, chunk_floats // num_items))
    for start in range(0, n, size):
        yield start, size


def _pad(x: np.ndarray, size: int) -> np.ndarray:
    if len(x) == size:
        return x
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])


def model_top_k(queries, item_table, targets: np.ndarray, k: int,
                chunk_floats: int = DEFAULT_CHUNK_FLOATS):
    """``(top [n, k] ids, log P(target) [n], ranks [n])`` of the model, numpy."""
    items = jnp.asarray(item_table)[1:]
    num_items = items.shape[0]
    k = min(k, num_items)
    tops, log_ps, ranks = [], [], []
    for start, size in _chunks(len(targets), num_items, chunk_floats):
        n = min(size, len(targets) - start)
        q = jnp.asarray(_pad(np.asarray(queries[start:start + n]), size))
        t = jnp.asarray(_pad(targets[start:start + n].astype(np.int32), size))
        top, log_p, rank = _score_chunk(q, items, t, k)
        tops.append(np.asarray(top)[:n])
        log_ps.append(np.asarray(log_p)[:n])
        ranks.append(np.asarray(rank)[:n])
    return np.concatenate(tops), np.concatenate(log_ps), np.concatenate(ranks)


def quantiles(values: np.ndarray, prefix: str) -> dict:
    return {f"{prefix}_q{q}": float(np.percentile(values, q)) for q in QUANTILES}


def recall_from_ranks(ranks: np.ndarray, k: int) -> float:
    return float((ranks < k).mean()) if ranks.size else float("nan")


def evaluate_with_hits(params: dict, world: World,
                       chunk_floats: int = DEFAULT_CHUNK_FLOATS) -> tuple:
    """``(row, hits)``: the run's metric columns (the results.csv names of every recorded
    run) and its hits per held-out user, in the held-out batch's order:

    - ``exact``: `[users, len(KS)]` float64, ``sum_{d in model top-k} P(d|u)``; its column
      means are the ``exact_recall@k`` columns;
    - ``observed``: `[users, len(KS)]` bool, the target ranked within the top ``k``; its
      column means are ``observed_recall@k``, and over a band's users ``<band>_recall@k``;
    - ``band``: `[users]` int8, the target's popularity band (an index of `BANDS`);
    - ``ks``: the cut-offs, `KS`.
    """
    batch = world.eval_batch
    targets = batch["target"]
    queries = np.asarray(query_embeddings(params, jnp.asarray(batch["history"], jnp.int32)))
    top, model_log_p, ranks = model_top_k(queries, params["item_embedding"], targets,
                                          max(KS), chunk_floats)
    exact = world.exact_expected_hits(top, KS)
    row = {f"exact_recall@{k}": float(exact[:, i].mean()) for i, k in enumerate(KS)}
    row.update({f"observed_recall@{k}": recall_from_ranks(ranks, k) for k in KS})
    target_band = world.bands[targets]
    for b, name in enumerate(BANDS):
        row.update({f"{name}_recall@{k}": recall_from_ranks(ranks[target_band == b], k)
                    for k in KS})
    row.update(quantiles(np.exp(model_log_p), "model_p"))
    row.update(quantiles(np.exp(model_log_p - world.log_q[targets]), "model_p_over_q"))
    hits = {"exact": exact, "observed": np.stack([ranks < k for k in KS], axis=1),
            "band": target_band.astype(np.int8), "ks": np.asarray(KS, np.int64)}
    return row, hits


def evaluate(params: dict, world: World, chunk_floats: int = DEFAULT_CHUNK_FLOATS) -> dict:
    """The run's metric columns (the results.csv names of every recorded run)."""
    return evaluate_with_hits(params, world, chunk_floats)[0]


def truth_columns(world: World, chunk_floats: int = DEFAULT_CHUNK_FLOATS) -> dict:
    """The run-independent columns (the results.csv names of every recorded run)."""
    cfg = world.config
    targets = world.eval_batch["target"]
    n = len(targets)
    item_topic = jnp.asarray(np.arange(cfg.num_items) % cfg.num_topics, jnp.int32)
    base = jnp.asarray(world.log_pop - world.log_topic_norm[np.arange(cfg.num_items)
                                                             % cfg.num_topics], jnp.float32)
    k = min(max(KS), cfg.num_items)
    tops = []
    for start, size in _chunks(n, cfg.num_items, chunk_floats):
        m = min(size, n - start)
        log_pc = jnp.asarray(_pad(world.eval_log_pc[start:start + m], size), jnp.float32)
        tops.append(np.asarray(_truth_chunk(log_pc, item_topic, base, k))[:m])
    row = {f"oracle_exact_recall@{k}": v
           for k, v in world.exact_expected_recall(np.concatenate(tops)).items()}
    log_p = world.true_log_prob(np.arange(n), targets)
    row.update(quantiles(np.exp(log_p), "truth_p"))
    row.update(quantiles(np.exp(log_p - world.log_q[targets]), "truth_p_over_q"))
    for b, name in enumerate(BANDS):
        row[f"{name}_targets"] = int((world.bands[targets] == b).sum())
    return row


__all__ = ["evaluate", "evaluate_with_hits", "model_top_k", "truth_columns"]
