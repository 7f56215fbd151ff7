"""`LazyAdam`: Adam that touches only the rows of an embedding table a batch uses.

tf-keras's ``Adam.update_step`` decays both moments of *every* row of a variable
each step, even when the gradient is sparse (`tf.IndexedSlices`), so a step on a
1,000,000-row table costs about 10x a step on a 100,000-row one. `LazyAdam`
updates the moments and the values of the rows in the batch only (as TF-Addons'
and Keras 3's lazy variants do); dense gradients get the ordinary Adam update.

For a sparse gradient with rows ``r`` (duplicate ids summed first) at step ``t``:

    m[r] = b1 m[r] + (1 - b1) g[r]
    v[r] = b2 v[r] + (1 - b2) g[r]^2
    x[r] -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m[r] / (sqrt(v[r]) + eps)

This is *not* Adam's dense semantics: a row absent from a batch keeps its
moments (they do not decay) and its value (no momentum step), and the bias
correction uses the global step ``t``, not the row's own count of updates. For
a row used every step the two coincide. Example: one row, ``g = 1`` at step 1,
``lr = 0.1``: ``m = 0.1``, ``v = 0.001``, the step is
``0.1 * sqrt(0.001) / 0.1 * 0.1 / (sqrt(0.001) + 1e-7) = 0.1``.
"""

from __future__ import annotations

from typing import Iterable

import tensorflow as tf


class LazyAdam(tf.Module):
    """Adam with lazy (row-wise) updates for `tf.IndexedSlices` gradients.

    Args:
      learning_rate: float. ``lr``. Defaults to 1e-3.
      beta_1: float. ``b1``. Defaults to 0.9.
      beta_2: float. ``b2``. Defaults to 0.999.
      epsilon: float. ``eps`` (added to ``sqrt(v)``, as tf-keras does). Defaults to 1e-7.
    """

    def __init__(self, learning_rate: float = 1e-3, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, name: str = "lazy_adam") -> None:
        super().__init__(name=name)
        if not learning_rate > 0:
            raise ValueError(f"`learning_rate` must be positive, received {learning_rate!r}.")
        for arg, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{arg}` must be in [0, 1), received {value!r}.")
        self.learning_rate = float(learning_rate)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        # The moments (m, v of each variable, in creation order) are a tracked list, so
        # `tf.train.Checkpoint` saves and restores them: an optimizer built on the same
        # variables in the same order restores into the same slots. `_position` maps a
        # variable to its pair's index (ints, which the checkpoint does not track).
        self.moments: list = []
        self._position: dict = {}

    def _moments(self, var: tf.Variable) -> tuple[tf.Variable, tf.Variable]:
        key = var.ref()
        if key not in self._position:
            with tf.init_scope():
                self._position[key] = len(self.moments)
                self.moments.append(tf.Variable(tf.zeros_like(var), trainable=False, name="m"))
                self.moments.append(tf.Variable(tf.zeros_like(var), trainable=False, name="v"))
        i = self._position[key]
        return self.moments[i], self.moments[i + 1]

    def build(self, variables: Iterable[tf.Variable]) -> None:
        """Creates the moments (call once before a `tf.function` step)."""
        for var in variables:
            self._moments(var)

    def apply_gradients(self, grads_and_vars) -> None:
        """Applies one step. Inside a replica of a `tf.distribute` strategy (the optimizer and
        the variables made in its scope) the replicas' gradients are summed first, as
        tf-keras' optimizers sum them, and every copy of a variable takes the same update:
        a step of ``R`` replicas equals one device's step on the sum of their gradients
        (for a loss summed over its examples: the global batch's)."""
        grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
        context = tf.distribute.get_replica_context()
        if tf.distribute.has_strategy() and context is not None:
            context.merge_call(self._distributed_apply, args=(grads_and_vars,))
            return
        step = self.iterations.assign_add(1)
        for grad, var in grads_and_vars:
            m, v = self._moments(var)
            self._apply_one(var, grad, m, v, step)

    def _distributed_apply(self, strategy, grads_and_vars) -> None:
        reduced = strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, grads_and_vars)
        step = self.iterations.assign_add(1)
        for grad, (_, var) in zip(reduced, grads_and_vars):
            m, v = self._moments(var)
            strategy.extended.update(var, self._apply_one, args=(grad, m, v, step),
                                     group=False)

    def _apply_one(self, var, grad, m, v, step) -> None:
        """The update of one variable (one copy of it under a strategy)."""
        dtype = var.dtype
        t = tf.cast(step, dtype)
        lr = self.learning_rate * tf.sqrt(1.0 - self.beta_2 ** t) / (1.0 - self.beta_1 ** t)
        b1, b2 = tf.constant(self.beta_1, dtype), tf.constant(self.beta_2, dtype)
        if isinstance(grad, tf.IndexedSlices):
            rows, position = tf.unique(grad.indices)
            g = tf.math.unsorted_segment_sum(grad.values, position, tf.size(rows))
            m_rows = b1 * tf.gather(m, rows) + (1.0 - b1) * g
            v_rows = b2 * tf.gather(v, rows) + (1.0 - b2) * tf.square(g)
            m.scatter_update(tf.IndexedSlices(m_rows, rows))
            v.scatter_update(tf.IndexedSlices(v_rows, rows))
            var.scatter_sub(tf.IndexedSlices(
                lr * m_rows / (tf.sqrt(v_rows) + self.epsilon), rows))
        else:
            m.assign(b1 * m + (1.0 - b1) * grad)
            v.assign(b2 * v + (1.0 - b2) * tf.square(grad))
            var.assign_sub(lr * m / (tf.sqrt(v) + self.epsilon))

__all__ = ["LazyAdam"]
