"""Which candidates count as negatives: accidental hits and duplicates, as bool masks.

One convention throughout: ``is_negative[i, j]`` is True when candidate ``j``
counts as a negative of query ``i``. Static shapes only (pairwise comparisons),
so the masks compile under `jit_compile` on every backend.

Unlike Keras-RS 0.4's `RemoveAccidentalHits` (which adds about 1e-40 to a hit's
logit, a no-op in float32, and compares every row with row 0's positive when
the ids are 2-D), a hit here is *removed*: the loss drops it from the sum,
value and gradient.
"""

from __future__ import annotations

import keras
from keras import ops


def _check_integer_ids(ids, name: str):
    ids = ops.convert_to_tensor(ids)
    kind = keras.backend.standardize_dtype(ids.dtype)
    if "int" not in kind:
        raise ValueError(f"`{name}` must be an integer tensor, received dtype {kind}.")
    return ids


def accidental_hit_mask(positive_ids, candidate_ids):
    """`[batch, num_candidates]` bool, False where a candidate has the row's positive id.

    Args:
        positive_ids: int tensor, `[batch]`. Each row's positive id.
        candidate_ids: int tensor, `[num_candidates]` (shared by every row) or
            `[batch, num_candidates]` (one list per row).

    Returns:
        `[batch, num_candidates]` bool: `True` where ``candidate_ids`` differs
        from the row's positive id.

    Example:

    ```python
    accidental_hit_mask(np.array([4, 9]), np.array([4, 9, 4]))
    # [[False, True, False], [True, False, True]]
    ```
    """
    positive_ids = _check_integer_ids(positive_ids, "positive_ids")
    candidate_ids = _check_integer_ids(candidate_ids, "candidate_ids")
    if len(ops.shape(positive_ids)) != 1:
        raise ValueError(
            f"`positive_ids` must be `[batch]`, received shape {tuple(ops.shape(positive_ids))}."
        )
    rank = len(ops.shape(candidate_ids))
    if rank not in (1, 2):
        raise ValueError(
            "`candidate_ids` must be `[num_candidates]` or `[batch, num_candidates]`, "
            f"received shape {tuple(ops.shape(candidate_ids))}."
        )
    candidate_ids = ops.cast(candidate_ids, "int64" if _is64(positive_ids) else "int32")
    positive_ids = ops.cast(positive_ids, candidate_ids.dtype)
    if rank == 1:
        candidate_ids = candidate_ids[None, :]
    return ops.not_equal(positive_ids[:, None], candidate_ids)


def _is64(ids) -> bool:
    return keras.backend.standardize_dtype(ids.dtype) in ("int64", "uint64")


def first_occurrence_mask(candidate_ids):
    """`[num_candidates]` bool, True at the first position of each distinct id.

    Pairwise (`[n, n]` comparisons), so the shape is static; meant for the few
    hundred to few thousand candidates of a batch.

    Args:
        candidate_ids: int tensor, `[num_candidates]`.

    Example:

    ```python
    first_occurrence_mask(np.array([7, 3, 7, 5]))  # [True, True, False, True]
    ```
    """
    ids = _check_integer_ids(candidate_ids, "candidate_ids")
    if len(ops.shape(ids)) != 1:
        raise ValueError(
            f"`candidate_ids` must be `[num_candidates]`, received shape {tuple(ops.shape(ids))}."
        )
    positions = ops.arange(ops.shape(ids)[0])
    equal = ops.equal(ids[:, None], ids[None, :])  # [i, j]: ids[i] == ids[j]
    earlier = positions[None, :] < positions[:, None]  # [i, j]: j comes before i
    return ops.logical_not(ops.any(ops.logical_and(equal, earlier), axis=1))
