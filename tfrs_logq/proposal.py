"""The proposal ``Q``: ``log Q``, ``log Q'`` (positive excluded), inclusion and mixture.

One home for the quantities every sampled loss of this library is corrected with
(Khrylchenko et al., RecSys 2025, Section 3). ``Q(d)`` is the *per-draw* proposal:
the probability that one draw of the sampler returns ``d`` (for in-batch negatives,
the item's share of all interactions, ``#d / N``). The corrected loss draws its
negatives from the proposal with the positive ``p`` excluded,

    Q'(d) = Q(d) / (1 - Q(p)),        log Q'(d) = log Q(d) - log(1 - Q(p)).

Example: ``Q(d) = 0.1`` and ``Q(p) = 0.5`` give ``Q'(d) = 0.2``.

Clipping policy (the only one; every caller goes through these functions):

- ``Q(d)`` given as a probability is clipped to ``[MIN_PROBABILITY, 1]`` before
  the log (TFRS clips at 1e-6 too); a ``log Q`` given by the caller is used as is.
- A probability that enters ``log(1 - q)`` is capped at ``1 - COMPLEMENT_EPSILON``
  (``log(1 - Q(p))`` in ``log Q'``, ``log(1 - Q(d))`` in the inclusion probability),
  so the logs stay finite when a catalog has a single item or a caller passes
  ``Q = 1``. Below the cap the functions are exact.
- From training *counts* (`unigram_log_tables`) the same cap is expressed in counts:
  the remaining count ``N - #p`` is floored at one interaction, and every count at 1
  (``#d = 0`` would give ``log Q = -inf``).

Functions take TensorFlow tensors; `mixture_probability` is plain arithmetic and
also takes numpy arrays. `proposal_log_q_table` gives a trainer's whole `[V + 1]` table of
a proposal (unigram, mixture or inclusion) from the unigram one, in float64 numpy.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Floor of a per-draw probability before its log (as TFRS's Retrieval).
MIN_PROBABILITY = 1e-6
# A probability q in log(1 - q) is capped at 1 - COMPLEMENT_EPSILON.
COMPLEMENT_EPSILON = 1e-6
# How far above 0 a log Q (above 1 a Q) may be from rounding before it is refused.
Q_TOLERANCE = 1e-5


def log_q_from_probability(probability, min_probability: float = MIN_PROBABILITY) -> tf.Tensor:
    """``log Q`` of a per-draw probability, clipped to ``[min_probability, 1]`` first.

    >>> log_q_from_probability([0.5, 1e-9]).numpy().round(4)
    array([ -0.6931, -13.8155], dtype=float32)
    """
    q = tf.convert_to_tensor(probability)
    return tf.math.log(tf.clip_by_value(q, min_probability, 1.0))


def refuse_where(tensor, violation, message: str) -> tf.Tensor:
    """``tensor``, checked that ``violation`` (a bool tensor) is nowhere True.

    Where ``violation``'s value is known (eager, or a constant in a graph) a
    violation raises ``ValueError(message)`` at once; otherwise (in a
    `tf.function`) the returned tensor depends on a ``tf.debugging.Assert``, which
    raises ``InvalidArgumentError`` with ``message`` when it runs.
    """
    value = tf.get_static_value(violation)
    if value is not None:
        if np.any(value):
            raise ValueError(message)
        return tensor
    check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(violation)), [message])
    with tf.control_dependencies([check]):
        return tf.identity(tensor)


def check_log_q(log_q, name: str, is_valid=None) -> tf.Tensor:
    """``log_q``, refused where an entry is above 0 or NaN (``Q > 1`` or ``Q < 0``: not a
    per-draw probability). The one check of ``Q`` in the library, with one message.

    Entries where ``is_valid`` (bool, broadcast against ``log_q``) is False may
    hold anything (accidental hits, padding). Checked as `refuse_where` does: a
    one-line ``ValueError`` for known values, a ``tf.debugging`` assertion in a graph.
    A probability is checked through its unclipped log (`check_probability`).

    >>> check_log_q(tf.math.log([0.5, 2.0]), "log_q", is_valid=[True, False]).numpy().round(4)
    array([-0.6931,  0.6931], dtype=float32)
    """
    log_q = tf.convert_to_tensor(log_q)
    bad = tf.logical_or(log_q > tf.cast(Q_TOLERANCE, log_q.dtype), tf.math.is_nan(log_q))
    if is_valid is not None:
        bad = tf.logical_and(tf.convert_to_tensor(is_valid), bad)
    flags, values = tf.get_static_value(bad), tf.get_static_value(log_q)
    received = "received a value above 1"
    if flags is not None and values is not None and np.any(flags):
        worst = np.where(flags, values, -np.inf)
        if np.isnan(worst).any():
            received = "received a negative or NaN probability"
        else:
            largest = float(np.max(worst))
            received = f"received {largest:.4g} (Q = {np.exp(largest):.4g})"
    message = (f"`{name}` must hold per-draw proposal probabilities (0 <= Q <= 1, log Q <= "
               f"0), {received}: pass the probability that one draw returns the item "
               "(count / total), not its chance to appear in a batch.")
    return refuse_where(log_q, bad, message)


def check_probability(probability, name: str, min_probability: float = MIN_PROBABILITY
                      ) -> tf.Tensor:
    """``log Q`` of per-draw probabilities, checked by `check_log_q` on the unclipped log
    (so ``Q > 1`` and ``Q < 0`` are refused), then clipped as `log_q_from_probability`."""
    q = tf.convert_to_tensor(probability)
    checked = check_log_q(tf.math.log(q), name)
    with tf.control_dependencies([checked]):
        return log_q_from_probability(q, min_probability)


def log_complement(log_q) -> tf.Tensor:
    """``log(1 - Q)`` from ``log Q``, with ``Q`` capped at ``1 - COMPLEMENT_EPSILON``.

    >>> log_complement(tf.math.log(tf.constant([0.5, 1.0], tf.float64))).numpy().round(4)
    array([ -0.6931, -13.8155])

    (In float32, ``1 - 1e-6`` rounds to ``0.99999899``: ``Q = 1`` gives -13.8023.)
    """
    log_q = tf.convert_to_tensor(log_q)
    return tf.math.log1p(-tf.minimum(tf.exp(log_q), 1.0 - COMPLEMENT_EPSILON))


def excluded_log_q(negative_log_q, positive_log_q) -> tf.Tensor:
    """``log Q'(d) = log Q(d) - log(1 - Q(p))``: the proposal with the positive excluded.

    Args:
      negative_log_q: `[batch, n]` ``log Q(d_i)`` of each row's negatives.
      positive_log_q: `[batch]` ``log Q(p)`` of each row's positive.

    Returns:
      `[batch, n]` ``log Q'(d_i)``.

    >>> excluded_log_q(tf.math.log([[0.1, 0.2]]), tf.math.log([0.5])).numpy().round(4)
    array([[-1.6094, -0.9163]], dtype=float32)
    """
    return tf.convert_to_tensor(negative_log_q) - log_complement(positive_log_q)[:, None]


def inclusion_log_q(log_q, num_draws) -> tf.Tensor:
    """``log(1 - (1 - Q)^B)``: the log probability that ``B`` draws include ``d`` at least once.

    The proposal behind deduplicated in-batch negatives: a batch of ``B`` draws
    with ``Q = 0.01`` contains the item with probability ``1 - 0.99^B`` (0.634
    at ``B = 100``), not ``B * Q`` (1.0). ``Q`` is capped as in `log_complement`.

    >>> float(tf.exp(inclusion_log_q(tf.math.log([0.01]), 100))[0])  # doctest: +ELLIPSIS
    0.633...
    """
    log_q = tf.convert_to_tensor(log_q)
    num_draws = tf.cast(num_draws, log_q.dtype)
    return tf.math.log(-tf.math.expm1(num_draws * log_complement(log_q)))


def mixture_probability(unigram, uniform_fraction: float, num_items: int):
    """Per-slot proposal of mixed negatives: ``a / N + (1 - a) Q_unigram(d)``.

    ``a`` is the fraction of the negatives drawn uniformly from the ``N`` items.
    Plain arithmetic: takes numpy arrays or tensors of probabilities (not logs).

    >>> mixture_probability(np.array([0.5, 0.0]), 0.5, 4)
    array([0.375, 0.125])
    """
    a = uniform_fraction
    return a / num_items + (1.0 - a) * unigram


PROPOSAL_KINDS = ("unigram", "mixture", "inclusion")


def proposal_log_q_table(log_q_unigram, proposal: str, num_items: int = 0,
                         num_uniform: int = 0, num_in_batch: int = 0,
                         num_draws: int = 0) -> np.ndarray:
    """`[V + 1]` float64 ``log Q(d)`` of a proposal for every id, from the unigram table.

    - ``unigram``: ``log Q_unigram(d)``, the table as given;
    - ``mixture``: ``log(a / V + (1 - a) Q_unigram(d))`` (`mixture_probability`), with
      ``a = num_uniform / (num_uniform + num_in_batch)`` and ``V = num_items``;
    - ``inclusion``: ``log(1 - (1 - Q_unigram(d))^B)`` (`inclusion_log_q`), ``B = num_draws``
      (the batch size: deduplicated in-batch negatives).

    Args:
      log_q_unigram: `[V + 1]` float64 ``log Q_unigram`` by id (row 0, padding, may be
        ``-inf``).
      proposal: str. One of `PROPOSAL_KINDS`.
      num_items: int. ``V`` (``mixture``).
      num_uniform: int. Uniform negatives per step (``mixture``).
      num_in_batch: int. In-batch negatives per step (``mixture``).
      num_draws: int. Draws per batch (``inclusion``).

    >>> table = np.log([0.5, 0.25, 0.25])
    >>> np.exp(proposal_log_q_table(table, "mixture", 2, 1, 1)).round(4)
    array([0.5  , 0.375, 0.375])
    >>> np.exp(proposal_log_q_table(table, "inclusion", num_draws=2)).round(4)
    array([0.75  , 0.4375, 0.4375])
    """
    log_q_unigram = np.asarray(log_q_unigram, np.float64)
    if proposal == "unigram":
        return log_q_unigram
    if proposal == "mixture":
        k = num_in_batch + num_uniform
        with np.errstate(divide="ignore"):
            return np.log(mixture_probability(np.exp(log_q_unigram), num_uniform / k,
                                              num_items))
    if proposal == "inclusion":
        return inclusion_log_q(tf.constant(log_q_unigram), num_draws).numpy()
    raise ValueError(f"`proposal` must be one of {', '.join(PROPOSAL_KINDS)}, received "
                     f"{str(proposal)[:40]!r}.")


def standard_positive_share(p_over_q, num_negatives: int):
    """The positive's share of the standard logQ loss's denominator at the truth.

    With scores equal to the true ``log P(d|u)`` (up to a constant per user), the
    positive's corrected term is ``P(p|u) / Q(p)`` and each of ``n`` negatives drawn
    from ``Q`` adds ``P(d|u) / Q(d)``, whose mean under ``Q`` is 1: the share is about
    ``(P/Q) / (P/Q + n)``. Where it is small, ``w = 1 - P`` is about 1 and the
    positive's term is negligible: standard and corrected logQ nearly coincide.

    >>> standard_positive_share(np.array([1.0, 1023.0]), 1023).round(4)
    array([0.001, 0.5  ])
    """
    ratio = np.asarray(p_over_q, np.float64)
    return ratio / (ratio + num_negatives)


def unigram_log_tables(counts) -> tuple[np.ndarray, float, np.ndarray]:
    """Per-item tables of the unigram proposal from training counts, in float64.

    ``log Q(d) = log #d - log N`` and ``log Q'(d) = log #d - log(N - #p)``: returns
    ``(log #d, log N, log(N - #d))`` with counts floored at 1 and ``N - #d`` floored
    at 1 (the clipping policy in counts). Index the third table by the positive.

    >>> log_counts, log_total, log_remaining = unigram_log_tables([3, 1])
    >>> np.exp(log_counts - log_remaining[1]).round(4)  # Q'(d) for positive 1
    array([1.    , 0.3333])
    """
    counts = np.asarray(counts, np.float64)
    clamped = np.maximum(counts, 1.0)
    total = float(counts.sum())
    return (np.log(clamped), float(np.log(max(total, 1.0))),
            np.log(np.maximum(total - clamped, 1.0)))


__all__ = [
    "COMPLEMENT_EPSILON",
    "check_probability",
    "MIN_PROBABILITY",
    "Q_TOLERANCE",
    "check_log_q",
    "excluded_log_q",
    "inclusion_log_q",
    "log_complement",
    "log_q_from_probability",
    "mixture_probability",
    "PROPOSAL_KINDS",
    "proposal_log_q_table",
    "refuse_where",
    "standard_positive_share",
    "unigram_log_tables",
]
