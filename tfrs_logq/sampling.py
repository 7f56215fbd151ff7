"""Negative samplers: in-batch, uniform over a catalog, and mixed.

One function draws the negatives of a step, `draw_negative_ids`: stateless, keyed by
``(seed, step)`` alone (`step_key`), so a resumed run draws what an uninterrupted one
does. `sample_negatives` gives its draw with each negative's ``log Q``: the two-tower
trainer calls it with its step, and the sampler classes (`InBatchSampler`,
`UniformSampler`, `MixedSampler`) with the ``step=`` they are given or else their call
counter. The SASRec objectives (`tfrs_logq.sasrec.objectives`) call `draw_negative_ids`
with their draw counter: uniform negatives per position, in-batch ones shared.

Every sampler returns `SampledNegatives`: a fixed-size `[k]` vector of ids, the
``log Q`` to correct them with, and an ``is_valid`` mask (False marks padding
when fewer than ``k`` distinct in-batch items exist). The negatives are shared
by every row of the batch, which is how TFRS consumes extra negatives:

    negatives = sampler(positive_ids)
    loss = task(
        query_embeddings,
        tf.concat([positive_embeddings, item_model(negatives.ids)], 0),
        candidate_ids=tf.concat([positive_ids, negatives.ids], 0),
        candidate_log_sampling_probability=tf.concat([positive_log_q, negatives.log_q], 0),
        score_mask=negatives.score_mask(num_queries),
    )

`score_mask` keeps the row's own positive and the sampled negatives and drops
the other rows' positives, so the negatives are exactly the sampled ones.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import tensorflow as tf

from tfrs_logq.proposal import mixture_probability


class SampledNegatives(NamedTuple):
    """Negatives shared by a batch.

    Attributes:
      ids: `[k]` int64 item ids (padding entries hold ``pad_id``).
      log_q: `[k]` float32 ``log Q(d)`` to correct each negative with.
      is_valid: `[k]` bool, False for padding entries.
    """

    ids: tf.Tensor
    log_q: tf.Tensor
    is_valid: tf.Tensor

    def score_mask(self, num_queries) -> tf.Tensor:
        """`[num_queries, num_queries + k]` mask for candidates ``[positives; ids]``.

        True on the diagonal (each row's own positive) and on valid sampled
        negatives; False on the other rows' positives and on padding.
        """
        # Two broadcast comparisons written straight into the [B, B + k] mask (no
        # float eye, cast, broadcast and concat): column j < B holds j, a valid
        # sampled negative -1, padding -2.
        rows = tf.range(num_queries)
        columns = tf.concat([rows, tf.where(self.is_valid, -1, -2)], axis=0)
        return tf.logical_or(tf.equal(rows[:, None], columns[None, :]),
                             tf.equal(columns, -1)[None, :])


def _check_positive_int(value, name: str) -> int:
    if value is None or int(value) != value or int(value) < 1:
        raise ValueError(f"`{name}` must be a positive int, received {value!r}.")
    return int(value)


def batch_log_frequency(ids: tf.Tensor, batch_ids: tf.Tensor, is_real=None) -> tf.Tensor:
    """``log(#id in batch / batch size)``: the unigram estimate from one batch.

    ``is_real`` (bool, like ``batch_ids``) marks the entries that count towards the
    batch size (padding does not); all of them by default.
    """
    counts = tf.reduce_sum(tf.cast(tf.equal(ids[:, None], batch_ids[None, :]), tf.float32), 1)
    real = tf.size(batch_ids) if is_real is None else tf.reduce_sum(tf.cast(is_real, tf.int32))
    size = tf.cast(tf.maximum(real, 1), tf.float32)
    return tf.math.log(tf.maximum(counts, 1.0) / size)


def distinct_in_random_order(ids, k: int, seed, pad_id: int = 0, distinct: bool = True):
    """The distinct values of ``ids`` (``pad_id`` excluded) in uniformly random order,
    the first ``k`` kept: ``(ids_out [k], is_valid [k])``, padded with ``pad_id``
    (``is_valid`` False) when fewer than ``k`` distinct values exist. With
    ``distinct=False`` every non-padding entry is a candidate: ``k`` positions
    drawn without replacement.

    Static shapes only (sort, first occurrences, random keys, top-k), so it
    compiles under XLA (`tf.function(jit_compile=True)`), unlike `tf.unique`
    and `stateless_shuffle`.

    Args:
      ids: integer or string tensor of any shape (flattened).
      k: int. Number of ids returned.
      seed: `[2]` int seed of the stateless random keys.
      pad_id: int (or str for string ids; an int means ``""`` there). Value ignored in
        ``ids`` and used for padding. Defaults to 0.
      distinct: bool. Deduplicate before drawing. Defaults to True.
    """
    k = _check_positive_int(k, "k")
    flat = tf.reshape(tf.convert_to_tensor(ids), [-1])
    if flat.dtype == tf.string:
        # Strings: draw their codes (position of first occurrence order; -1 = padding),
        # then give the strings back. Not XLA-compilable (tf.unique), as strings are not.
        pad = pad_id if isinstance(pad_id, (str, bytes)) else ""
        values, codes = tf.unique(flat)
        codes = tf.where(tf.equal(flat, pad), -1, codes)
        drawn, is_valid = distinct_in_random_order(codes, k, seed, pad_id=-1,
                                                   distinct=distinct)
        out = tf.where(is_valid, tf.gather(values, tf.maximum(drawn, 0)), pad)
        return tf.ensure_shape(out, [k]), is_valid
    if not flat.dtype.is_integer:
        raise ValueError(f"`ids` must be integer or string ids, received dtype "
                         f"{flat.dtype.name}.")
    size = tf.size(flat)
    ordered = tf.sort(flat)
    keep = ordered != tf.cast(pad_id, flat.dtype)
    if distinct:
        first = tf.concat([tf.ones([1], tf.bool), ordered[1:] != ordered[:-1]], 0)[:size]
        keep = tf.logical_and(first, keep)
    keys = tf.random.stateless_uniform(tf.shape(ordered), seed=seed, dtype=tf.float32)
    keys = tf.where(keep, keys, 2.0 * tf.ones_like(keys))  # kept keys are in [0, 1)
    padded_keys = tf.concat([keys, 3.0 * tf.ones([k], tf.float32)], 0)
    padded_ids = tf.concat([ordered, tf.fill([k], tf.cast(pad_id, flat.dtype))], 0)
    _, order = tf.math.top_k(-padded_keys, k=k)
    is_valid = tf.gather(padded_keys, order) < 1.0
    out = tf.where(is_valid, tf.gather(padded_ids, order), tf.cast(pad_id, flat.dtype))
    return tf.ensure_shape(out, [k]), tf.ensure_shape(is_valid, [k])


def uniform_ids(shape, num_items: int, seed, first_id: int = 1, dtype=tf.int32) -> tf.Tensor:
    """Ids drawn uniformly with replacement from ``first_id .. first_id + num_items - 1``.

    Stateless (``seed`` is a `[2]` int tensor) and XLA-compilable; ``log Q = -log num_items``.
    """
    return tf.random.stateless_uniform(shape, seed=seed, minval=first_id,
                                       maxval=first_id + num_items, dtype=dtype)


# Salts every draw's key: the two-tower trainer keys batch i of seed s by
# [world_seed, s * 10^8 + i], which an unsalted [seed, step] would equal for seed 0 of
# world 0 (its uniform negatives would then be the users' draw scaled).
NEGATIVES_SALT = 0x6E65676174697665  # "negative"


def step_key(seed, step) -> tf.Tensor:
    """`[2]` int64 key of the negatives of ``step``: ``stateless_fold_in([seed, salt], step)``.

    A function of ``(seed, step)`` alone, so a resumed run, or two runs that differ only
    in their correction, draw the same negatives at the same step.
    """
    return tf.random.experimental.stateless_fold_in(
        tf.constant([seed, NEGATIVES_SALT], tf.int64), tf.cast(step, tf.int64))


class SampledIds(NamedTuple):
    """The negatives of one step, in their two parts (`draw_negative_ids`).

    Attributes:
      uniform: `[num_uniform]` ids shared by the batch, or `[num_rows, num_uniform]`
        drawn per row; None when there are none.
      in_batch: `[num_in_batch]` distinct positives shared by every row, or None.
      in_batch_valid: `[num_in_batch]` bool, False for padding (fewer distinct positives
        than ``num_in_batch``), or None.
    """

    uniform: Optional[tf.Tensor]
    in_batch: Optional[tf.Tensor]
    in_batch_valid: Optional[tf.Tensor]


def draw_negative_ids(positive_ids, seed, step, num_uniform: int = 0,
                      num_in_batch: int = 0, num_items: int = 0, first_id: int = 1,
                      pad_id=0, deduplicate: bool = True, num_rows=None,
                      dtype=tf.int64, replica=None) -> SampledIds:
    """The ids of one step's negatives, drawn from ``(seed, step)`` alone (stateless).

    ``num_uniform`` ids uniform with replacement over ``first_id .. first_id + num_items - 1``
    (`uniform_ids`), then ``num_in_batch`` of the batch's distinct ``positive_ids`` in random
    order (`distinct_in_random_order`; padded, ``in_batch_valid`` False, when the batch
    holds fewer): in-batch, uniform, or their mix (Yang et al. 2020). The key is
    `step_key`, split in two: one half for each part, so a call that draws one part
    draws what a call drawing both does for that part.

    Args:
      positive_ids: the batch's positive ids (any shape; int or string), or None when
        ``num_in_batch`` is 0.
      seed: int. The run's seed.
      step: int or int scalar tensor. The step (or draw) number.
      num_uniform: int. Uniform negatives (per row when ``num_rows`` is given). Defaults
        to 0.
      num_in_batch: int. In-batch negatives. Defaults to 0.
      num_items: int. Catalog size of the uniform part.
      first_id: int. Smallest id of the uniform part. Defaults to 1.
      pad_id: int (or str). Padding of ``positive_ids`` and of the output. Defaults to 0.
      deduplicate: bool. In-batch negatives from distinct ids (else positions without
        replacement). Defaults to True.
      num_rows: int or int scalar tensor, or None. When given, each of ``num_rows`` rows
        draws its own uniform negatives (`[num_rows, num_uniform]`); None: one
        `[num_uniform]` vector shared by the batch. Defaults to None.
      dtype: integer dtype of the uniform ids. Defaults to int64.
      replica: int scalar tensor or None. Folded into the key (`stateless_fold_in`), so
        that the replicas of a multi-replica step draw apart; None: no fold.
        Defaults to None.

    Returns:
      `SampledIds`.
    """
    if num_uniform < 0 or num_in_batch < 0 or num_uniform + num_in_batch < 1:
        raise ValueError(f"`num_uniform` and `num_in_batch` must be >= 0 and add up to at "
                         f"least 1, received {num_uniform!r} and {num_in_batch!r}.")
    key = step_key(seed, step)
    if replica is not None:
        key = tf.random.experimental.stateless_fold_in(key, tf.cast(replica, tf.int64))
    s_uniform, s_in_batch = tf.unstack(tf.random.experimental.stateless_split(key, 2))
    uniform = in_batch = in_batch_valid = None
    if num_uniform:
        num_items = _check_positive_int(num_items, "num_items")
        shape = [num_uniform] if num_rows is None else [num_rows, num_uniform]
        uniform = uniform_ids(shape, num_items, s_uniform, first_id=first_id, dtype=dtype)
    if num_in_batch:
        in_batch, in_batch_valid = distinct_in_random_order(
            positive_ids, num_in_batch, s_in_batch, pad_id=pad_id, distinct=deduplicate)
    return SampledIds(uniform, in_batch, in_batch_valid)


def sample_negatives(positive_ids, seed, step, num_uniform: int = 0, num_in_batch: int = 0,
                     num_items: int = 0, log_q=None, first_id: int = 1, pad_id=0,
                     deduplicate: bool = True) -> SampledNegatives:
    """The negatives of one step shared by the batch (`draw_negative_ids`), uniform first,
    with the ``log Q`` to correct each with.

    Args:
      positive_ids, seed, step, num_uniform, num_in_batch, num_items, first_id, pad_id,
        deduplicate: as `draw_negative_ids`'s.
      log_q: the negatives' ``log Q``: a `[num_ids]` table read by id, or a function of the
        `[k]` drawn ids; None gives zeros. Padding entries hold 0 whatever it says.

    Returns:
      `SampledNegatives` of ``k = num_uniform + num_in_batch`` entries, uniform first.
    """
    drawn = draw_negative_ids(positive_ids, seed, step, num_uniform=num_uniform,
                              num_in_batch=num_in_batch, num_items=num_items,
                              first_id=first_id, pad_id=pad_id, deduplicate=deduplicate)
    ids, valid = [], []
    if drawn.uniform is not None:
        ids.append(drawn.uniform)
        valid.append(tf.ones([num_uniform], tf.bool))
    if drawn.in_batch is not None:
        ids.append(drawn.in_batch)
        valid.append(drawn.in_batch_valid)
    ids, is_valid = tf.concat(ids, 0), tf.concat(valid, 0)
    if log_q is None:
        values = tf.zeros(tf.shape(ids), tf.float32)
    elif callable(log_q):
        values = tf.cast(log_q(ids), tf.float32)
    else:
        values = tf.cast(tf.gather(log_q, ids), tf.float32)
    log_q = tf.where(is_valid, values, tf.zeros(tf.shape(ids), tf.float32))
    return SampledNegatives(ids, log_q, is_valid)


def _next_step(calls: tf.Variable, step):
    """``step`` when given, else the sampler's call counter, advanced by one."""
    if step is not None:
        return step
    calls.assign_add(1)
    return calls.read_value()


class InBatchSampler:
    """Negatives drawn from the batch's own positives (a unigram proposal).

    With ``deduplicate=True`` the batch's distinct items are shuffled and the
    first ``num_negatives`` kept, as the paper's official code does; otherwise
    ``num_negatives`` positions of the batch are drawn without replacement.

    Args:
      num_negatives: int. ``k``, the number of negatives returned.
      deduplicate: bool. Sample from distinct items. Defaults to True.
      frequency: an estimator from :mod:`tfrs_logq.frequency` (anything with
        ``log_q(ids)``) giving the unigram ``log Q(d)``. Defaults to None, which
        uses the batch's own item frequencies.
      pad_id: int (or str). Id of padding in ``positive_ids`` (ignored) and of padding
        entries in the output; for string ids an int means ``""``. Defaults to 0.
      seed: int. Seed of the stateless draw (`sample_negatives`), whose step is the
        call's ``step`` or else the sampler's call counter, so that every call differs.
        Defaults to 0.
    """

    def __init__(
        self,
        num_negatives: int,
        deduplicate: bool = True,
        frequency=None,
        pad_id: int = 0,
        seed: int = 0,
    ) -> None:
        self.num_negatives = _check_positive_int(num_negatives, "num_negatives")
        self.deduplicate = bool(deduplicate)
        self.frequency = frequency
        self.pad_id = pad_id if isinstance(pad_id, str) else int(pad_id)
        self._seed = int(seed)
        self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="sampler_calls")

    def log_q(self, ids: tf.Tensor, batch_ids: tf.Tensor, is_real=None) -> tf.Tensor:
        if self.frequency is None:
            return batch_log_frequency(ids, batch_ids, is_real)
        return tf.cast(self.frequency.log_q(ids), tf.float32)

    def __call__(self, positive_ids, step=None) -> SampledNegatives:
        """The negatives of ``positive_ids`` at ``step`` (int or int scalar tensor;
        None: the sampler's call counter)."""
        ids = tf.reshape(tf.convert_to_tensor(positive_ids), [-1])
        pad = self.pad_id
        if ids.dtype == tf.string:
            pad = pad if isinstance(pad, str) else ""
        else:
            ids = tf.cast(ids, tf.int64)
        # Batch frequencies over real positives (a valid negative never equals pad_id).
        is_real = tf.not_equal(ids, pad)
        return sample_negatives(ids, self._seed, _next_step(self._calls, step),
                                num_in_batch=self.num_negatives, pad_id=pad,
                                deduplicate=self.deduplicate,
                                log_q=lambda drawn: self.log_q(drawn, ids, is_real))


class UniformSampler:
    """``k`` negatives drawn uniformly, with replacement, from a catalog.

    The catalog is the ``num_items`` ids ``first_id, ..., first_id + num_items - 1``
    (default ``first_id=1`` keeps id 0 free for padding); ``log Q = -log num_items``.

    Args:
      num_items: int. Catalog size ``V``.
      num_negatives: int. ``k``.
      first_id: int. Smallest catalog id. Defaults to 1.
      seed: int. Seed of the stateless draw, whose step is the call's ``step`` or else
        the sampler's call counter. Defaults to 0.
    """

    def __init__(self, num_items: int, num_negatives: int, first_id: int = 1, seed: int = 0):
        self.num_items = _check_positive_int(num_items, "num_items")
        self.num_negatives = _check_positive_int(num_negatives, "num_negatives")
        self.first_id = int(first_id)
        self._seed = int(seed)
        self._calls = tf.Variable(0, dtype=tf.int64, trainable=False, name="sampler_calls")

    def __call__(self, positive_ids=None, step=None) -> SampledNegatives:
        """``k`` uniform negatives at ``step`` (None: the sampler's call counter);
        ``positive_ids`` is not read."""
        log_q = -tf.math.log(float(self.num_items))
        return sample_negatives(None, self._seed, _next_step(self._calls, step),
                                num_uniform=self.num_negatives, num_items=self.num_items,
                                first_id=self.first_id,
                                log_q=lambda ids: tf.fill(tf.shape(ids), log_q))


class MixedSampler:
    """Mixed negative sampling (Yang et al. 2020): uniform + in-batch negatives.

    Args:
      uniform: `UniformSampler` for the ``k_uniform`` part.
      in_batch: `InBatchSampler` for the ``k_in_batch`` part.
      log_q: str. ``"unigram"`` (the paper: every negative, the uniform ones
        too, is corrected with the unigram ``log Q`` of the in-batch sampler)
        or ``"mixture"`` (the proposal of a negative slot of the mixture,
        ``Q(d) = a / V + (1 - a) Q_unigram(d)`` with ``a = k_uniform / k``).
        Defaults to ``"unigram"``.

    One `sample_negatives` draw gives both parts, keyed by the in-batch sampler's seed
    and its call counter (or the call's ``step``).
    """

    LOG_Q_MODES = ("unigram", "mixture")

    def __init__(self, uniform: UniformSampler, in_batch: InBatchSampler, log_q: str = "unigram"):
        if log_q not in self.LOG_Q_MODES:
            raise ValueError(f"`log_q` must be one of {self.LOG_Q_MODES}, received {log_q!r}.")
        self.uniform = uniform
        self.in_batch = in_batch
        self.log_q_mode = log_q

    @property
    def num_negatives(self) -> int:
        return self.uniform.num_negatives + self.in_batch.num_negatives

    def __call__(self, positive_ids, step=None) -> SampledNegatives:
        """The ``k_uniform`` then ``k_in_batch`` negatives at ``step`` (None: the in-batch
        sampler's call counter)."""
        ids_all = tf.reshape(tf.cast(tf.convert_to_tensor(positive_ids), tf.int64), [-1])
        is_real = tf.not_equal(ids_all, self.in_batch.pad_id)
        a = self.uniform.num_negatives / self.num_negatives

        def log_q(ids):
            unigram = self.in_batch.log_q(ids, ids_all, is_real)
            if self.log_q_mode == "unigram":
                return unigram
            return tf.math.log(mixture_probability(tf.exp(unigram), a, self.uniform.num_items))

        return sample_negatives(
            ids_all, self.in_batch._seed, _next_step(self.in_batch._calls, step),
            num_uniform=self.uniform.num_negatives, num_in_batch=self.in_batch.num_negatives,
            num_items=self.uniform.num_items, log_q=log_q, first_id=self.uniform.first_id,
            pad_id=self.in_batch.pad_id, deduplicate=self.in_batch.deduplicate)

