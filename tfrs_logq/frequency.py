"""Item-frequency estimators that give ``log Q(d)`` in-graph.

Each estimator is a `tf.Module` whose state lives in non-trainable
`tf.Variable`s, so it checkpoints with `tf.train.Checkpoint` and is updated
inside a `tf.function` training step. ``Q(d)`` is the per-example unigram
probability of item ``d`` (``#d / N``), the proposal of in-batch sampling.

- `ExactFrequency`: exact counts (the academic setup; built from a dataset).

Every estimator takes the ids you have, integers or strings (titles, hashes): the hashed
ones hash strings in-graph, `ExactFrequency` keeps a vocabulary of them. ``probability``
gives ``Q(d)`` for TFRS's ``candidate_sampling_probability``.
- `CountMinSketch`: depth x width counters (Cormode & Muthukrishnan 2005).
- `StreamingFrequency`: the hashed last-seen / mean-gap estimator of Yi et al.
  (RecSys 2019, Algorithm 3) for non-stationary streams.

Under a `tf.distribute` strategy the state is mirrored (created in the
strategy's scope). `update` called inside a replica first all-gathers the ids
of every replica, so each copy sees the global stream and every replica reads
the same, global estimate in its step; the update is taken from the first
replica (``ONLY_FIRST_REPLICA``), so the copies never diverge. Count-min
sketches kept by independent jobs merge with `CountMinSketch.merge`.

Under `tf.distribute.ParameterServerStrategy` the state lives on the parameter servers
(split over them when the strategy's ``variable_partitioner`` splits it) and every worker
updates it in its own steps, concurrently. `ExactFrequency` and `CountMinSketch` add their
ids with ``ResourceScatterNdAdd``, which holds the variable's (each shard's) exclusive lock:
``Variable.scatter_add`` (``ResourceScatterAdd``) holds it shared, and two workers adding to
the same cells at once lose additions (TF 2.20, two workers adding 200,000 ids per step to
16 cells for 30 steps: 176 to 24,947 of 6,000,000 lost, in each of 3 runs). Their counts
are exact there: every id of every step counted once. A step's ``Q`` is read from counts
that hold every step finished before it and its own, and possibly part of a concurrent
one; the total is added before the counts and read after them, so the counts a step reads
never exceed the total it reads (``Q(d) <= 1``). Reads (`count`, `log_q`) of a split state
gather from each shard the ids it holds. `StreamingFrequency`'s updates read and write back
its state (not atomic): concurrent steps there can overwrite each other's updates
(docs/scaling.md, "Parameter servers").
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import numpy as np
import tensorflow as tf

# The one class that tells a plain resource variable (whose ResourceScatterNdAdd takes the
# exclusive lock) from a distributed or sharded one; TF 2.20 has no public name for it.
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops

from tfrs_logq._util import universal_hash


def _state_variable(initial, name: str) -> tf.Variable:
    return tf.Variable(
        initial,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


def _shard_of(variable, indices: tf.Tensor):
    """``(shards, which, local)``: the shards of a `ShardedVariable` (split along axis 0,
    as `tf.distribute.ParameterServerStrategy`'s partitioners split), the shard each of
    ``indices`` (`[n]` int64) falls into and its row there."""
    shards = list(variable.variables)
    offsets = np.cumsum([0] + [int(v.shape[0]) for v in shards])
    which = tf.searchsorted(tf.constant(offsets[1:-1], tf.int64), indices, side="right")
    local = indices - tf.gather(tf.constant(offsets[:-1], tf.int64), which)
    return shards, tf.cast(which, tf.int32), local


def _scatter_add(variable, indices: tf.Tensor, updates: tf.Tensor):
    """``variable[indices] += updates`` (``indices`` `[n]` int64, duplicates summed),
    exact under concurrent writers.

    ``Variable.scatter_add`` runs ``ResourceScatterAdd``, which TensorFlow runs under the
    variable's *shared* lock: two concurrent ones (two workers of a
    `ParameterServerStrategy` updating the same parameter server) interleave their
    read-add-writes and lose additions. ``ResourceScatterNdAdd`` holds the variable's
    exclusive lock. A `ShardedVariable` is updated shard by shard (each shard's update
    atomic); a mirrored variable (synchronous strategies: one update at a time) as before.
    """
    if isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        shards, which, local = _shard_of(variable, indices)
        parts = tf.dynamic_partition(local, which, len(shards))
        values = tf.dynamic_partition(updates, which, len(shards))
        return [shard.scatter_nd_add(part[:, None], value)
                for shard, part, value in zip(shards, parts, values)]
    if isinstance(variable, _resource_variable_ops.BaseResourceVariable):
        return variable.scatter_nd_add(indices[:, None], updates)
    return variable.scatter_add(tf.IndexedSlices(updates, indices))


def _gather(variable, indices: tf.Tensor) -> tf.Tensor:
    """``tf.gather(variable, indices)``; from a `ShardedVariable`, each shard's rows read
    on its own parameter server (``tf.gather`` would first concatenate every shard: the
    whole table, each step)."""
    if not isinstance(variable, tf.__internal__.distribute.ShardedVariable):
        return tf.gather(variable, indices)
    flat = tf.reshape(indices, [-1])
    shards, which, local = _shard_of(variable, flat)
    parts = tf.dynamic_partition(local, which, len(shards))
    positions = tf.dynamic_partition(tf.range(tf.size(flat)), which, len(shards))
    rows = [tf.gather(shard, part) for shard, part in zip(shards, parts)]
    return tf.reshape(tf.dynamic_stitch(positions, rows),
                      tf.concat([tf.shape(indices), tf.shape(rows[0])[1:]], 0))


def _global_ids(ids: tf.Tensor) -> tf.Tensor:
    """Inside a replica of a multi-replica strategy: the ids of all replicas."""
    ctx = tf.distribute.get_replica_context()
    if ctx is not None and ctx.num_replicas_in_sync > 1:
        return ctx.all_gather(ids, axis=0)
    return ids


def _as_ids(ids) -> tf.Tensor:
    """`[n]` int64 keys of integer or string ids: integers as they are, strings by their
    64-bit fingerprint (`tf.strings.to_hash_bucket_fast`), for the hashed estimators."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype == tf.string:
        return tf.reshape(tf.strings.to_hash_bucket_fast(ids, _STRING_KEYS), [-1])
    if not ids.dtype.is_integer:
        raise ValueError(
            f"`ids` must be integer or string ids, received dtype {ids.dtype.name}.")
    return tf.reshape(tf.cast(ids, tf.int64), [-1])


# String ids are hashed into [0, 2^63 - 1); the hashes then reduce them mod 2^31 - 1.
_STRING_KEYS = (1 << 63) - 1


class _Estimator(tf.Module):
    """What every estimator gives: ``log Q(d)`` (`log_q`) and ``Q(d)`` itself."""

    def log_q(self, ids) -> tf.Tensor:  # pragma: no cover - every estimator defines it
        raise NotImplementedError

    def probability(self, ids) -> tf.Tensor:
        """`[n]` float32 ``Q(d)``: what TFRS's ``candidate_sampling_probability`` takes."""
        return tf.exp(self.log_q(ids))


class _UniversalHashes(tf.Module):
    """``depth`` hashes ``((a x + b) mod p) mod width`` with fixed seeds
    (`tfrs_logq._util.universal_hash`, shared with the batch pipeline's Statistics)."""

    def __init__(self, depth: int, width: int, seed: int, name: str = "hashes") -> None:
        super().__init__(name=name)
        a, b = universal_hash.hash_coefficients(depth, seed)
        self.depth = int(depth)
        self.width = int(width)
        self.a = tf.constant(a, tf.int64)
        self.b = tf.constant(b, tf.int64)

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        """`[n]` int64 ids -> `[depth, n]` indices ``r * width + h_r(id)`` into a flat
        `[depth * width]` state array."""
        return universal_hash.flat_cells(ids, self.a, self.b, self.width)


class ExactFrequency(_Estimator):
    """Exact item counts: ``Q(d) = #d / N``.

    Keyed by integer ids in ``[0, num_items)``, or by the ids you have (strings or
    integers) through ``vocabulary``: `from_dataset` and `from_counts` build it from
    a dataset of ids or from ``(ids, counts)``, with no lookup layer of your own:

    >>> titles = tf.data.Dataset.from_tensor_slices(["Heat", "Up", "Heat", "Heat"])
    >>> frequency = ExactFrequency.from_dataset(titles)
    >>> frequency.probability(tf.constant(["Heat", "Up"])).numpy()
    array([0.75, 0.25], dtype=float32)

    Args:
      num_items: int. Size of the id space; ids are in ``[0, num_items)``. With a
        ``vocabulary``, its length (may be left out).
      min_count: float. Counts are floored at this value before the log so an
        unseen item gets a finite ``log Q``. Defaults to 1.
      name: str. Module name.
      vocabulary: the distinct ids (strings or integers) the counts are kept for, in
        order; `update` refuses an id outside it, `log_q` gives it ``min_count``.
        Defaults to None (integer ids are their own positions).
    """

    def __init__(self, num_items: Optional[int] = None, min_count: float = 1.0,
                 name: str = "exact_frequency", vocabulary=None):
        super().__init__(name=name)
        self._table = None
        if vocabulary is not None:
            keys = tf.reshape(tf.convert_to_tensor(np.asarray(vocabulary)), [-1])
            if keys.dtype != tf.string and not keys.dtype.is_integer:
                raise ValueError("`vocabulary` must hold string or integer ids, received "
                                 f"dtype {keys.dtype.name}.")
            keys = keys if keys.dtype == tf.string else tf.cast(keys, tf.int64)
            size = int(keys.shape[0])
            if size != len(np.unique(keys.numpy())):
                raise ValueError("`vocabulary` must list each id once.")
            if num_items is not None and int(num_items) != size:
                raise ValueError(f"`num_items` ({num_items}) must equal the vocabulary's "
                                 f"length ({size}); leave it out.")
            num_items = size
            self._table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(keys, tf.range(size, dtype=tf.int64)),
                default_value=-1)
        if num_items is None or int(num_items) < 1:
            raise ValueError(f"`num_items` must be a positive int, received {num_items!r}.")
        if not min_count > 0:
            raise ValueError(f"`min_count` must be positive, received {min_count!r}.")
        self.num_items = int(num_items)
        self.min_count = float(min_count)
        self.counts = _state_variable(tf.zeros([self.num_items], tf.float64), "counts")
        self.total = _state_variable(tf.zeros([], tf.float64), "total")
        # The vocabulary's fingerprint is checkpointed with the counts: counts restored into
        # an estimator of another vocabulary (the same length, other ids or order) would
        # belong to other ids; `update` and `count` refuse them.
        self._vocabulary_key = tf.constant(
            0 if self._table is None else _fingerprint(keys), tf.int64)
        self.vocabulary_fingerprint = _state_variable(self._vocabulary_key, "vocabulary")

    def _check_vocabulary(self):
        return tf.debugging.assert_equal(
            self.vocabulary_fingerprint, self._vocabulary_key,
            message="these counts were saved with another vocabulary: build the estimator "
                    "with the vocabulary it was saved with")

    @property
    def vocabulary(self) -> Optional[np.ndarray]:
        """The ids counted, in order, or None when integer ids are their own positions."""
        if self._table is None:
            return None
        keys, values = self._table.export()
        return keys.numpy()[np.argsort(values.numpy())]

    def _positions(self, ids) -> tf.Tensor:
        """`[n]` int64 positions of ``ids`` in the counts (-1: not in the vocabulary)."""
        ids = tf.reshape(tf.convert_to_tensor(ids), [-1])
        with tf.control_dependencies([self._check_vocabulary()]):
            ids = tf.identity(ids)
        if self._table is None:
            return _as_ids(ids)
        if (ids.dtype == tf.string) != (self._table.key_dtype == tf.string):
            raise ValueError(f"`ids` are {ids.dtype.name} but the vocabulary holds "
                             f"{self._table.key_dtype.name} ids.")
        if ids.dtype != tf.string:
            ids = _as_ids(ids)
        return self._table.lookup(ids)

    @classmethod
    def from_counts(cls, counts, min_count: float = 1.0, name: str = "exact_frequency",
                    ids=None):
        """Builds the estimator from a `[num_items]` vector of counts, of the ``ids``
        (strings or integers, one per count) when given, else of ids ``0..num_items-1``."""
        counts = np.asarray(counts, dtype=np.float64).reshape(-1)
        if counts.size == 0 or (counts < 0).any() or not np.isfinite(counts).all():
            raise ValueError("`counts` must be a non-empty vector of finite, non-negative counts.")
        if ids is not None and np.asarray(ids).reshape(-1).size != counts.size:
            raise ValueError(f"`ids` has {np.asarray(ids).size} entries, `counts` "
                             f"{counts.size}: one count per id.")
        est = cls(counts.size, min_count=min_count, name=name, vocabulary=ids)
        est.counts.assign(counts)
        est.total.assign(counts.sum())
        return est

    @classmethod
    def from_dataset(
        cls,
        dataset: tf.data.Dataset,
        num_items: Optional[int] = None,
        min_count: float = 1.0,
        name: str = "exact_frequency",
    ) -> "ExactFrequency":
        """Counts every id a dataset of ids (any shape per element) yields.

        Integer ids in ``[0, num_items)`` when ``num_items`` is given; otherwise (and
        always for strings) the distinct ids seen become the vocabulary.
        """
        spec = dataset.element_spec
        if not isinstance(spec, tf.TensorSpec):
            raise ValueError("`dataset` must yield tensors of ids (map it to the id column "
                             f"first), received elements of {spec}.")
        if spec.shape.rank == 0:  # one id per element: read in large batches
            dataset = dataset.batch(1 << 16)
        if num_items is not None and spec.dtype != tf.string:
            counts = dataset.map(lambda x: _as_ids(x)).reduce(
                tf.zeros([int(num_items)], tf.int64),
                lambda acc, ids: acc + _bincount(ids, int(num_items)),
            )
            return cls.from_counts(counts.numpy(), min_count=min_count, name=name)
        if spec.dtype != tf.string and not spec.dtype.is_integer:
            raise ValueError(f"`dataset` must yield integer or string ids, received "
                             f"{spec.dtype.name}.")
        chunks = [np.asarray(ids).reshape(-1)
                  for ids in dataset.map(lambda x: tf.reshape(x, [-1])).as_numpy_iterator()]
        if not chunks or sum(c.size for c in chunks) == 0:
            raise ValueError("`dataset` yielded no ids.")
        vocabulary, counts = np.unique(np.concatenate(chunks), return_counts=True)
        return cls.from_counts(counts, min_count=min_count, name=name, ids=vocabulary)

    def update(self, ids) -> None:
        """Adds one occurrence of every id in ``ids``."""
        ids = _global_ids(self._positions(ids))
        _check_range(ids, self.num_items,
                     None if self._table is None else "ids must be in the vocabulary")
        # The total first: a concurrent reader (another worker) that sees these counts
        # sees this total too (`log_q` reads the counts before the total).
        with tf.control_dependencies([self.total.assign_add(tf.cast(tf.size(ids), tf.float64))]):
            _scatter_add(self.counts, ids, tf.ones_like(ids, tf.float64))

    def count(self, ids) -> tf.Tensor:
        """`[n]` float64 counts (0 for an id outside the vocabulary)."""
        positions = self._positions(ids)
        if self._table is None:
            _check_range(positions, self.num_items)
        counts = _gather(self.counts, tf.maximum(positions, 0))
        return tf.where(positions >= 0, counts, tf.zeros_like(counts))

    def log_q(self, ids) -> tf.Tensor:
        """`[n]` float32 ``log Q(d)`` of each id."""
        counts = self.count(ids)
        total = _read_after(self.total, counts)
        counts = tf.maximum(counts, self.min_count)
        return tf.cast(tf.math.log(counts) - tf.math.log(tf.maximum(total, 1.0)), tf.float32)


def _read_after(variable, tensor: tf.Tensor) -> tf.Tensor:
    """``variable``'s value, read once ``tensor`` (a read of other state) is computed."""
    with tf.control_dependencies([tensor]):
        return tf.identity(variable)


def _fingerprint(keys: tf.Tensor) -> int:
    """A 63-bit fingerprint of a vocabulary's ids, in order."""
    text = keys if keys.dtype == tf.string else tf.strings.as_string(keys)
    joined = tf.strings.reduce_join(tf.strings.as_string(tf.strings.length(text)) + b":"
                                    + text, separator="\x00")
    return int(tf.strings.to_hash_bucket_fast(joined, _STRING_KEYS).numpy())


def _check_range(ids: tf.Tensor, size: int, message: Optional[str] = None) -> None:
    in_range = tf.logical_and(ids >= 0, ids < size)
    tf.debugging.assert_equal(
        tf.reduce_all(in_range), True, message=message or f"ids must lie in [0, {size})"
    )


def _bincount(ids: tf.Tensor, size: int) -> tf.Tensor:
    _check_range(ids, size)
    return tf.math.bincount(ids, minlength=size, maxlength=size, dtype=tf.int64)


class CountMinSketch(_Estimator):
    """Count-min sketch of item frequencies, updated and queried in-graph.

    The estimate ``c_hat(d) = min_r C[r, h_r(d)]`` never undercounts, and
    ``c_hat(d) <= #d + epsilon * N`` with probability at least ``1 - delta``,
    where ``epsilon = e / width`` and ``delta = exp(-depth)``.

    Args:
      depth: int. Number of hash rows. Defaults to 4.
      width: int. Counters per row. Defaults to 2**20.
      seed: int. Seed of the hash functions; sketches merge only with equal
        seeds and shapes. Defaults to 0.
      name: str. Module name.

    Ids are integers or strings (a string is hashed to 64 bits first).
    """

    def __init__(self, depth: int = 4, width: int = 1 << 20, seed: int = 0, name: str = "cms"):
        super().__init__(name=name)
        if int(depth) < 1 or int(width) < 1:
            raise ValueError(f"`depth` and `width` must be positive, received {depth}, {width}.")
        self.depth, self.width, self.seed = int(depth), int(width), int(seed)
        self._hashes = _UniversalHashes(self.depth, self.width, self.seed)
        # Flat `[depth * width]`: row r occupies [r * width, (r + 1) * width).
        self.counters = _state_variable(tf.zeros([self.depth * self.width], tf.float64), "counters")
        self.total = _state_variable(tf.zeros([], tf.float64), "total")

    @classmethod
    def from_error_bound(cls, epsilon: float, delta: float, seed: int = 0, name: str = "cms"):
        """The smallest sketch with ``c_hat <= c + epsilon N`` w.p. ``>= 1 - delta``."""
        if not (0 < epsilon < 1 and 0 < delta < 1):
            raise ValueError(f"need 0 < epsilon, delta < 1, received {epsilon}, {delta}.")
        return cls(
            depth=math.ceil(math.log(1.0 / delta)),
            width=math.ceil(math.e / epsilon),
            seed=seed,
            name=name,
        )

    @classmethod
    def from_dataset(cls, dataset: tf.data.Dataset, **kwargs) -> "CountMinSketch":
        """A sketch (``kwargs`` as the constructor's) of every id a dataset of ids yields."""
        sketch = cls(**kwargs)
        for ids in dataset:
            sketch.update(ids)
        return sketch

    @property
    def epsilon(self) -> float:
        return math.e / self.width

    @property
    def delta(self) -> float:
        return math.exp(-self.depth)

    def error_bound(self) -> float:
        """``epsilon * N``: the additive over-count bound at the current total."""
        return self.epsilon * float(self.total.numpy())

    def update(self, ids, counts=None) -> None:
        """Adds ``counts`` (default 1 each) occurrences of every id in ``ids``."""
        ids = _global_ids(_as_ids(ids))
        if counts is None:
            counts = tf.ones_like(ids, tf.float64)
        else:
            counts = _global_ids(tf.reshape(tf.cast(counts, tf.float64), [-1]))
        flat = tf.reshape(self._hashes(ids), [-1])
        # The total first, as `ExactFrequency.update` (a concurrent reader's count <= total).
        with tf.control_dependencies([self.total.assign_add(tf.reduce_sum(counts))]):
            _scatter_add(self.counters, flat, tf.tile(counts, [self.depth]))

    def count(self, ids) -> tf.Tensor:
        """`[n]` float64 estimated counts (never below the true count)."""
        return tf.reduce_min(_gather(self.counters, self._hashes(_as_ids(ids))), axis=0)

    def log_q(self, ids) -> tf.Tensor:
        """`[n]` float32 ``log Q(d)``; an unseen id gets count 1."""
        counts = self.count(ids)
        total = _read_after(self.total, counts)
        counts = tf.maximum(counts, 1.0)
        return tf.cast(tf.math.log(counts) - tf.math.log(tf.maximum(total, 1.0)), tf.float32)

    def merge(self, other: "CountMinSketch") -> None:
        """Adds another worker's sketch into this one (same depth, width, seed)."""
        if (other.depth, other.width, other.seed) != (self.depth, self.width, self.seed):
            raise ValueError(
                "can only merge sketches with equal depth, width and seed: "
                f"{(self.depth, self.width, self.seed)} vs "
                f"{(other.depth, other.width, other.seed)}."
            )
        self.counters.assign_add(tf.convert_to_tensor(other.counters))
        self.total.assign_add(tf.convert_to_tensor(other.total))


class StreamingFrequency(_Estimator):
    """Streaming frequency estimation of Yi et al. (RecSys 2019), Algorithm 3.

    Keeps, for ``num_hashes`` hash functions, arrays ``A`` (step an id's bucket
    was last seen) and ``B`` (its estimated mean gap in steps). Each call of
    `update` is one step ``t``; an id seen in it updates
    ``B <- (1 - alpha) B + alpha (t - A)`` and ``A <- t``. An id seen ``c > 1``
    times in one step counts as ``c`` evenly spaced hits with gap ``(t - A) / c``
    each: ``B <- (1 - alpha)^c B + (1 - (1 - alpha)^c) (t - A) / c``. (Applying
    the hits one after another in the batch's arbitrary order, with gaps
    ``t - A, 0, ..., 0``, biases the gap of items seen several times per step
    towards 0 unless ``c * alpha`` is small: at ``c = 40``, ``alpha = 0.05`` it
    doubles their estimated probability.)

    Start-up: the gap estimate does not start from 0. A bucket's first
    sighting at step ``t`` sets ``B = t / c`` (the wait from the stream's start,
    which has the mean gap's expectation for a memoryless stream), and until a
    bucket has been seen ``1 / alpha`` times its ``B`` is the running mean of
    the gaps observed so far (learning rate ``max(alpha, 1 / n)`` after ``n``
    sightings), the exponential average afterwards. Starting the average at 0
    instead, as a literal reading of the update does, shrinks the gap of an
    item seen ``n`` times by ``1 - (1 - alpha)^n``: rare items' ``Q`` comes out
    5x to 40x too large on a 20k-item Zipf stream.

    The estimated gap is the max over hashes (collisions only shorten gaps), the per-step
    probability is ``1 / gap``, and the per-example ``Q(d)`` divides that by the
    mean number of ids per step.

    Args:
      num_buckets: int. Size ``H`` of each hashed array. Defaults to 2**20.
      num_hashes: int. Number of hash functions. Defaults to 2.
      alpha: float. Learning rate of the gap estimate. Defaults to 0.01.
      seed: int. Seed of the hash functions. Defaults to 0.
      name: str. Module name.

    Ids are integers or strings (a string is hashed to 64 bits first).
    """

    def __init__(
        self,
        num_buckets: int = 1 << 20,
        num_hashes: int = 2,
        alpha: float = 0.01,
        seed: int = 0,
        name: str = "streaming_frequency",
    ):
        super().__init__(name=name)
        if int(num_buckets) < 1 or int(num_hashes) < 1:
            raise ValueError(
                "`num_buckets` and `num_hashes` must be positive, "
                f"received {num_buckets}, {num_hashes}."
            )
        if not 0 < alpha < 1:
            raise ValueError(f"`alpha` must be in (0, 1), received {alpha!r}.")
        self.num_buckets, self.num_hashes = int(num_buckets), int(num_hashes)
        self.alpha = float(alpha)
        self._hashes = _UniversalHashes(self.num_hashes, self.num_buckets, int(seed))
        size = [self.num_hashes * self.num_buckets]  # flat, row-major by hash function
        self.last_step = _state_variable(tf.zeros(size, tf.float64), "last_step")
        self.gap = _state_variable(tf.zeros(size, tf.float64), "gap")
        self.sightings = _state_variable(tf.zeros(size, tf.float64), "sightings")
        self.step = _state_variable(tf.zeros([], tf.float64), "step")
        self.num_ids = _state_variable(tf.zeros([], tf.float64), "num_ids")

    def update(self, ids) -> None:
        """Processes one step's ids."""
        ids = _global_ids(_as_ids(ids))
        t = self.step + 1.0
        self.step.assign(t)
        self.num_ids.assign_add(tf.cast(tf.size(ids), tf.float64))
        # Distinct (hash, bucket) cells and how often each occurs in this step.
        flat = tf.reshape(self._hashes(ids), [-1])
        indices, _, occurrences = tf.unique_with_counts(flat)
        c = tf.cast(occurrences, tf.float64)
        last = tf.gather(self.last_step, indices)
        gap = tf.gather(self.gap, indices)
        seen = tf.gather(self.sightings, indices)
        # Weight kept by the old estimate after c more hits: the running mean's
        # n / (n + c) while fewer than 1 / alpha hits were seen, then (1 - alpha)^c.
        keep = tf.minimum(tf.pow(tf.constant(1.0 - self.alpha, tf.float64), c), seen / (seen + c))
        new_gap = keep * gap + (1.0 - keep) * (t - last) / c
        self.gap.scatter_update(tf.IndexedSlices(new_gap, indices))
        self.sightings.scatter_update(tf.IndexedSlices(seen + c, indices))
        self.last_step.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(c), t), indices))

    def estimated_gap(self, ids) -> tf.Tensor:
        """`[n]` float64 estimated steps between occurrences (max over hashes)."""
        cells = self._hashes(_as_ids(ids))
        gathered = tf.gather(self.gap, cells)
        seen = tf.gather(self.last_step, cells) > 0
        # A bucket never seen: at most once in all steps so far.
        gathered = tf.where(seen, gathered, tf.maximum(self.step, 1.0))
        return tf.reduce_max(gathered, axis=0)

    def log_q(self, ids) -> tf.Tensor:
        """`[n]` float32 per-example ``log Q(d) = -log(gap * ids_per_step)``."""
        gap = tf.maximum(self.estimated_gap(ids), 1e-12)
        ids_per_step = tf.maximum(self.num_ids / tf.maximum(self.step, 1.0), 1.0)
        return tf.cast(-tf.math.log(gap) - tf.math.log(ids_per_step), tf.float32)


def counts_from_ids(ids: Iterable[int], num_items: int) -> np.ndarray:
    """numpy helper: exact `[num_items]` counts of an iterable of ids."""
    return np.bincount(np.fromiter(ids, dtype=np.int64), minlength=num_items)[:num_items]


__all__ = ["CountMinSketch", "ExactFrequency", "StreamingFrequency", "counts_from_ids"]
