"""`CorrectedRetrieval`: a drop-in `tfrs.tasks.Retrieval` with the corrected logQ loss.

`CorrectedRetrieval.call` is a short pipeline of named steps, each tested on its own: the
scores and the reduction defined here below the task, the masks in `tfrs_logq.masks`, the
global pool in `tfrs_logq.cross_replica`:

    scores = candidate_scores(queries, candidates, temperature)
    positives = positive_scores(queries, candidates, temperature)  # its diagonal, cheaply
    ids = coded_candidate_ids(candidate_ids)                 # strings -> int codes
    # cross_replica_negatives=True, several replicas: the global pool instead
    pool = cross_replica_candidates(num_queries, candidates, ids, log_q)
    is_negative, num_negatives = negative_mask(ids, ...)     # True = counts as a negative
    log_q = proposal_log_q(probability, log_probability)     # checked: Q <= 1
    per_example = losses.in_batch_softmax_loss(scores, positive_logits=positives, ...)
    loss = reduce_loss(per_example, reduction, sample_weight)

One mask convention throughout: ``is_negative[i, j]`` is True when candidate
``j`` counts as a negative of query ``i``. The positive (column ``i`` of row
``i``) never does, whatever the mask says.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Optional, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs

from tfrs_logq._tfrs_index import metric_ids
from tfrs_logq.cross_replica import (
    cross_replica_candidates,
    global_candidate_ids,
    replicas_in_sync,
)
from tfrs_logq.losses import (
    check_correction,
    compute_dtype_for,
    hard_negative_softmax_loss,
    in_batch_softmax_loss,
    masked_value,
)
from tfrs_logq.masks import coded_candidate_ids, first_occurrence_in_order, negative_mask
from tfrs_logq.proposal import (
    MIN_PROBABILITY,
    check_log_q,
    check_probability,
    inclusion_log_q,
)

REDUCTIONS = ("sum", "sum_over_batch_size", "none")


SAMPLING_PROBABILITIES = ("per_draw", "inclusion", "per_draw_to_inclusion")


class CorrectedRetrieval(tfrs.tasks.Retrieval):
    """Retrieval task with no, standard (two forms), or corrected logQ correction.

    Same call signature and in-batch semantics as `tfrs.tasks.Retrieval`: row
    ``i`` of ``query_embeddings`` has candidate ``i`` as its positive; every
    other candidate is a negative for that row, and candidates beyond the number
    of queries are extra negatives shared by all rows (e.g. uniform negatives for
    mixed negative sampling).

    With ``correction="corrected"`` (Khrylchenko et al., RecSys 2025) each row's loss is
    the corrected loss written out in `tfrs_logq.losses` (the formulas of every form
    live there): the positive is out of the denominator, the negatives are corrected
    with ``log Q'(d) = log Q(d) - log(1 - Q(p))`` (`tfrs_logq.proposal`), the row is
    weighted by ``w = stop_gradient(1 - P(p|u))``, and accidental hits (candidates
    with the positive's id) are always masked, so ``candidate_ids`` is required
    (integers or strings).
    Example: ``s_p = 2``, two negatives with ``s = 0, 1`` and ``Q(d) = 0.1, 0.2``,
    ``Q(p) = 0.5``: ``log Q' = log 0.2, log 0.4``, the sum is
    ``e^0/0.2 + e^1/0.4 = 11.80``, ``P = e^2 / (e^2 + 11.80/2) = 0.556``,
    loss ``= 0.444 * (log 11.80 - 2) = 0.208``. One query whose positive is
    candidate 0 and two extra candidates as its negatives:

    >>> task = CorrectedRetrieval()
    >>> loss = task(
    ...     query_embeddings=tf.constant([[1.0]]),
    ...     candidate_embeddings=tf.constant([[2.0], [0.0], [1.0]]),  # s = 2, 0, 1
    ...     candidate_sampling_probability=tf.constant([0.5, 0.1, 0.2]),
    ...     candidate_ids=tf.constant([7, 3, 5]))
    >>> round(float(loss), 3)
    0.208

    ``Q`` is a per-draw probability by default (see `proposal_log_q`); values above
    1 are rejected. With ``deduplicate_candidates=True`` the paper's convention keeps
    the per-draw ``Q`` as given; ``sampling_probability="per_draw_to_inclusion"``
    replaces it by the exact probability that the ``num_queries`` in-batch draws
    include the candidate, ``1 - (1 - Q)^B`` (meant for pure in-batch negatives; for
    extra candidates from another sampler pass their log probability yourself).

    ``correction="none"`` and ``"logq-tfrs"`` reproduce stock TFRS (``Retrieval``
    without / with ``candidate_sampling_probability``) to the last bit of the
    formula, including the constant ``log Q(p)`` TFRS subtracts in the numerator.
    ``"logq-official"`` is standard logQ as the paper's official code computes it: the
    negatives corrected, the positive's logit not (numerator and denominator).

    The constructor is TFRS's (``loss``, ``metrics``, ... ``name``, positionally too) with
    this task's options after them, by keyword only.

    Args:
      loss: a Keras loss, as in TFRS: it replaces the cross-entropy over TFRS's logits
        (``correction="none"`` or ``"logq-tfrs"`` only; the other forms are losses of
        their own). Defaults to None: this task's loss, equal to TFRS's default.
      metrics: factorized top-k metrics, as in TFRS. A metric whose index was built
        from embeddings alone gets no ids (it matches by score, as in stock TFRS); one
        whose index has identifiers gets the positives' ids (`metric_ids`).
      batch_metrics: in-batch metrics, as in TFRS.
      loss_metrics: metrics fed the loss, as in TFRS.
      temperature: float. Logits are divided by it. Defaults to None.
      num_hard_negatives: int. Keep only the ``num_hard_negatives`` negatives
        with the largest corrected logits in each row. Defaults to None.
      remove_accidental_hits: bool. Mask accidental hits for ``"none"`` and the
        standard forms (always on for ``"corrected"``). Defaults to False.
      name: str. Task name.
      correction: str. ``"none"``, ``"logq-tfrs"`` (TFRS's standard logQ: the positive's
        logit corrected too), ``"logq-official"`` (the paper's code: the positive
        uncorrected) or ``"corrected"`` (`tfrs_logq.corrections`; a bare ``"logq"`` is
        refused). Stock ``Retrieval`` called with ``candidate_sampling_probability`` is
        ``"logq-tfrs"``, without it ``"none"``. Defaults to ``"corrected"``.
      deduplicate_candidates: bool. When True a candidate id that occurs more
        than once counts once as a negative (needs ``candidate_ids``).
        Defaults to False.
      reduction: str. ``"sum"`` (TFRS's behaviour), ``"sum_over_batch_size"``
        (divided by the global batch size) or ``"none"`` (per-example
        `[batch]` losses). Defaults to ``"sum"``.
      min_sampling_probability: float. ``candidate_sampling_probability`` is
        clipped to ``[min_sampling_probability, 1]`` before the log, as TFRS
        does with 1e-6. Lower it for catalogs with rarer items, or pass
        ``candidate_log_sampling_probability``. Defaults to 1e-6.
      sampling_probability: str. What the candidates' probabilities are
        (`SAMPLING_PROBABILITIES`): ``"per_draw"`` (default: ``Q(d)`` of one draw);
        ``"inclusion"``: ``pi(d)``, the chance ``d`` is among the row's candidates
        (your own deduplicated draws); ``"per_draw_to_inclusion"``: per-draw ``Q``
        that the task turns into ``pi = 1 - (1 - Q)^B`` (only with
        ``deduplicate_candidates``). With inclusion probabilities ``"corrected"``
        weights with the Horvitz-Thompson ``P(p|u)``
        (`tfrs_logq.losses.corrected_weight`); for extra per-draw negatives pass ``k Q``.
      metrics_by_id: bool. Whether factorized metrics match the positives by id. None
        (default): when their index has identifiers (`metric_ids`), so that ids passed
        for the loss never break an index of embeddings alone; False: never (score
        matching, as stock TFRS called without ``candidate_ids``); True: always.
      cross_replica_negatives: bool. Under a `tf.distribute` strategy with more than one
        replica in sync (`MirroredStrategy`, `MultiWorkerMirroredStrategy`), score each
        replica's queries against every replica's candidates (`cross_replica_candidates`,
        `ReplicaContext.all_gather`): a global batch of ``B`` split over ``R`` replicas
        gives each query ``B - 1`` in-batch negatives, not ``B / R - 1``, and ``Q'``, the
        weight ``1 - P`` and the accidental hits are those of the global pool; each
        replica's loss is then exactly its rows of the one-device loss on the concatenated
        global batch, and the replicas' summed gradients are that batch's. String ids are
        compared by their 64-bit fingerprint; ``score_mask`` is refused (a mask of one
        replica's candidates cannot say which of the others' to drop). Factorized metrics
        are unchanged;
        batch metrics see the global pool. Not on TPUs (replicas' batches of different
        sizes). Defaults to False (TFRS's behaviour: each replica's own negatives).
    """

    def __init__(
        self,
        loss: Optional[tf.keras.losses.Loss] = None,
        metrics: Optional[Sequence[tfrs.metrics.Factorized] | tfrs.metrics.Factorized] = None,
        batch_metrics: Optional[list[tf.keras.metrics.Metric]] = None,
        loss_metrics: Optional[list[tf.keras.metrics.Metric]] = None,
        temperature: Optional[float] = None,
        num_hard_negatives: Optional[int] = None,
        remove_accidental_hits: bool = False,
        name: Optional[str] = None,
        *,
        correction: str = "corrected",
        deduplicate_candidates: bool = False,
        reduction: str = "sum",
        min_sampling_probability: float = 1e-6,
        sampling_probability: str = "per_draw",
        metrics_by_id: Optional[bool] = None,
        cross_replica_negatives: bool = False,
    ) -> None:
        if isinstance(loss, str):
            raise TypeError(
                f"CorrectedRetrieval's first argument is TFRS's `loss` (a Keras loss), received "
                f"the string {loss!r}: pass the correction by name, "
                f"CorrectedRetrieval(correction={loss!r})."
            )
        if loss is not None:
            if correction not in ("none", "logq-tfrs"):
                raise ValueError(
                    f"`loss` replaces TFRS's cross-entropy and works with correction='none' or "
                    f"'logq-tfrs' only (the forms TFRS computes); received correction="
                    f"{correction!r}, whose loss is its own: drop `loss`."
                )
            if reduction != "sum":
                raise ValueError(
                    "`loss` reduces with its own reduction: leave `reduction` at 'sum' "
                    f"(received {reduction!r})."
                )
        check_correction(correction)
        if reduction not in REDUCTIONS:
            raise ValueError(f"`reduction` must be one of {REDUCTIONS}, received {reduction!r}.")
        if temperature is not None and not temperature > 0:
            raise ValueError(f"`temperature` must be positive, received {temperature!r}.")
        if num_hard_negatives is not None and int(num_hard_negatives) < 1:
            raise ValueError(
                f"`num_hard_negatives` must be a positive int, received {num_hard_negatives!r}."
            )
        if not 0 < min_sampling_probability <= 1:
            raise ValueError(
                "`min_sampling_probability` must be in (0, 1], "
                f"received {min_sampling_probability!r}."
            )
        if sampling_probability not in SAMPLING_PROBABILITIES:
            raise ValueError(f"`sampling_probability` must be one of "
                             f"{SAMPLING_PROBABILITIES}, received {sampling_probability!r}.")
        if sampling_probability == "per_draw_to_inclusion" and not deduplicate_candidates:
            raise ValueError("sampling_probability='per_draw_to_inclusion' is the chance a "
                             "deduplicated batch holds the candidate: pass "
                             "deduplicate_candidates=True.")
        super().__init__(
            loss=loss,
            metrics=metrics,
            batch_metrics=batch_metrics,
            loss_metrics=loss_metrics,
            temperature=temperature,
            num_hard_negatives=num_hard_negatives,
            remove_accidental_hits=remove_accidental_hits,
            name=name,
        )
        # Keep the embeddings' dtype: scores are computed in it (fast half-precision
        # matmuls under mixed precision) and the loss in float32.
        self._autocast = False
        self._correction = correction
        self._deduplicate_candidates = bool(deduplicate_candidates)
        self._reduction = reduction
        self._min_sampling_probability = float(min_sampling_probability)
        self._sampling_probability = sampling_probability
        self._custom_loss = loss is not None
        # TFRS's own forms, reduced as TFRS reduces them, run TFRS's computation: the same
        # ops in the same order, so that weights trained through `model.fit` equal stock
        # TFRS's to the bit (a score-based top-1 metric turns any last-bit difference of
        # the towers into a different hit).
        self._stock_form = self._custom_loss or (
            correction in ("none", "logq-tfrs") and reduction == "sum"
            and not deduplicate_candidates and sampling_probability == "per_draw")
        if metrics_by_id not in (None, True, False):
            raise ValueError(f"`metrics_by_id` must be None, True or False, received "
                             f"{metrics_by_id!r}.")
        self._metrics_by_id = metrics_by_id
        if cross_replica_negatives not in (True, False):
            raise ValueError(f"`cross_replica_negatives` must be True or False, received "
                             f"{cross_replica_negatives!r}.")
        self._cross_replica_negatives = bool(cross_replica_negatives)
        self._warned_probability_ignored = False
        self._warned_one_replica = False

    @property
    def correction(self) -> str:
        return self._correction

    @property
    def proposal(self) -> str:
        """What ``log Q`` holds when the loss reads it (`tfrs_logq.losses.PROPOSALS`)."""
        return "per_draw" if self._sampling_probability == "per_draw" else "inclusion"

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(
            correction=self._correction,
            deduplicate_candidates=self._deduplicate_candidates,
            reduction=self._reduction,
            temperature=self._temperature,
            num_hard_negatives=self._num_hard_negatives,
            remove_accidental_hits=self._remove_accidental_hits,
            min_sampling_probability=self._min_sampling_probability,
            sampling_probability=self._sampling_probability,
            metrics_by_id=self._metrics_by_id,
            cross_replica_negatives=self._cross_replica_negatives,
        )
        config.pop("trainable", None)
        config.pop("dtype", None)
        return config

    def __call__(self, *args, **kwargs):
        # Checked before Keras' Layer.__call__, which would wrap the one-line error in a
        # dump of every argument.
        call_kwargs = {k: v for k, v in kwargs.items() if k not in ("training", "mask")}
        bound = inspect.signature(self.call).bind_partial(*args, **call_kwargs).arguments
        self._check_inputs(bound.get("candidate_ids"),
                           bound.get("candidate_sampling_probability"),
                           bound.get("candidate_log_sampling_probability"))
        if self._correction != "none":  # known values: Q checked here too
            for key, check in (("candidate_sampling_probability", check_probability),
                               ("candidate_log_sampling_probability", check_log_q)):
                value = bound.get(key)
                if value is not None and tf.get_static_value(value) is not None:
                    check(tf.convert_to_tensor(value), key)
        return super().__call__(*args, **kwargs)

    def call(
        self,
        query_embeddings: tf.Tensor,
        candidate_embeddings: tf.Tensor,
        sample_weight: Optional[tf.Tensor] = None,
        candidate_sampling_probability: Optional[tf.Tensor] = None,
        candidate_ids: Optional[tf.Tensor] = None,
        compute_metrics: bool = True,
        compute_batch_metrics: bool = True,
        score_mask: Optional[tf.Tensor] = None,
        candidate_log_sampling_probability: Optional[tf.Tensor] = None,
    ) -> tf.Tensor:
        """Computes the loss and updates the metrics.

        Args:
          query_embeddings: `[num_queries, dim]` (or `[num_queries, heads, dim]`
            for max-sim scoring, as in TFRS).
          candidate_embeddings: `[num_candidates, dim]`, ``num_candidates >=
            num_queries``; the first ``num_queries`` are the positives.
          sample_weight: `[num_queries]` per-example weights.
          candidate_sampling_probability: `[num_candidates]` per-draw ``Q(d)``
            of each candidate under the proposal the negatives came from.
          candidate_ids: `[num_candidates]` ids (integers or strings), for
            accidental hits, deduplication and id-based factorized metrics.
          compute_metrics: update factorized metrics.
          compute_batch_metrics: update batch metrics.
          score_mask: `[num_queries, num_candidates]` bool, True where the
            candidate may count as a negative of the row (False drops it; the
            positive is unaffected).
          candidate_log_sampling_probability: `[num_candidates]` ``log Q(d)``,
            an alternative to ``candidate_sampling_probability`` that is not
            clipped.

        Returns:
          The reduced loss (scalar), or `[num_queries]` with ``reduction="none"``.
        """
        self._check_inputs(candidate_ids, candidate_sampling_probability,
                           candidate_log_sampling_probability)
        num_local_candidates = candidate_embeddings.shape[0]
        query_embeddings = tf.convert_to_tensor(query_embeddings)
        candidate_embeddings = tf.convert_to_tensor(candidate_embeddings)
        dtype = (tf.float32 if query_embeddings.dtype != candidate_embeddings.dtype
                 else compute_dtype_for(query_embeddings))  # candidate_scores' dtype
        log_q = None
        if self._correction != "none":
            log_q = proposal_log_q(
                candidate_sampling_probability,
                candidate_log_sampling_probability,
                num_candidates=num_local_candidates,
                min_probability=self._min_sampling_probability,
                dtype=dtype,
                correction=self._correction,
            )
        ids = None
        metric_candidates = candidate_embeddings
        num_draws = tf.shape(query_embeddings)[0]
        first_occurrence = None
        gathered = self._gathers_replicas()
        if gathered:
            if score_mask is not None:
                raise ValueError(
                    "`score_mask` with cross_replica_negatives=True: a mask of this replica's "
                    "candidates says nothing of the other replicas' (their rows' positives, "
                    "their copies of shared negatives); pass shared negatives as candidates "
                    "without a mask, or cross_replica_negatives=False.")
            keys = None
            if candidate_ids is not None:
                coded_candidate_ids(candidate_ids, num_local_candidates)  # shape checked
                keys = global_candidate_ids(candidate_ids)
            num_local_queries = tf.shape(query_embeddings)[0]
            if (num_local_candidates is not None and query_embeddings.shape[0] is not None
                    and num_local_candidates < query_embeddings.shape[0]):
                candidate_scores(query_embeddings, candidate_embeddings)  # its one-line error
            candidate_embeddings, (ids, log_q), score_mask, order, num_draws = (
                cross_replica_candidates(num_local_queries, candidate_embeddings, keys, log_q,
                                         score_mask=score_mask))
            if ids is not None and self._deduplicate_candidates:
                first_occurrence = first_occurrence_in_order(ids, order)
        elif candidate_ids is not None:
            ids = coded_candidate_ids(candidate_ids, num_local_candidates)
        scores = candidate_scores(query_embeddings, candidate_embeddings, self._temperature)
        dtype = scores.dtype
        num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
        if log_q is not None and self._sampling_probability == "per_draw_to_inclusion":
            log_q = inclusion_log_q(log_q, num_draws)

        remove_hits = self._correction == "corrected" or self._remove_accidental_hits
        is_negative, num_negatives = negative_mask(
            ids, num_queries, num_candidates,
            remove_accidental_hits=remove_hits,
            deduplicate=self._deduplicate_candidates,
            score_mask=score_mask,
            first_occurrence=first_occurrence,
        )

        batch_logits = None
        if self._stock_form:
            per_example = None
            loss, batch_logits = self._stock_form_loss(scores, log_q, is_negative,
                                                       sample_weight)
        elif self._num_hard_negatives is None:
            positives = positive_scores(query_embeddings, candidate_embeddings,
                                        self._temperature)
            per_example = in_batch_softmax_loss(
                scores, correction=self._correction, log_q=log_q,
                is_negative=is_negative, num_negatives=num_negatives,
                positive_logits=positives, positives_masked=remove_hits,
                proposal=self.proposal,
            )
        else:
            per_example = hard_negative_softmax_loss(
                scores, log_q, is_negative, self._num_hard_negatives, self._correction,
                self.proposal)
        if per_example is not None:
            loss = reduce_loss(per_example, self._reduction, sample_weight,
                               global_batch=num_draws if gathered else None)

        update_ops = self._update_metrics(
            loss, scores, log_q, is_negative, query_embeddings, metric_candidates,
            candidate_ids, sample_weight, compute_metrics, compute_batch_metrics,
            batch_logits,
        )
        with tf.control_dependencies([op for op in update_ops if op is not None]):
            return tf.identity(loss)

    def _gathers_replicas(self) -> bool:
        """Whether this call scores against every replica's candidates: the option is on and
        the call runs in a replica of a strategy with more than one in sync. With one, a
        warning (once): the option changes nothing there."""
        if not self._cross_replica_negatives:
            return False
        if replicas_in_sync() > 1:
            return True
        if not self._warned_one_replica:
            self._warned_one_replica = True
            warnings.warn(
                "cross_replica_negatives=True with one replica in sync: the negatives are this "
                "device's batch, as without it (it takes effect under a tf.distribute strategy "
                "with several replicas, inside strategy.run or model.fit).",
                UserWarning, stacklevel=4)
        return False

    def _check_inputs(self, candidate_ids, probability, log_probability) -> None:
        """One line naming every argument the correction needs and the call lacks."""
        has_q = probability is not None or log_probability is not None
        missing = []
        if candidate_ids is None and (self._correction == "corrected"
                                      or self._remove_accidental_hits
                                      or self._deduplicate_candidates):
            missing.append("`candidate_ids` (the candidates' ids, ints or strings: "
                           + ("'corrected' always masks accidental hits)"
                              if self._correction == "corrected"
                              else "accidental hit removal / deduplication is on)"))
        if self._correction != "none" and not has_q:
            missing.append("`candidate_sampling_probability` (Q(d) of each candidate, e.g. "
                           "tfrs_logq.ExactFrequency.from_dataset(item_ids).probability(ids))")
        if missing:
            stock = ("; for stock TFRS's loss without them, pass correction='none'"
                     if self._correction != "none" else "")
            raise ValueError(f"correction={self._correction!r} needs "
                             + " and ".join(missing) + stock + ".")
        if (self._correction == "none" and probability is not None
                and not self._warned_probability_ignored):
            self._warned_probability_ignored = True
            warnings.warn(
                "correction='none' ignores `candidate_sampling_probability`; stock TFRS applies "
                "its logQ correction when it is given: pass correction='logq-tfrs' for that.",
                UserWarning, stacklevel=3)

    def _stock_form_loss(self, scores, log_q, is_negative, sample_weight) -> tf.Tensor:
        """TFRS's computation (`tfrs.tasks.Retrieval.call`) with its loss or the user's:
        logits corrected by ``log Q`` for ``"logq-tfrs"`` (the positive's too), hits and
        ``score_mask`` masked, hard negatives mined, then ``loss(labels, logits)``.
        Returns the loss and ``(labels, logits)``, which TFRS hands its batch metrics."""
        labels, logits = stock_logits(scores, log_q, is_negative)
        if self._num_hard_negatives is not None:
            logits, labels = tfrs.layers.loss.HardNegativeMining(self._num_hard_negatives)(
                logits, labels)
        loss = self._loss(y_true=labels, y_pred=logits, sample_weight=sample_weight)
        return loss, (labels, logits)

    def _update_metrics(self, loss, scores, log_q, is_negative, query_embeddings,
                        candidate_embeddings, candidate_ids, sample_weight,
                        compute_metrics, compute_batch_metrics, batch_logits=None) -> list:
        update_ops = [metric.update_state(loss) for metric in self._loss_metrics]
        num_queries = tf.shape(scores)[0]
        query_embeddings = tf.convert_to_tensor(query_embeddings)
        if compute_metrics and query_embeddings.shape.rank == 2:
            positive_ids = None
            if candidate_ids is not None:
                positive_ids = tf.reshape(tf.convert_to_tensor(candidate_ids),
                                          [-1])[:num_queries]
            for metric in self._factorized_metrics:
                update_ops.append(
                    metric.update_state(
                        query_embeddings,
                        tf.convert_to_tensor(candidate_embeddings)[:num_queries],
                        true_candidate_ids=metric_ids(metric, positive_ids,
                                                      self._metrics_by_id),
                        sample_weight=sample_weight,
                    )
                )
        if compute_batch_metrics and self._batch_metrics and batch_logits is not None:
            labels, logits = batch_logits  # TFRS's: after hard-negative mining
            for metric in self._batch_metrics:
                update_ops.append(
                    metric.update_state(labels, logits, sample_weight=sample_weight))
        elif compute_batch_metrics and self._batch_metrics:
            labels, metric_scores = stock_logits(scores, log_q, is_negative)
            for metric in self._batch_metrics:
                update_ops.append(
                    metric.update_state(labels, metric_scores, sample_weight=sample_weight)
                )
        return update_ops


# ---------------------------------------------------------------- the steps of `call`

def stock_logits(scores: tf.Tensor, log_q: Optional[tf.Tensor],
                 is_negative: Optional[tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """``(labels, logits)`` as `tfrs.tasks.Retrieval.call` builds them: ``labels`` the
    `[num_queries, num_candidates]` identity, ``logits`` the scores less ``log Q`` (the
    positive's too, TFRS's logQ), the entries that are neither a negative nor the positive
    (hits, ``score_mask``) masked. What the stock-form losses and the batch metrics read."""
    num_queries, num_candidates = tf.shape(scores)[0], tf.shape(scores)[1]
    labels = tf.eye(num_queries, num_candidates, dtype=scores.dtype)
    logits = scores if log_q is None else scores - log_q[None, :]
    if is_negative is not None:
        keep = tf.logical_or(is_negative, tf.cast(labels, tf.bool))
        logits = tf.where(keep, logits, masked_value(scores.dtype))
    return labels, logits


def candidate_scores(query_embeddings, candidate_embeddings, temperature=None) -> tf.Tensor:
    """`[num_queries, num_candidates]` scores in float32 (float64 for float64 inputs).

    The matmul runs in the embeddings' dtype (fast under mixed precision), the
    result is cast up. Rank-3 queries `[num_queries, heads, dim]` are scored by
    their best head (max-sim, as TFRS does). ``temperature`` divides the scores.
    """
    query_embeddings = tf.convert_to_tensor(query_embeddings)
    candidate_embeddings = tf.convert_to_tensor(candidate_embeddings)
    if query_embeddings.dtype != candidate_embeddings.dtype:
        query_embeddings = tf.cast(query_embeddings, tf.float32)
        candidate_embeddings = tf.cast(candidate_embeddings, tf.float32)
    if query_embeddings.shape.rank == 3:
        scores = tf.reduce_max(
            tf.einsum("qne,ce->qnc", query_embeddings, candidate_embeddings), axis=1
        )
    elif query_embeddings.shape.rank == 2:
        scores = tf.linalg.matmul(query_embeddings, candidate_embeddings, transpose_b=True)
    else:
        raise ValueError(
            "`query_embeddings` must be `[num_queries, dim]` or `[num_queries, heads, dim]`, "
            f"received shape {query_embeddings.shape.as_list()}."
        )
    num_queries, num_candidates = query_embeddings.shape[0], candidate_embeddings.shape[0]
    if num_queries is not None and num_candidates is not None and num_candidates < num_queries:
        raise ValueError(
            f"`candidate_embeddings` has {num_candidates} rows but there are {num_queries} "
            "queries: the first num_queries candidates are the positives, so "
            "num_candidates >= num_queries is required."
        )
    dtype = compute_dtype_for(scores)
    scores = tf.cast(scores, dtype)
    if temperature is not None:
        scores = scores / tf.cast(temperature, dtype)
    return scores


def positive_scores(query_embeddings, candidate_embeddings, temperature=None) -> tf.Tensor:
    """`[num_queries]` scores of each query's positive: the diagonal of `candidate_scores`.

    Computed from the embeddings (``<q_i, c_i>``, the best head for rank-3
    queries) in the scores' dtype, so that the loss needs no `[num_queries,
    num_candidates]` gradient to read the diagonal off the score matrix.
    """
    queries = tf.convert_to_tensor(query_embeddings)
    candidates = tf.convert_to_tensor(candidate_embeddings)
    dtype = compute_dtype_for(queries, candidates)
    queries, candidates = tf.cast(queries, dtype), tf.cast(candidates, dtype)
    positives = candidates[:tf.shape(queries)[0]]
    if queries.shape.rank == 3:
        scores = tf.reduce_max(tf.einsum("qne,qe->qn", queries, positives), axis=1)
    else:
        scores = tf.reduce_sum(queries * positives, axis=-1)
    if temperature is not None:
        scores = scores / tf.cast(temperature, dtype)
    return scores


def proposal_log_q(
    probability=None,
    log_probability=None,
    *,
    num_candidates: Optional[int] = None,
    min_probability: float = MIN_PROBABILITY,
    dtype: tf.DType = tf.float32,
    correction: str = "logq-tfrs",
) -> tf.Tensor:
    """`[num_candidates]` ``log Q(d)``: the log per-draw proposal probability of each candidate.

    ``Q(d)`` is the probability that *one draw* of the sampler returns ``d``
    (for in-batch negatives, the item's share of all interactions: count / total),
    so ``Q <= 1`` and it sums to 1 over the catalog. Batch-level probabilities
    (``B * Q``, the chance to appear in a batch of ``B``) are not per-draw: they
    exceed 1 for popular items, which is rejected here, and they silently drive
    the corrected loss's weight ``w = 1 - P(p|u)`` to 0 otherwise.

    ``probability`` is clipped to ``[min_probability, 1]`` before the log (TFRS
    clips at 1e-6; `tfrs_logq.proposal.log_q_from_probability`); ``log_probability``
    is used as given.

    Raises:
      ValueError: neither given, a wrong shape, or (for concrete values)
        a probability outside [0, 1]. In a graph the same checks run as
        ``tf.debugging`` assertions (InvalidArgumentError with this message).
    """
    if log_probability is not None:
        name = "candidate_log_sampling_probability"
        log_q = tf.cast(tf.convert_to_tensor(log_probability), dtype)
    elif probability is not None:
        name = "candidate_sampling_probability"
        log_q = tf.cast(tf.convert_to_tensor(probability), dtype)
    else:
        raise ValueError(
            f"correction={correction!r} needs `candidate_sampling_probability` "
            "(or `candidate_log_sampling_probability`); received neither."
        )
    if log_q.shape.rank == 2 and log_q.shape[1] == 1:
        log_q = tf.reshape(log_q, [-1])
    if log_q.shape.rank != 1:
        raise ValueError(f"`{name}` must be `[num_candidates]`, received {log_q.shape}.")
    if num_candidates is not None and log_q.shape[0] not in (None, num_candidates):
        raise ValueError(
            f"`{name}` has {log_q.shape[0]} entries, expected one per candidate "
            f"({num_candidates})."
        )
    if probability is not None and log_probability is None:
        return check_probability(log_q, name, min_probability)
    return check_log_q(log_q, name)


def reduce_loss(per_example: tf.Tensor, reduction: str, sample_weight=None,
                global_batch=None) -> tf.Tensor:
    """Weights and reduces `[num_queries]` losses.

    ``"sum"`` sums the replica's examples (TFRS; the replicas' gradients are then
    summed). ``"sum_over_batch_size"`` divides by the *global* batch size: ``global_batch``
    when the caller counted it (`cross_replica_candidates` does), else the replica's
    queries times the replicas in sync (as Keras losses do, `tf.nn.compute_average_loss`),
    so the update does not grow with the number of replicas. ``"none"`` returns the
    weighted per-example losses.
    """
    if sample_weight is not None:
        sample_weight = tf.reshape(tf.cast(sample_weight, per_example.dtype), [-1])
        per_example = per_example * sample_weight
    if reduction == "none":
        return per_example
    total = tf.reduce_sum(per_example)
    if reduction == "sum":
        return total
    if global_batch is None:
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        global_batch = tf.size(per_example) * replicas
    return total / tf.maximum(tf.cast(global_batch, per_example.dtype), 1.0)


__all__ = ["CorrectedRetrieval", "REDUCTIONS", "SAMPLING_PROBABILITIES", "candidate_scores",
           "positive_scores", "proposal_log_q", "reduce_loss", "stock_logits"]
