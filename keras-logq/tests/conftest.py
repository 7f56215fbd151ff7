"""Backend helpers for the keras-logq tests: gradients and jit on JAX, PyTorch, TensorFlow.

Each backend runs in its own pytest process (``KERAS_BACKEND=jax|torch|tensorflow``).
The numpy references are the repository's (``tests/reference.py``, numpy only),
imported by path so that the TensorFlow ``tests/conftest.py`` is never loaded.
"""

import os
import sys

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_REPO_TESTS = os.path.join(os.path.dirname(__file__), "..", "..", "tests")
sys.path.insert(0, os.path.abspath(_REPO_TESTS))

import keras  # noqa: E402

BACKEND = keras.backend.backend()


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def value_and_grads(fn, args, wrt):
    """``fn(*args)`` and the gradients of ``sum(fn(*args))`` w.r.t. ``args[i]``, ``i in wrt``."""
    if BACKEND == "jax":
        import jax

        def total(*diff):
            full = list(args)
            for i, d in zip(wrt, diff):
                full[i] = d
            out = fn(*full)
            return keras.ops.sum(out), out

        diff = [keras.ops.convert_to_tensor(args[i]) for i in wrt]
        (_, out), grads = jax.value_and_grad(total, argnums=tuple(range(len(wrt))),
                                             has_aux=True)(*diff)
        return to_numpy(out), [to_numpy(g) for g in grads]
    if BACKEND == "torch":
        import torch

        full = [keras.ops.convert_to_tensor(a) for a in args]
        for i in wrt:
            full[i] = full[i].detach().clone().requires_grad_(True)
        out = fn(*full)
        grads = torch.autograd.grad(out.sum(), [full[i] for i in wrt], allow_unused=True)
        grads = [np.zeros(np.shape(args[i])) if g is None else g.detach().cpu().float().numpy()
                 for i, g in zip(wrt, grads)]
        return out.detach().cpu().float().numpy(), grads
    import tensorflow as tf

    full = [tf.convert_to_tensor(a) for a in args]
    with tf.GradientTape() as tape:
        for i in wrt:
            tape.watch(full[i])
        out = fn(*full)
        total = tf.reduce_sum(out)
    grads = tape.gradient(total, [full[i] for i in wrt])
    grads = [np.zeros(np.shape(args[i])) if g is None else np.asarray(tf.cast(g, tf.float64))
             for i, g in zip(wrt, grads)]
    return np.asarray(tf.cast(out, tf.float64)), grads


def jit(fn):
    """``fn`` compiled the backend's way: jax.jit, tf.function(jit_compile=True) (XLA),
    torch.compile (the aot_eager backend: graph capture without a C++ toolchain)."""
    if BACKEND == "jax":
        import jax

        return jax.jit(fn)
    if BACKEND == "torch":
        import torch

        return torch.compile(fn, backend="aot_eager")
    import tensorflow as tf

    return tf.function(fn, jit_compile=True)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
