"""Gradient bias of sampled softmax losses, measured against the full softmax.

The paper's argument is about gradients: with a proposal ``Q`` the sampled
softmax gradient with respect to the query embedding ``u`` is a biased estimate
of the full-softmax gradient

    g*(u, p) = -v_p + sum_d P(d | u) v_d,        P(d | u) = softmax_d(u . v_d),

and the corrected logQ loss removes most of that bias. This module measures it
on any model that scores by a dot product (a `train` run, a two-tower model's
embeddings, the synthetic stream's ground truth):

- ``g*`` exactly, by a full softmax over the whole catalog, chunked (never
  ``queries x items`` in memory, so 10^6-item catalogs run on CPU);
- the sampled gradient ``g`` of the library's own losses
  (`tfrs_logq.losses.sampled_softmax_loss`, by automatic differentiation) for
  ``correction`` in none / logq-tfrs / logq-official / corrected, over many seeded draws of the
  negatives (Monte Carlo), or over every possible draw on tiny catalogs
  (``exact=True``);
- per query: relative bias ``||E[g] - g*|| / ||g*||`` (its Monte Carlo noise
  ``tr Var[g] / T`` removed from ``||mean - g*||^2``), relative variance
  ``E||g - E[g]||^2 / ||g*||^2`` and ``cos(E[g], g*)``; also the bias of the
  weight ``w = 1 - P(p|u)`` the corrected loss estimates: ``E[w_hat] - (1 - P(p|u))``.

Samplers (``k`` negatives per query, accidental hits masked):

- ``"in-batch"``: the other positives of a batch of ``k + 1``, i.e. ``k`` draws
  from the unigram ``Q`` (positives drawn i.i.d. from the training distribution);
- ``"uniform"``: ``k`` uniform draws, ``Q = 1 / N``;
- ``"mixed"``: ``k // 2`` uniform and ``k - k // 2`` unigram draws, each
  corrected with the mixture's own per-slot proposal ``a / N + (1 - a) Q(d)``;
- ``"mixed-unigram"``: the same draws (the same random numbers as ``"mixed"``),
  every negative, the uniform ones too, corrected with the unigram ``log Q``: the
  paper's convention, and what the ``mns-*`` objectives train
  (`tfrs_logq.sasrec.objectives`; `tfrs_logq.sampling.MixedSampler`'s default).

``log Q'`` and the weight ``w`` come from `tfrs_logq.proposal.excluded_log_q` and
`tfrs_logq.losses.corrected_weight`, the functions the losses use.

Results are averaged over queries, overall and by the positive's popularity
decile (decile 0 = the 10% most popular items).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from tfrs_logq._util.atomic import save_figure
from tfrs_logq.losses import (
    CORRECTIONS,
    check_correction,
    corrected_weight,
    masked_row_logsumexp,
    sampled_softmax_loss,
)
from tfrs_logq.metrics import popularity_deciles
from tfrs_logq.proposal import excluded_log_q, mixture_probability, standard_positive_share

SAMPLERS = ("in-batch", "uniform", "mixed", "mixed-unigram")
# What each sampler's negatives are corrected with (shown under the table).
SAMPLER_PROPOSALS = {
    "in-batch": "unigram Q(d)",
    "uniform": "1 / N",
    "mixed": "the mixture's own log Q, a / N + (1 - a) Q(d)",
    "mixed-unigram": "unigram Q(d) for every negative, the uniform ones too "
                     "(the paper's convention; what mns-* trains)",
}


def full_softmax_gradient(queries, items, positives, chunk_size: int = 65_536):
    """Exact ``g* = -v_p + sum_d P(d|u) v_d`` and ``P(p|u)``, chunked over the catalog.

    Args:
      queries: `[n, dim]` query embeddings.
      items: `[N, dim]` item embeddings (every row is a class).
      positives: `[n]` int row of each query's positive in ``items``.
      chunk_size: items scored at once.

    Returns:
      ``(g_star [n, dim] float64, p_positive [n] float64)``.
    """
    u = np.asarray(queries, np.float64)
    n = u.shape[0]
    running_max = np.full(n, -np.inf)
    total = np.zeros(n)
    weighted = np.zeros_like(u)
    for start in range(0, items.shape[0], chunk_size):
        block = np.asarray(items[start:start + chunk_size], np.float64)
        scores = u @ block.T
        new_max = np.maximum(running_max, scores.max(axis=1))
        scale = np.exp(running_max - new_max)
        e = np.exp(scores - new_max[:, None])
        total = total * scale + e.sum(axis=1)
        weighted = weighted * scale[:, None] + e @ block
        running_max = new_max
    v_p = np.asarray(items[positives], np.float64)
    s_p = np.einsum("nd,nd->n", u, v_p)
    p_positive = np.exp(s_p - running_max) / total
    return weighted / total[:, None] - v_p, p_positive


@dataclasses.dataclass(frozen=True)
class Proposal:
    """The sampler's draws and the per-draw ``log Q`` each negative is corrected with."""

    name: str
    num_negatives: int
    unigram: np.ndarray  # [N] per-draw probabilities of the in-batch part

    def __post_init__(self):
        if self.name not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, received {self.name!r}.")
        if int(self.num_negatives) < 1:
            raise ValueError(f"num_negatives must be >= 1, received {self.num_negatives!r}.")

    @property
    def num_uniform(self) -> int:
        k = self.num_negatives
        return {"in-batch": 0, "uniform": k, "mixed": k // 2, "mixed-unigram": k // 2}[self.name]

    def log_q(self) -> np.ndarray:
        """`[N]` log proposal a negative is corrected with: the per-slot proposal of the
        draws, or the unigram for ``"mixed-unigram"`` (the paper's convention)."""
        num_items = len(self.unigram)
        a = 0.0 if self.name == "mixed-unigram" else self.num_uniform / self.num_negatives
        with np.errstate(divide="ignore"):
            return np.log(mixture_probability(self.unigram, a, num_items))

    def draw(self, rng: np.random.Generator, num_queries: int) -> np.ndarray:
        """`[num_queries, k]` negative item rows."""
        num_items = len(self.unigram)
        uniform = rng.integers(0, num_items, size=(num_queries, self.num_uniform))
        cdf = np.cumsum(self.unigram)
        cdf /= cdf[-1]
        size = (num_queries, self.num_negatives - self.num_uniform)
        in_batch = np.minimum(np.searchsorted(cdf, rng.random(size), side="right"), num_items - 1)
        return np.concatenate([uniform, in_batch], axis=1)

    def enumerate_draws(self, limit: int = 200_000):
        """Every ``k``-tuple of negatives with its probability (tiny catalogs only)."""
        num_items, k = len(self.unigram), self.num_negatives
        if num_items ** k > limit:
            raise ValueError(f"exact expectation over {num_items}^{k} draws is too large; "
                             "use Monte Carlo (exact=False).")
        slot = [np.full(num_items, 1.0 / num_items)] * self.num_uniform + \
            [self.unigram / self.unigram.sum()] * (k - self.num_uniform)
        for combo in itertools.product(range(num_items), repeat=k):
            yield np.asarray(combo), float(np.prod([slot[i][d] for i, d in enumerate(combo)]))


def _sampled_gradients(correction: str, queries, items, positives, negatives, log_q):
    """Per-query gradient of the library loss w.r.t. the query, and ``w_hat`` (corrected).

    ``negatives`` `[n, k]` item rows; ``log_q`` `[N]` per-draw proposal.
    """
    u = tf.convert_to_tensor(queries)
    v_p = tf.gather(items, positives)
    v_n = tf.gather(items, negatives)
    is_negative = negatives != positives[:, None]
    negative_log_q = tf.gather(log_q, negatives)
    positive_log_q = tf.gather(log_q, positives)
    kwargs = {}
    if correction == "logq-tfrs":
        kwargs = dict(negative_log_q=negative_log_q, positive_log_q=positive_log_q)
    elif correction == "logq-official":
        kwargs = dict(negative_log_q=negative_log_q)
    elif correction == "corrected":
        # Q'(d) = Q(d) / (1 - Q(p)): the proposal with the positive excluded.
        kwargs = dict(negative_log_q=excluded_log_q(negative_log_q, positive_log_q))
    with tf.GradientTape() as tape:
        tape.watch(u)
        s_p = tf.einsum("nd,nd->n", u, v_p)
        s_n = tf.einsum("nd,nkd->nk", u, v_n)
        # log Q' is derived from a checked Q here, as the task derives it (it may exceed 0).
        loss = sampled_softmax_loss(s_p, s_n, correction=correction, is_negative=is_negative,
                                    validate=False, **kwargs)
        total = tf.reduce_sum(loss)
    grad = tape.gradient(total, u)
    w_hat = None
    if correction == "corrected":  # the weight the loss used: w = 1 - P(p|u)
        lse = masked_row_logsumexp(s_n - kwargs["negative_log_q"], tf.logical_not(is_negative))
        num_valid = tf.reduce_sum(tf.cast(is_negative, tf.int32), 1)
        w_hat = corrected_weight(s_p, lse, num_valid)
    return grad, w_hat


_sampled_gradients_fn = tf.function(_sampled_gradients, reduce_retracing=True)


def diagnose(
    queries,
    items,
    positives,
    unigram,
    *,
    samplers: Sequence[str] = ("in-batch",),
    num_negatives: Sequence[int] = (16, 64, 256),
    corrections: Sequence[str] = CORRECTIONS,
    num_draws: int = 200,
    seed: int = 0,
    exact: bool = False,
    chunk_size: int = 65_536,
) -> dict:
    """Bias, variance and cosine of sampled gradients against the full softmax.

    Args:
      queries: `[n, dim]` query embeddings.
      items: `[N, dim]` item embeddings; ``positives`` and the draws index its rows.
      positives: `[n]` int rows of the positives.
      unigram: `[N]` non-negative item frequencies (normalised here): the
        in-batch proposal.
      samplers: names from `SAMPLERS`.
      num_negatives: values of ``k``.
      corrections: from `CORRECTIONS` (``none``, ``logq-tfrs``, ``logq-official``,
        ``corrected``).
      num_draws: Monte Carlo draws per (sampler, k).
      seed: seed of the draws.
      exact: enumerate every draw instead (catalogs with ``N^k`` <= 200k).
      chunk_size: items per chunk of the full softmax.

    Returns:
      ``{"rows": [...], "num_queries", "num_items", "num_draws", "exact"}``;
      one row per (sampler, k, correction) with ``bias``, ``variance``,
      ``cosine``, ``w_bias`` (corrected only; mean of ``E[w_hat] - (1 - P)``)
      averaged over queries, and ``by_decile``: the same per popularity decile
      of the positive. ``per_query`` arrays are kept under ``"_per_query"``.
    """
    queries, items, positives, unigram = _checked_inputs(queries, items, positives, unigram,
                                                         corrections)
    g_star, p_positive = full_softmax_gradient(queries, items, positives, chunk_size)
    decile = popularity_deciles(unigram)[positives]  # of each positive, by frequency
    regime = positive_regime(p_positive, positives, unigram, samplers, num_negatives)
    rows, per_query = [], {}
    items_tf, positives_tf = tf.constant(items), tf.constant(positives)
    for sampler in samplers:
        for k in num_negatives:
            proposal = Proposal(sampler, int(k), unigram)
            moments = _gradient_moments(
                proposal, _draws(proposal, len(queries), exact, num_draws, seed),
                queries, items_tf, positives_tf, corrections)
            for c in corrections:
                measures = _per_query_measures(*moments[c], g_star, p_positive,
                                               None if exact else num_draws)
                per_query[(sampler, int(k), c)] = measures
                rows.append(_row(sampler, int(k), c, measures, decile))
    return {"rows": rows, "num_queries": int(len(queries)), "num_items": int(items.shape[0]),
            "num_draws": None if exact else int(num_draws), "exact": bool(exact),
            "proposals": {s: SAMPLER_PROPOSALS[s] for s in samplers},
            "regime": regime, "_per_query": per_query}


def _checked_inputs(queries, items, positives, unigram, corrections):
    """``diagnose``'s arrays as float64 / int64, the unigram normalised; ValueError naming
    the argument otherwise."""
    queries = np.asarray(queries, np.float64)
    items = np.asarray(items, np.float64)
    positives = np.asarray(positives, np.int64)
    unigram = np.asarray(unigram, np.float64)
    num_items = items.shape[0]
    if queries.ndim != 2 or items.ndim != 2 or queries.shape[1] != items.shape[1]:
        raise ValueError(f"queries {queries.shape} and items {items.shape} must be "
                         "[n, dim] and [N, dim] with the same dim.")
    if positives.shape != (queries.shape[0],):
        raise ValueError(f"positives must be [n] = [{queries.shape[0]}], got {positives.shape}.")
    if positives.size and (positives.min() < 0 or positives.max() >= num_items):
        raise ValueError(f"positives must be item rows in [0, {num_items}).")
    if unigram.shape != (num_items,) or (unigram < 0).any() or unigram.sum() <= 0:
        raise ValueError(f"unigram must be [N] = [{num_items}] non-negative frequencies.")
    for c in corrections:
        check_correction(c)
    return queries, items, positives, unigram / unigram.sum()


def _draws(proposal: Proposal, num_queries: int, exact: bool, num_draws: int, seed: int):
    """``(negatives [num_queries, k], weight)`` pairs whose weights sum to 1: every draw
    with its probability (``exact``), or ``num_draws`` seeded Monte Carlo draws."""
    k = proposal.num_negatives
    if exact:
        return ((np.broadcast_to(combo, (num_queries, k)), prob)
                for combo, prob in proposal.enumerate_draws())
    # mixed-unigram draws what mixed draws: common random numbers
    stream = SAMPLERS.index("mixed" if proposal.name == "mixed-unigram" else proposal.name)
    rng = np.random.default_rng([seed, stream, k])
    return ((proposal.draw(rng, num_queries), 1.0 / num_draws) for _ in range(num_draws))


def _gradient_moments(proposal: Proposal, draws, queries, items_tf, positives_tf,
                      corrections: Sequence[str]) -> dict:
    """``{correction: (E[g] [n, dim], E||g||^2 [n], E[w_hat] [n])}`` over the weighted
    ``draws`` (``E[w_hat]`` is zeros but for ``"corrected"``)."""
    log_q = tf.constant(proposal.log_q())
    sums = {c: np.zeros_like(queries) for c in corrections}
    squares = {c: np.zeros(len(queries)) for c in corrections}
    w_sum = np.zeros(len(queries))
    for negatives, weight in draws:
        negatives_tf = tf.constant(negatives, tf.int64)
        for c in corrections:
            grad, w_hat = _sampled_gradients_fn(c, tf.constant(queries), items_tf,
                                                positives_tf, negatives_tf, log_q)
            grad = grad.numpy()
            sums[c] += weight * grad
            squares[c] += weight * np.einsum("nd,nd->n", grad, grad)
            if w_hat is not None:
                w_sum += weight * w_hat.numpy()
    return {c: (sums[c], squares[c], w_sum if c == "corrected" else None)
            for c in corrections}


def _per_query_measures(mean, square, w_mean, g_star, p_positive,
                        num_draws: Optional[int]) -> dict:
    """Per query: relative bias (its Monte Carlo noise removed when ``num_draws`` is
    given), relative variance, cosine to ``g*`` and, with ``w_mean``, the weight's bias."""
    norm_star = np.maximum(np.linalg.norm(g_star, axis=1), 1e-300)
    variance = np.maximum(square - np.einsum("nd,nd->n", mean, mean), 0.0)
    error = np.sum((mean - g_star) ** 2, axis=1)
    if num_draws is not None:  # remove the Monte Carlo noise of the mean
        error = np.maximum(error - variance / num_draws, 0.0)
    cosine = np.einsum("nd,nd->n", mean, g_star) / np.maximum(
        np.linalg.norm(mean, axis=1) * norm_star, 1e-300)
    return dict(bias=np.sqrt(error) / norm_star, variance=variance / norm_star ** 2,
                cosine=cosine, w_bias=None if w_mean is None else w_mean - (1.0 - p_positive))


def _row(sampler: str, k: int, correction: str, measures: dict, decile) -> dict:
    """One row of ``diagnose``: the measures averaged over the queries, overall and by the
    positive's popularity decile."""
    row = {"sampler": sampler, "k": k, "correction": correction, **_summary(**measures),
           "by_decile": []}
    for d in range(10):
        sel = decile == d
        if sel.any():
            row["by_decile"].append({
                "decile": d, "num_queries": int(sel.sum()),
                **_summary(**{name: None if v is None else v[sel]
                              for name, v in measures.items()})})
    return row


QUANTILES = (10, 50, 90)


def positive_regime(p_positive, positives, unigram, samplers: Sequence[str],
                    num_negatives: Sequence[int]) -> dict:
    """Where this model sits: how much of the standard logQ loss's denominator the
    positive holds, the quantity that decides whether the corrected loss can differ.

    At the model, each of ``k`` negatives drawn from a proposal ``Q`` adds on average
    ``E_Q[e^{s_d} / Q(d)] = Z`` to the standard loss's denominator and the positive adds
    ``e^{s_p} / Q(p)``, so the positive's share is about ``(P/Q) / (P/Q + k)`` with
    ``P = P(p|u)`` the model's full-softmax probability
    (`tfrs_logq.proposal.standard_positive_share`). Where it is small, ``w = 1 - P`` is
    about 1 and the two losses nearly coincide (research/study.md maps the share to the
    measured gap). ``Q(p)`` is each sampler's proposal of the positive (the mixture's
    for ``"mixed"``, the unigram for ``"mixed-unigram"``).

    Returns ``{"p_positive": {q10, q50, q90}, "samplers": [{"sampler", "p_over_q":
    {q10, q50, q90}, "median_share": {k: share}}]}`` (quantiles over the queries).
    """
    p_positive = np.asarray(p_positive, np.float64)
    out = {"p_positive": _quantiles(p_positive), "samplers": []}
    for sampler in samplers:
        # Q(p) does not depend on k for in-batch and uniform draws; for mixed ones the
        # uniform share a = (k // 2) / k does, so P/Q is taken at each k (its quantiles
        # are reported at the first k).
        ratios = {int(k): p_positive / np.exp(Proposal(sampler, int(k), unigram).log_q()[positives])
                  for k in num_negatives}
        out["samplers"].append({
            "sampler": sampler, "p_over_q": _quantiles(ratios[int(num_negatives[0])]),
            "median_share": {k: float(np.median(standard_positive_share(r, k)))
                             for k, r in ratios.items()}})
    return out


def _quantiles(values) -> dict:
    return {f"q{q}": float(np.percentile(values, q)) for q in QUANTILES}


def _summary(bias, variance, cosine, w_bias) -> dict:
    out = {"bias": float(np.mean(bias)), "variance": float(np.mean(variance)),
           "cosine": float(np.mean(cosine))}
    if w_bias is not None:
        out["w_bias"] = float(np.mean(w_bias))
    return out


def format_table(result: dict) -> str:
    """Markdown table of the overall rows."""
    lines = ["| sampler | k | correction | rel. bias | rel. variance | cosine | E[w]-w |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        w = f"{r['w_bias']:+.4f}" if "w_bias" in r else "-"
        lines.append(f"| {r['sampler']} | {r['k']} | {r['correction']} | {r['bias']:.4f} | "
                     f"{r['variance']:.4f} | {r['cosine']:.4f} | {w} |")
    if result.get("regime"):
        lines += [""] + format_regime(result["regime"])
    samplers = [s for s in SAMPLERS if any(r["sampler"] == s for r in result["rows"])]
    if any(s.startswith("mixed") for s in samplers):
        lines.append("")
        lines += [f"- {s}: negatives corrected with {SAMPLER_PROPOSALS[s]}" for s in samplers]
    return "\n".join(lines)


def format_regime(regime: dict) -> list[str]:
    """The model's regime (`positive_regime`) as markdown lines."""
    p = regime["p_positive"]
    lines = ["Regime at this model: P(p|u) 10/50/90 % "
             + " / ".join(f"{p[f'q{q}']:.3g}" for q in QUANTILES)
             + "; the positive's median share of the standard loss's denominator, "
               "(P/Q) / (P/Q + k):", "",
             "| sampler | P/Q 10/50/90 % | " + " | ".join(
                 f"share at k = {k}" for k in regime["samplers"][0]["median_share"]) + " |",
             "|---|---|" + "---|" * len(regime["samplers"][0]["median_share"])]
    for entry in regime["samplers"]:
        r = entry["p_over_q"]
        lines.append(f"| {entry['sampler']} | "
                     + " / ".join(f"{r[f'q{q}']:.3g}" for q in QUANTILES) + " | "
                     + " | ".join(f"{v:.3f}" for v in entry["median_share"].values()) + " |")
    return lines


def plot(result: dict, path: str) -> None:
    """PNG: bias against k per correction (one panel per sampler) and bias by decile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    samplers = sorted({r["sampler"] for r in rows}, key=SAMPLERS.index)
    fig, axes = plt.subplots(1, len(samplers) + 1, figsize=(4.5 * (len(samplers) + 1), 3.6))
    axes = np.atleast_1d(axes)
    corrections = [c for c in CORRECTIONS if any(r["correction"] == c for r in rows)]
    for ax, sampler in zip(axes, samplers):
        for c in corrections:
            sel = sorted((r for r in rows if r["sampler"] == sampler and r["correction"] == c),
                         key=lambda r: r["k"])
            ax.plot([r["k"] for r in sel], [r["bias"] for r in sel], marker="o", label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("negatives k")
        ax.set_ylabel("||E[g] - g*|| / ||g*||")
        ax.set_title(sampler)
        ax.legend()
    ax = axes[-1]
    largest = max(r["k"] for r in rows)
    for c in corrections:
        sel = [r for r in rows if r["k"] == largest and r["correction"] == c
               and r["sampler"] == samplers[0]]
        if sel:
            deciles = sel[0]["by_decile"]
            ax.plot([d["decile"] for d in deciles], [d["bias"] for d in deciles], marker="o",
                    label=c)
    ax.set_yscale("log")
    ax.set_xlabel("positive's popularity decile (0 = most popular)")
    ax.set_title(f"{samplers[0]}, k = {largest}")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)  # whole or not at all (tfrs_logq._util.atomic)
    plt.close(fig)


def synthetic_inputs(num_items: int, num_queries: int, seed: int = 0,
                     **stream_options) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The synthetic stream's ground truth as a dot-product model.

    ``log P(d | u) = log P(c(d) | u) + log pop(d) - log Z_c(d)`` is ``u . v_d`` with
    ``u = [log P(. | u), 1]`` and ``v_d = [onehot(c(d)), log pop(d) - log Z_c(d)]``.
    Queries are the first ``num_queries`` users, positives drawn from ``P(. | u)``,
    the unigram is the stream's exact item marginal.

    Returns ``(queries, items, positives, unigram)`` with item rows ``d - 1``.
    """
    from tfrs_logq.pipelines.synthetic import SyntheticStream

    stream = SyntheticStream(num_items=num_items, seed=seed, **stream_options)
    cfg = stream.config
    topics = np.arange(num_items) % cfg.num_topics
    items = np.zeros((num_items, cfg.num_topics + 1), np.float32)
    items[np.arange(num_items), topics] = 1.0
    items[:, -1] = stream._log_pop - stream.log_topic_norm[topics]
    users = np.arange(num_queries)
    log_pc = stream.user_topic_log_probs(users).numpy()
    queries = np.concatenate([log_pc, np.ones((num_queries, 1))], axis=1).astype(np.float32)
    rng = np.random.default_rng(seed)
    # Positive: a topic from P(c | u), then an item from the topic by popularity.
    positives = np.empty(num_queries, np.int64)
    within = np.exp(items[:, -1].astype(np.float64))
    for i in range(num_queries):
        c = rng.choice(cfg.num_topics, p=np.exp(log_pc[i]) / np.exp(log_pc[i]).sum())
        members = np.flatnonzero(topics == c)
        p = within[members] / within[members].sum()
        positives[i] = members[rng.choice(len(members), p=p)]
    unigram = np.exp(stream.item_log_marginal(num_users_sample=4096)[1:])
    return queries, items, positives, unigram


def model_dir_inputs(model_dir: str, num_queries: int, part: str = "test", seed: int = 0,
                     data_dir: Optional[str] = None):
    """Queries (last query of each history), item table, positives and training
    frequencies of a `tfrs-logq train` run; item rows are internal ids - 1."""
    from tfrs_logq.pipelines.sequential import evaluation_arrays
    from tfrs_logq.sasrec.trained import load_run_split, load_trained
    from tfrs_logq.towers.run import is_two_tower_run

    if is_two_tower_run(model_dir):
        raise ValueError(f"--model-dir {model_dir} holds a two-tower run; diagnose reads "
                         "SASRec runs (`tfrs-logq train`, or `train sasrec`).")
    encoder, config, _ = load_trained(model_dir)
    split = load_run_split(model_dir, data_dir)  # its ExampleGen artifact's, or its dataset's
    chosen = getattr(split, part)
    idx = np.arange(len(chosen))
    if len(idx) > num_queries:
        idx = np.sort(np.random.default_rng(seed).choice(len(idx), num_queries, replace=False))
    arrays = evaluation_arrays(split, chosen, config["max_length"], exclude_seen=False)
    queries = encoder.last_query(arrays["history"][idx], training=False).numpy()
    items = encoder.item_embeddings().numpy()[1:]
    counts = split.train_item_counts()[1:].astype(np.float64)
    return queries, items, arrays["targets"][idx] - 1, np.maximum(counts, 1e-12)


__all__ = ["SAMPLERS", "SAMPLER_PROPOSALS", "Proposal", "diagnose", "format_table",
           "full_softmax_gradient", "model_dir_inputs", "plot", "synthetic_inputs"]
