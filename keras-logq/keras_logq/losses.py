"""Sampled softmax losses with no, standard (two forms), or corrected logQ correction, in
`keras.ops`.

Pure functions: logits, log proposal probabilities and a validity mask in, one
loss per example out. They run and differentiate on every Keras 3 backend (JAX,
PyTorch, TensorFlow), eagerly and under `jit_compile`. The layer in
`keras_logq.retrieval` is a thin wrapper around them.

Notation (Khrylchenko et al., RecSys 2025): ``s_p`` is the positive's logit,
``s_i`` the logit of negative ``d_i``, ``Q`` the proposal the negatives were
drawn from and ``Q'`` the proposal with the positive excluded,
``log Q'(d) = log Q(d) - log(1 - Q(p))``.

- ``"none"``:          ``-s_p + log(e^{s_p} + sum_i e^{s_i})``
- ``"logq-tfrs"``:     ``-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})``,
  standard logQ as TFRS's ``Retrieval`` computes it: the positive's logit corrected too
  (the retrieval layer and loss also subtract the constant ``log Q(p)`` in the numerator,
  as TFRS does: the same gradient)
- ``"logq-official"``: ``-s_p + log(e^{s_p} + sum_i e^{s_i - log Q(d_i)})``, standard
  logQ as the paper's official code computes it: the positive uncorrected
- ``"corrected"``:     ``-w * (s_p - log sum_i e^{s_i - log Q'(d_i)})`` with
  ``w = sg(1 - P)`` and ``P = e^{s_p} / (e^{s_p} + (1/n) sum_i e^{s_i - log Q'(d_i)})``,
  ``n`` the number of valid negatives of the row and ``sg`` the stop-gradient.

A bare ``"logq"`` names neither standard form and is refused (`check_correction`).

``proposal`` says what ``log Q`` holds (`PROPOSALS`): ``"per_draw"``, ``Q(d)`` of one
draw (the paper), or ``"inclusion"``, ``pi(d)``, the chance that ``d`` is in the row's
set of negatives (deduplicated draws). With inclusion probabilities ``"corrected"``
excludes no ``Q(p)`` and its weight is the Horvitz-Thompson one,
``P = e^{s_p} / (e^{s_p} + sum_i e^{s_i - log pi(d_i)})`` (no ``1/n``;
`corrected_weight`).

The same semantics as `tfrs_logq.losses.sampled_softmax_loss` (TensorFlow only).

Input checks. ``Q`` is a per-draw probability, so ``log Q <= 0``; a larger value
(a batch-level probability ``B * Q``, a count) would make the loss negative and,
for ``"corrected"``, drive the weight ``w`` to 0. `check_log_q` refuses it, on
every backend, wherever it can see the values:

- concrete values (eager JAX, PyTorch and TensorFlow): `ValueError` at once;
- JAX under `jit` (`model.fit`): a `jax.debug.callback` raises the same
  `ValueError` on the host; the step fails with a `JaxRuntimeError` whose text
  holds the message;
- TensorFlow graphs (`tf.function`): a `tf.debugging.Assert`
  (`InvalidArgumentError` with the message). XLA (`jit_compile=True`, Keras's
  default on TensorFlow) drops assertions, so the offending entries are also
  set to NaN there: the loss reads `nan` instead of a plausible number;
- PyTorch under `torch.compile` or on an accelerator: `torch._assert_async`
  (`RuntimeError` with the message; on a GPU it surfaces at the next sync).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

from keras_logq.masks import accidental_hit_mask, first_occurrence_mask

CORRECTIONS = ("none", "logq-tfrs", "logq-official", "corrected")


def check_correction(correction, allowed: tuple = CORRECTIONS) -> str:
    """Returns ``correction`` if it is one of ``allowed`` (`CORRECTIONS` by default), else
    raises a one-line `ValueError`; a bare ``"logq"`` is refused with the two standard
    forms."""
    if correction == "logq":
        raise ValueError(
            "correction 'logq' is ambiguous: use 'logq-tfrs' (TFRS's Retrieval: the positive's "
            "logit corrected too) or 'logq-official' (the paper's code: the positive "
            "uncorrected).")
    if correction not in allowed:
        raise ValueError(f"`correction` must be one of {', '.join(allowed)}; received "
                         f"{str(correction)[:60]!r}.")
    return correction


# What a negative's log Q is the log of, as in tfrs_logq: "per_draw", Q(d) of one draw (the
# paper: n draws, the normaliser estimated by their mean); "inclusion", pi(d), the chance
# that d is in the row's set of negatives (deduplicated draws: the normaliser estimated by
# the Horvitz-Thompson sum over the set).
PROPOSALS = ("per_draw", "inclusion")


def check_proposal(proposal, name: str = "proposal") -> str:
    """Returns ``proposal`` if it is one of `PROPOSALS`, else raises a one-line `ValueError`
    naming ``name``."""
    if proposal not in PROPOSALS:
        raise ValueError(f"`{name}` must be one of {PROPOSALS}, received "
                         f"{str(proposal)[:60]!r}.")
    return proposal


# Tolerance on Q <= 1, as in tfrs_logq (float32 rounding of probabilities from counts).
Q_TOLERANCE = 1e-5
# TFRS and Keras-RS clip a probability to [1e-6, 1] before the log.
MIN_PROBABILITY = 1e-6
# A probability q in log(1 - q) is capped at 1 - COMPLEMENT_EPSILON, as in tfrs_logq.
COMPLEMENT_EPSILON = 1e-6


def _dtype_name(x) -> str:
    return keras.backend.standardize_dtype(x.dtype)


def compute_dtype_for(*tensors) -> str:
    """``"float64"`` if any input is float64, else ``"float32"`` (never half precision)."""
    for t in tensors:
        if t is not None and _dtype_name(t) == "float64":
            return "float64"
    return "float32"


def masked_value(dtype: str) -> float:
    """The one "minus infinity" for masked logits: half the dtype's lowest value.

    Finite, so ``0 * masked`` is 0 (no NaN), and ``exp(masked - max)`` is exactly
    0 for any real row maximum, without overflow in ``masked - max``. Only used in
    the float32/float64 compute dtype (half-precision inputs are cast up first).
    """
    return float(np.finfo(np.dtype(dtype)).min / 2)


def constant_like(value: float, like, dtype=None):
    """A 0-d tensor holding ``value``, in ``dtype`` (default: ``like``'s) on ``like``'s device.

    On PyTorch it is filled on ``like``'s device (`torch.full`): Keras turns a Python
    number into a tensor with ``torch.as_tensor(value, device=...)``, which on a GPU
    is a blocking host-to-device copy in the middle of the step. Elsewhere
    ``ops.convert_to_tensor(value, dtype)`` (a constant of the compiled program; made in
    ``dtype`` directly, so a float64 value such as `masked_value` is not rounded through
    float32 first, as ``ops.cast`` does on TensorFlow).
    """
    dtype = keras.backend.standardize_dtype(dtype or like.dtype)
    if keras.backend.backend() == "torch":
        import torch

        if isinstance(like, torch.Tensor):
            return torch.full((), value, dtype=getattr(torch, dtype), device=like.device)
    return ops.convert_to_tensor(value, dtype)


def _as_float(x, name: str, dtype: str):
    kind = _dtype_name(x)
    if "float" not in kind:
        raise ValueError(f"`{name}` must be a floating tensor, received dtype {kind}.")
    return ops.cast(x, dtype)


def _shape(x) -> tuple:
    """The static shape: ints, None where unknown (TensorFlow graphs give tensors there)."""
    return tuple(d if isinstance(d, int) else None for d in ops.shape(x))


def _check_rank(x, name: str, ranks: tuple) -> None:
    if len(_shape(x)) not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(f"`{name}` must have rank {expected}, received shape {_shape(x)}.")


def _check_dim(x, name: str, axis: int, expected, what: str) -> None:
    got = _shape(x)[axis]
    if got is not None and expected is not None and got != expected:
        raise ValueError(
            f"`{name}` has {got} {what} along axis {axis} (shape {_shape(x)}), "
            f"expected {expected}."
        )


def _concrete(x):
    """``x`` as numpy when its value is known now (eager); None while tracing.

    PyTorch tensors on an accelerator also give None (no host sync per step).
    """
    if isinstance(x, keras.KerasTensor):
        return None
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):
            return None
    elif backend == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            return tf.get_static_value(x)
    elif backend == "torch":
        import torch

        if torch.compiler.is_compiling() or x.device.type != "cpu":
            return None
    return np.asarray(ops.convert_to_numpy(x))


def _refuse_traced(x, bad, message: str):
    """Checks ``not any(bad)`` inside a traced graph (see the module docstring)."""
    backend = keras.backend.backend()
    any_bad = ops.any(bad)
    if backend == "jax":
        import jax

        def _raise(flag):
            if bool(flag):
                raise ValueError(message)

        jax.debug.callback(_raise, any_bad)
    elif backend == "tensorflow":
        import tensorflow as tf

        assertion = tf.debugging.Assert(tf.logical_not(any_bad), [message])
        with tf.control_dependencies([assertion]):
            x = tf.identity(x)
        x = tf.where(bad, tf.constant(float("nan"), x.dtype), x)  # XLA drops the Assert
    elif backend == "torch":
        import torch

        if x.device.type != "meta":
            torch._assert_async(torch.logical_not(any_bad), message)
    return x


def check_log_q(log_q, name: str, where=None):
    """``log_q``, refused (see the module docstring) if an entry exceeds ``Q_TOLERANCE``.

    ``log Q`` is the log of a per-draw probability: at most 0. Only the entries
    where ``where`` (a bool tensor broadcastable to ``log_q``) is True are
    checked; NaN passes (masked entries may hold anything).

    Args:
        log_q: float tensor. ``log Q`` values.
        name: str. The argument's name, for the message.
        where: bool tensor. Which entries are used. Defaults to `None` (all).

    Returns:
        ``log_q`` (under TensorFlow graphs, with a control dependency on the
        check and NaN at offending entries).

    Raises:
        ValueError: when the values are concrete and an entry is above 0.

    Example:

    >>> check_log_q(np.log([0.5, 0.25]), "candidate_log_sampling_probability").shape
    (2,)
    """
    log_q = ops.convert_to_tensor(log_q)
    bad = log_q > constant_like(Q_TOLERANCE, log_q)
    if where is not None:
        bad = ops.logical_and(bad, where)
    message = (
        f"`{name}` must be the log of a per-draw proposal probability (log Q <= 0): the "
        "probability that one draw of the sampler returns the candidate (count / total "
        "interactions), not its chance to appear in a batch."
    )
    value = _concrete(bad)
    if value is not None:
        if np.any(value):
            raise ValueError(f"{message} Received {_max_offending(log_q, value)}.")
        return log_q
    return _refuse_traced(log_q, bad, message)


def _max_offending(values, bad) -> str:
    """"a maximum of X" over the offending entries, when the values are known."""
    known = _concrete(values)
    if known is None:
        return "values above it"
    return f"a maximum of {float(np.max(np.asarray(known, np.float64)[bad])):.6g}"


def log_q_from_probability(probability, name: str = "candidate_sampling_probability",
                           min_probability: float = MIN_PROBABILITY, dtype: str = "float32"):
    """``log(clip(Q, min_probability, 1))`` of a per-draw probability, checked ``0 <= Q <= 1``.

    TFRS's and Keras-RS's ``candidate_sampling_probability`` convention (they clip
    at 1e-6); values outside ``[0, 1]`` (beyond ``Q_TOLERANCE``) are refused as
    `check_log_q` refuses ``log Q > 0``.

    >>> np.round(keras.ops.convert_to_numpy(log_q_from_probability([0.5, 0.0])), 4)
    array([ -0.6931, -13.8155], dtype=float32)
    """
    q = _as_float(ops.convert_to_tensor(probability), name, dtype)
    bad = ops.logical_or(q > constant_like(1.0 + Q_TOLERANCE, q), q < constant_like(0.0, q))
    message = (
        f"`{name}` must be a per-draw proposal probability (0 <= Q <= 1): the probability "
        "that one draw of the sampler returns the candidate (count / total interactions), "
        "not its chance to appear in a batch."
    )
    value = _concrete(bad)
    if value is not None and np.any(value):
        raise ValueError(f"{message} Received {_max_offending(q, value)}.")
    if value is None:
        q = _refuse_traced(q, bad, message)
    return ops.log(ops.clip(q, constant_like(min_probability, q), constant_like(1.0, q)))


def row_logsumexp(logits):
    """`[batch, n]` -> `[batch]` ``log sum_j e^{logits_j}``, stable.

    Masked entries must hold `masked_value` (they then contribute exactly 0 and
    receive zero gradient). An entirely masked row returns a finite value near
    `masked_value`; callers zero such rows.
    """
    row_max = ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True))
    total = ops.sum(ops.exp(logits - row_max), axis=-1)
    return ops.squeeze(row_max, axis=-1) + ops.log(total)


def _count_true(mask):
    """`[batch, n]` bool -> `[batch]` int32: each row's number of True entries.

    On PyTorch summed from the bool in place: `torch.count_nonzero` (and `keras.ops.sum`
    of a bool) first make an int64 copy of the whole mask, the one `[batch, n]` pass
    the corrected loss adds to the standard one. JAX and TensorFlow fuse the cast under `jit`.
    """
    if keras.backend.backend() == "torch":
        import torch

        if isinstance(mask, torch.Tensor):
            return torch.sum(mask, dim=-1, dtype=torch.int32)
    return ops.count_nonzero(mask, axis=-1)


def corrected_weight(positive_logits, negative_lse, num_valid, proposal: str = "per_draw"):
    """The corrected loss's weight ``w = sg(1 - P(p|u))``, `[batch]`; 0 where ``n = 0``.

    ``negative_lse = log sum_i e^{s_i - log Q'(d_i)}`` over the row's ``num_valid``
    (``n``) negatives. Per-draw proposals (the paper): ``P = e^{s_p} / (e^{s_p} +
    (1/n) sum_i e^{s_i - log Q'(d_i)}) = sigmoid(s_p - lse + log n)``, so
    ``1 - P = sigmoid(lse - log n - s_p)``. Inclusion probabilities ``pi`` (``lse``
    over ``s_i - log pi(d_i)``): the sum itself estimates the normaliser without the
    positive (Horvitz-Thompson), ``1 - P = sigmoid(lse - s_p)``. The same function as
    `tfrs_logq.losses.corrected_weight`.

    Args:
        positive_logits: float tensor, `[batch]`. ``s_p``.
        negative_lse: float tensor, `[batch]`. The negatives' log-sum-exp.
        num_valid: int tensor, `[batch]`. ``n``, each row's number of valid negatives.
        proposal: str. ``"per_draw"`` or ``"inclusion"`` (`PROPOSALS`). Defaults to
            ``"per_draw"``.

    Returns:
        `[batch]` weights, with zero gradient (stop-gradient).

    >>> w = corrected_weight(np.array([2.0]), np.log([11.7957]), np.array([2]))
    >>> round(float(keras.ops.convert_to_numpy(w)[0]), 3)
    0.444
    """
    check_proposal(proposal)
    positive_logits = ops.convert_to_tensor(positive_logits)
    negative_lse = ops.cast(negative_lse, positive_logits.dtype)
    num_valid = ops.cast(num_valid, positive_logits.dtype)
    has_negative = num_valid > 0
    safe_lse = ops.where(has_negative, negative_lse, positive_logits)
    if proposal == "per_draw":
        safe_lse = safe_lse - ops.log(ops.where(has_negative, num_valid,
                                                ops.ones_like(num_valid)))
    weight = ops.stop_gradient(ops.sigmoid(safe_lse - positive_logits))
    return ops.where(has_negative, weight, ops.zeros_like(weight))


def corrected_from_logsumexp(positive_logits, negative_lse, num_valid,
                             proposal: str = "per_draw"):
    """``-w (s_p - lse)`` with ``w = sg(1 - P)`` (`corrected_weight`, with its
    ``proposal``); rows with no valid negative give 0, with zero gradient.

    ``lse = log sum_i e^{s_i - log Q'(d_i)}`` over the ``num_valid`` negatives.
    """
    has_negative = ops.cast(num_valid, positive_logits.dtype) > 0
    safe_lse = ops.where(has_negative, negative_lse, positive_logits)
    weight = corrected_weight(positive_logits, safe_lse, num_valid, proposal)
    loss = weight * (safe_lse - positive_logits)
    return ops.where(has_negative, loss, ops.zeros_like(loss))


def log_complement(log_q):
    """``log(1 - Q)`` from ``log Q``, with ``Q`` capped at ``1 - COMPLEMENT_EPSILON``.

    The same function as `tfrs_logq.proposal.log_complement`.

    >>> log_1_minus_q = keras.ops.convert_to_numpy(log_complement(np.log([0.5, 0.75])))
    >>> np.round(log_1_minus_q.astype("float64"), 4).tolist()
    [-0.6931, -1.3863]
    """
    log_q = ops.convert_to_tensor(log_q)
    q_max = constant_like(1.0 - COMPLEMENT_EPSILON, log_q)
    q = ops.exp(log_q)
    # `where`, not `minimum`: Keras 3.15's PyTorch `minimum` returns float32 for two float64s.
    return ops.log1p(-ops.where(q > q_max, q_max, q))


def excluded_log_q(negative_log_q, positive_log_q):
    """``log Q'(d) = log Q(d) - log(1 - Q(p))``: the proposal with the positive excluded.

    What ``"corrected"`` takes as ``negative_log_q`` with per-draw proposals
    (`tfrs_logq.proposal.excluded_log_q`); ``Q(p)`` is capped as in `log_complement`.

    Args:
        negative_log_q: float tensor, `[batch, n]` or `[n]` (shared by the rows).
            ``log Q(d_i)`` of the negatives.
        positive_log_q: float tensor, `[batch]`. ``log Q(p)`` of each row's positive.

    Returns:
        `[batch, n]` ``log Q'(d_i)``.

    >>> log_q_prime = excluded_log_q(np.log([[0.1, 0.2]]), np.log([0.5]))
    >>> np.round(keras.ops.convert_to_numpy(log_q_prime).astype("float64"), 4).tolist()
    [[-1.6094, -0.9163]]
    """
    negative_log_q = ops.convert_to_tensor(negative_log_q)
    positive_log_q = ops.convert_to_tensor(positive_log_q)
    if len(ops.shape(positive_log_q)) != 1:
        raise ValueError("`positive_log_q` must be `[batch]`, received shape "
                         f"{_shape(positive_log_q)}.")
    _check_rank(negative_log_q, "negative_log_q", (1, 2))
    if len(ops.shape(negative_log_q)) == 1:
        negative_log_q = negative_log_q[None, :]
    return negative_log_q - ops.cast(log_complement(positive_log_q), negative_log_q.dtype)[:, None]


def inclusion_log_q(log_q, num_draws):
    """``log(1 - (1 - Q)^B)``: the log probability that ``B`` draws include ``d`` at least once.

    The proposal behind deduplicated in-batch negatives: a batch of ``B`` draws
    with ``Q = 0.01`` holds the item with probability ``1 - 0.99^B`` (0.634 at
    ``B = 100``), not ``B * Q``. ``Q`` is capped as in `log_complement`. The same
    function as `tfrs_logq.proposal.inclusion_log_q`.

    >>> log_pi = keras.ops.convert_to_numpy(inclusion_log_q(np.log([0.01]), 100))
    >>> round(float(np.exp(log_pi[0])), 3)
    0.634
    """
    log_q = ops.convert_to_tensor(log_q)
    if isinstance(num_draws, (int, float)):  # static: no tensor made from a Python number
        num_draws = float(num_draws)
    else:
        num_draws = ops.cast(num_draws, log_q.dtype)
    return ops.log(-ops.expm1(log_complement(log_q) * num_draws))


def sampled_softmax_loss(
    positive_logits,
    negative_logits,
    *,
    correction: str,
    negative_log_q=None,
    positive_log_q=None,
    is_negative=None,
    proposal: str = "per_draw",
    validate: bool = True,
):
    """Per-example sampled softmax loss with the chosen logQ correction.

    Args:
        positive_logits: float tensor, `[batch]`. ``s_p``, the positive's logit.
        negative_logits: float tensor, `[batch, n]`. ``s_i``, the negatives'
            logits.
        correction: str. One of ``"none"``, ``"logq-tfrs"`` or
            ``"logq-official"`` (standard, Yi et al. 2019, as TFRS and as the
            paper's official code compute it) or ``"corrected"`` (Khrylchenko
            et al. 2025); see the module docstring.
        negative_log_q: float tensor, `[batch, n]` or `[n]`. ``log Q(d_i)`` for
            the standard forms and ``log Q'(d_i)`` (the proposal without the
            positive, `excluded_log_q`) for ``"corrected"``; with
            ``proposal="inclusion"`` ``log pi(d_i)``. Required for all three;
            ignored for ``"none"``. Defaults to `None`.
        positive_log_q: float tensor, `[batch]`. ``log Q(p)``: required for
            ``"logq-tfrs"`` (the positive's denominator term corrected), refused
            by the others. Defaults to `None`.
        is_negative: bool tensor, `[batch, n]`. `False` marks an entry that is
            not a negative (accidental hit, duplicate, padding); such entries
            may hold anything, inf and NaN included, and get zero gradient.
            Defaults to `None` (all `True`).
        proposal: str. What ``negative_log_q`` is the log of, for
            ``"corrected"``'s weight (`PROPOSALS`): ``"per_draw"`` (``Q'(d)`` of
            one of ``n`` draws, the paper) or ``"inclusion"`` (``pi(d)``, the
            chance that ``d`` is in the row's set of negatives, as for
            deduplicated draws: no positive to exclude, and the weight's
            normaliser is the Horvitz-Thompson sum, `corrected_weight`). The
            standard forms read ``negative_log_q`` as given. The argument of
            `tfrs_logq.losses.sampled_softmax_loss`. Defaults to
            ``"per_draw"``.
        validate: bool. Refuse ``log Q > 0`` (`check_log_q`). `False` skips
            the check, for callers that checked their ``log Q`` tables once,
            on the host: under `jax.jit` the check is a host callback on every
            step. Defaults to `True`.

    Returns:
        `[batch]` loss in float32 (float64 if an input is float64; float16 and
        bfloat16 inputs are computed in float32). A row with no valid negative
        has loss 0: for ``"corrected"`` with zero gradients, for ``"none"`` and
        ``"logq-official"`` it is the softmax over the positive alone.

    Raises:
        ValueError: on an unknown correction (a bare ``"logq"`` among them) or
            proposal, a missing ``negative_log_q``, ``positive_log_q`` missing for
            ``"logq-tfrs"`` or given to another correction, a
            non-floating input, shapes that do not agree, or a ``log Q``
            above 0 (``negative_log_q`` where ``is_negative`` is True, and
            ``positive_log_q``; `check_log_q` says how each backend reports
            it while tracing).

    Example:

    ```python
    import numpy as np
    from keras_logq.losses import sampled_softmax_loss

    # s_p = 2, negatives s = 0, 1 with Q = 0.1, 0.2 and Q(p) = 0.5:
    # log Q' = log(Q / (1 - Q(p))) = log 0.2, log 0.4; the loss is 0.207.
    loss = sampled_softmax_loss(
        np.array([2.0]),
        np.array([[0.0, 1.0]]),
        correction="corrected",
        negative_log_q=np.log([[0.2, 0.4]]),
    )
    ```
    """
    return _sampled_softmax_loss(
        positive_logits, negative_logits, correction=correction, negative_log_q=negative_log_q,
        positive_log_q=positive_log_q, is_negative=is_negative, check=bool(validate),
        proposal=proposal,
    )


def _sampled_softmax_loss(
    positive_logits, negative_logits, *, correction, negative_log_q, positive_log_q,
    is_negative, check: bool, lse_offset=None, proposal: str = "per_draw",
):
    """`sampled_softmax_loss`; ``check=False`` skips the ``log Q <= 0`` checks (for callers
    that checked their own inputs: `CorrectedRetrieval` checks ``Q``, not the ``Q'`` it
    derives). ``lse_offset`` (`[batch]`, corrected only) is added to each row's
    log-sum-exp: ``log(1 - Q(p))`` turns ``lse(s - log Q)`` into ``lse(s - log Q')``
    without a `[batch, n]` ``log Q'``."""
    check_correction(correction)
    check_proposal(proposal)
    if positive_log_q is None and correction == "logq-tfrs":
        raise ValueError("`positive_log_q` is required for correction='logq-tfrs' (the "
                         "positive's logit is corrected too); correction='logq-official' "
                         "leaves it uncorrected.")
    if positive_log_q is not None and correction != "logq-tfrs":
        raise ValueError(f"`positive_log_q` is only used by correction='logq-tfrs'; "
                         f"correction={correction!r} leaves the positive uncorrected or, "
                         "'corrected', out of the denominator: drop it.")
    positive_logits = ops.convert_to_tensor(positive_logits)
    negative_logits = ops.convert_to_tensor(negative_logits)
    if negative_log_q is not None:
        negative_log_q = ops.convert_to_tensor(negative_log_q)
    if positive_log_q is not None:
        positive_log_q = ops.convert_to_tensor(positive_log_q)
    dtype = compute_dtype_for(positive_logits, negative_logits, negative_log_q, positive_log_q)

    s_p = _as_float(positive_logits, "positive_logits", dtype)
    s_n = _as_float(negative_logits, "negative_logits", dtype)
    _check_rank(s_p, "positive_logits", (1,))
    _check_rank(s_n, "negative_logits", (2,))
    batch, num_neg = _shape(s_p)[0], _shape(s_n)[1]
    _check_dim(s_n, "negative_logits", 0, batch, "rows (must match `positive_logits`)")

    if is_negative is None:
        mask = ops.ones_like(s_n, dtype="bool")
    else:
        mask = ops.convert_to_tensor(is_negative)
        if _dtype_name(mask) != "bool":
            raise ValueError(f"`is_negative` must be bool, received dtype {_dtype_name(mask)}.")
        _check_rank(mask, "is_negative", (2,))
        _check_dim(mask, "is_negative", 0, batch, "rows")
        _check_dim(mask, "is_negative", 1, num_neg, "columns (must match `negative_logits`)")

    masked = constant_like(masked_value(dtype), s_n)
    if correction == "none":
        logits = ops.concatenate([s_p[:, None], ops.where(mask, s_n, masked)], axis=1)
        return row_logsumexp(logits) - s_p

    if negative_log_q is None:
        raise ValueError(f"`negative_log_q` is required for correction={correction!r}.")
    log_q = _as_float(negative_log_q, "negative_log_q", dtype)
    _check_rank(log_q, "negative_log_q", (1, 2))
    if len(_shape(log_q)) == 1:
        _check_dim(log_q, "negative_log_q", 0, num_neg, "entries (must match negatives)")
        log_q = log_q[None, :]
    else:
        _check_dim(log_q, "negative_log_q", 0, batch, "rows")
        _check_dim(log_q, "negative_log_q", 1, num_neg, "columns (must match negatives)")
    if check:
        log_q = check_log_q(log_q, "negative_log_q", where=mask)
    # Masked entries may hold anything (inf, NaN): `where` drops them, value and gradient.
    adjusted = ops.where(mask, s_n - log_q, masked)

    if correction in ("logq-tfrs", "logq-official"):
        positive_term = s_p
        if correction == "logq-tfrs":
            pos_q = _as_float(positive_log_q, "positive_log_q", dtype)
            _check_rank(pos_q, "positive_log_q", (1,))
            _check_dim(pos_q, "positive_log_q", 0, batch, "entries (must match batch)")
            if check:
                pos_q = check_log_q(pos_q, "positive_log_q")
            positive_term = s_p - pos_q
        return row_logsumexp(ops.concatenate([positive_term[:, None], adjusted], axis=1)) - s_p

    num_valid = _count_true(mask)
    lse = row_logsumexp(adjusted)
    if lse_offset is not None:
        lse = lse + lse_offset
    return corrected_from_logsumexp(s_p, lse, num_valid, proposal)


def _on_diagonal(num_queries, num_candidates):
    rows = ops.arange(num_queries)[:, None]
    cols = ops.arange(num_candidates)[None, :]
    return ops.equal(rows, cols)


def _at_positive(values, is_positive):
    """`[batch]`: each row's value at its positive, for `[1 or batch, num_candidates]` values."""
    zero = ops.zeros((), values.dtype)
    return ops.sum(ops.where(is_positive, values, zero), axis=1)


def positives_from_labels(labels, num_candidates=None):
    """`[batch, num_candidates]` bool, True at each row's largest label (its one positive).

    Keras-RS's retrieval examples pass ``labels = keras.ops.eye(batch, num_candidates)``;
    that gives the diagonal.

    >>> keras.ops.convert_to_numpy(positives_from_labels(np.array([[0.0, 1.0], [1.0, 0.0]])))
    array([[False,  True],
           [ True, False]])
    """
    labels = ops.convert_to_tensor(labels)
    if len(ops.shape(labels)) != 2:
        raise ValueError(
            "`labels` must be `[batch_size, num_candidates]` (one positive per row), "
            f"received shape {tuple(ops.shape(labels))}."
        )
    num_candidates = ops.shape(labels)[1] if num_candidates is None else num_candidates
    return ops.equal(ops.arange(num_candidates)[None, :], ops.argmax(labels, axis=1)[:, None])


def resolve_log_q(
    candidate_sampling_probability=None,
    candidate_log_sampling_probability=None,
    *,
    min_sampling_probability: float = MIN_PROBABILITY,
    dtype: str = "float32",
):
    """``log Q`` from one of the two names, checked (``Q <= 1``); None when neither is given.

    ``candidate_sampling_probability`` (``Q``, TFRS and Keras-RS) is clipped to
    ``[min_sampling_probability, 1]`` before the log; ``candidate_log_sampling_probability``
    (``log Q``, tfrs_logq) is used as given.

    Raises:
        ValueError: both given, or (for concrete values) ``Q`` outside ``[0, 1]`` /
            ``log Q > 0``; see `check_log_q` for traced values.
    """
    both = candidate_sampling_probability is not None
    if both and candidate_log_sampling_probability is not None:
        raise ValueError(
            "Pass one of `candidate_sampling_probability` (Q) and "
            "`candidate_log_sampling_probability` (log Q), not both."
        )
    if candidate_log_sampling_probability is not None:
        log_q = _as_float(ops.convert_to_tensor(candidate_log_sampling_probability),
                                 "candidate_log_sampling_probability", dtype)
        return check_log_q(log_q, "candidate_log_sampling_probability")
    if candidate_sampling_probability is not None:
        return log_q_from_probability(candidate_sampling_probability,
                                             "candidate_sampling_probability",
                                             min_sampling_probability, dtype)
    return None


def retrieval_loss(
    scores,
    *,
    correction: str,
    log_q=None,
    candidate_ids=None,
    is_negative=None,
    is_positive=None,
    remove_accidental_hits: bool = True,
    deduplicate: bool = False,
    proposal: str = "per_draw",
):
    """`[batch_size]` losses of a score matrix: the shared body of the layer and the loss.

    Args:
        scores: float tensor, `[batch_size, num_candidates]`, already divided by the
            temperature.
        correction: str. ``"none"``, ``"logq-tfrs"``, ``"logq-official"`` or
            ``"corrected"``.
        log_q: float tensor, `[num_candidates]` or `[batch_size, num_candidates]`.
            ``log Q(d)``, already checked (`resolve_log_q`). Required unless
            ``"none"``.
        candidate_ids: int tensor, `[num_candidates]` or
            `[batch_size, num_candidates]`. Required to remove hits or duplicates.
        is_negative: bool tensor, `[batch_size, num_candidates]`. False drops a
            candidate from the row's negatives. Defaults to `None`.
        is_positive: bool tensor, `[batch_size, num_candidates]`, one True a row.
            Defaults to `None` (the diagonal).
        remove_accidental_hits: bool. Always on for ``"corrected"``.
        deduplicate: bool. Count each id once as a negative (1-D ids).
        proposal: str. What ``log_q`` holds (`PROPOSALS`): ``"per_draw"`` ``log Q(d)``,
            from which ``"corrected"`` derives ``log Q'`` per row, or ``"inclusion"``
            ``log pi(d)``, used as given with the Horvitz-Thompson weight.
    """
    check_proposal(proposal)
    dtype = compute_dtype_for(scores)
    scores = ops.cast(scores, dtype)
    num_queries, num_candidates = ops.shape(scores)
    # The positives on the diagonal (in-batch): taken by slicing, not by `[B, n]` masked
    # sums (what `_at_positive` costs for any other layout).
    diagonal = is_positive is None
    if diagonal:
        if (isinstance(num_queries, int) and isinstance(num_candidates, int)
                and num_candidates < num_queries):
            raise ValueError(
                "With the positives on the diagonal (no `labels`), `scores` needs at least "
                "as many candidates as rows, the first `batch_size` candidates being the "
                f"rows' positives; received shape {(num_queries, num_candidates)}."
            )
        is_positive = _on_diagonal(num_queries, num_candidates)

    def at_positive(values):
        if diagonal and len(ops.shape(values)) == 1:
            return values[:num_queries]
        if diagonal:
            return ops.diagonal(values[:, :num_queries])
        values_2d = values[None, :] if len(ops.shape(values)) == 1 else values
        return _at_positive(values_2d, is_positive)

    positive_logits = at_positive(scores)

    negatives = ops.logical_not(is_positive)
    remove_hits = correction == "corrected" or remove_accidental_hits
    if (remove_hits or deduplicate) and candidate_ids is None:
        reason = (
            "correction='corrected' always removes accidental hits"
            if correction == "corrected"
            else "accidental hit removal or deduplication is on"
        )
        raise ValueError(f"`candidate_ids` is required: {reason}.")
    if remove_hits:
        ids = ops.convert_to_tensor(candidate_ids)
        hits = accidental_hit_mask(at_positive(ids), ids)
        # The positive's own column is a hit of itself: the mask already leaves it out.
        negatives = hits if diagonal else ops.logical_and(negatives, hits)
    if deduplicate:
        ids = ops.convert_to_tensor(candidate_ids)
        if len(ops.shape(ids)) != 1:
            raise ValueError(
                "`deduplicate=True` needs `candidate_ids` of shape `[num_candidates]`, "
                f"received shape {tuple(ops.shape(ids))}."
            )
        negatives = ops.logical_and(negatives, first_occurrence_mask(ids)[None, :])
    if is_negative is not None:
        is_negative = ops.convert_to_tensor(is_negative)
        if keras.backend.standardize_dtype(is_negative.dtype) != "bool":
            raise ValueError(f"`is_negative` must be bool, received dtype {is_negative.dtype}.")
        negatives = ops.logical_and(negatives, is_negative)

    if correction == "none":
        return _sampled_softmax_loss(
            positive_logits, scores, correction="none", negative_log_q=None,
            positive_log_q=None, is_negative=negatives, check=False,
        )
    if log_q is None:
        raise ValueError(
            f"correction={correction!r} needs `candidate_sampling_probability` "
            "(or `candidate_log_sampling_probability`); received neither."
        )
    log_q = ops.cast(log_q, dtype)
    positive_log_q = at_positive(log_q)
    if correction == "logq-tfrs":
        # TFRS's form: -log softmax(s - log Q)[p], i.e. log Q(p) in the numerator
        # too (a constant: the gradient is that of sampled_softmax_loss).
        return _sampled_softmax_loss(
            positive_logits, scores, correction="logq-tfrs", negative_log_q=log_q,
            positive_log_q=positive_log_q, is_negative=negatives, check=False,
        ) + positive_log_q
    if correction == "logq-official":
        # The paper's code: the positive's logit uncorrected, numerator and denominator.
        return _sampled_softmax_loss(
            positive_logits, scores, correction="logq-official", negative_log_q=log_q,
            positive_log_q=None, is_negative=negatives, check=False,
        )
    if proposal == "inclusion":  # pi(d): no positive to exclude
        return _sampled_softmax_loss(
            positive_logits, scores, correction="corrected", negative_log_q=log_q,
            positive_log_q=None, is_negative=negatives, check=False, proposal="inclusion",
        )
    # Q is checked (<= 1); Q' = Q / (1 - Q(p)) is not: with proposals of different
    # sources (mixed negatives) a negative's Q' may exceed 1, as in tfrs_logq.
    # log Q'(d) = log Q(d) - log(1 - Q(p)) is constant along a row, so
    # lse(s - log Q') = lse(s - log Q) + log(1 - Q(p)): the [batch, n] log Q' is not built.
    return _sampled_softmax_loss(
        positive_logits, scores, correction="corrected", negative_log_q=log_q,
        positive_log_q=None, is_negative=negatives, check=False,
        lse_offset=log_complement(positive_log_q),
    )
