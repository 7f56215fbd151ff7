"""The native fused gather-dot kernel against numpy, and its build and fallback."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq import native
from tfrs_logq.objectives import make_objective

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++").split()[0]) is None
    or os.environ.get("TFRS_LOGQ_NATIVE", "").lower() in ("0", "off", "false", "no"),
    reason="no C++ compiler to build the native kernel, or TFRS_LOGQ_NATIVE=0")


def _case(seed=0, n=9, rows=11, dim=6, k=14):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n, dim)).astype(np.float32)
    table = rng.normal(size=(rows, dim)).astype(np.float32)
    ids = rng.integers(0, rows - 3, size=(n, k)).astype(np.int32)  # the last 3 rows unused
    ids[0, :5] = 3  # one id five times in a row: its gradients add up
    upstream = rng.normal(size=(n, k)).astype(np.float32)
    return q, table, ids, upstream


def _numpy_reference(q, table, ids, upstream):
    q, table, g = (x.astype(np.float64) for x in (q, table, upstream))
    logits = np.einsum("nd,nkd->nk", q, table[ids])
    d_q = np.einsum("nk,nkd->nd", g, table[ids])
    d_table = np.zeros_like(table)
    np.add.at(d_table, ids.reshape(-1), (g[:, :, None] * q[:, None, :]).reshape(-1, q.shape[1]))
    return logits, d_q, d_table


def _value_and_grads(q, table, ids, upstream):
    q, table = tf.convert_to_tensor(q), tf.convert_to_tensor(table)
    with tf.GradientTape() as tape:
        tape.watch([q, table])
        logits = native.sampled_dot(q, table, ids)
        loss = tf.reduce_sum(logits * upstream)
    return [logits, *tape.gradient(loss, [q, table])]


@needs_compiler
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("dim", [6, 128, 131])  # 131: a tail after the vector lanes
def test_sampled_dot_and_its_gradients_match_numpy(graph, dim):
    q, table, ids, upstream = _case(dim=dim)
    fn = tf.function(_value_and_grads) if graph else _value_and_grads
    got = fn(q, table, ids, upstream)
    for g, w in zip(got, _numpy_reference(q, table, ids, upstream)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[2].numpy()[-3:], 0.0)  # never drawn: no gradient


@needs_compiler
@pytest.mark.parametrize("n,rows,k", [(0, 11, 14), (9, 11, 0), (9, 1, 14), (40, 3, 5)])
def test_sampled_dot_edge_shapes(n, rows, k):
    """No rows, no columns, and tables with fewer rows than worker threads."""
    rng = np.random.default_rng(5)
    q = rng.normal(size=(n, 6)).astype(np.float32)
    table = rng.normal(size=(rows, 6)).astype(np.float32)
    ids = rng.integers(0, rows, size=(n, k)).astype(np.int32)
    upstream = rng.normal(size=(n, k)).astype(np.float32)
    got = _value_and_grads(q, table, ids, upstream)
    for g, w in zip(got, _numpy_reference(q, table, ids, upstream)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_second_derivatives_are_refused():
    q, table, ids, upstream = _case()
    q = tf.constant(q)
    with tf.GradientTape() as outer:
        outer.watch(q)
        with tf.GradientTape() as inner:
            inner.watch(q)
            loss = tf.reduce_sum(native.sampled_dot(q, table, ids) * upstream)
        grad = inner.gradient(loss, q)
        total = tf.reduce_sum(grad * grad)
    with pytest.raises(NotImplementedError, match="second derivative"):
        outer.gradient(total, q)


@needs_compiler
def test_reloading_the_module_keeps_the_kernel_working():
    import importlib

    q, table, ids, upstream = _case(seed=4)
    importlib.reload(native)
    got = _value_and_grads(q, table, ids, upstream)
    for g, w in zip(got, _numpy_reference(q, table, ids, upstream)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


@needs_compiler
def test_sampled_dot_many_rows_is_deterministic_and_matches_numpy():
    """Enough rows and ids for every worker thread to take a share of the rows and a
    block of the table; two runs are bitwise equal (no atomics)."""
    q, table, ids, upstream = _case(seed=1, n=3000, rows=257, dim=32, k=40)
    first = [x.numpy() for x in _value_and_grads(q, table, ids, upstream)]
    second = [x.numpy() for x in _value_and_grads(q, table, ids, upstream)]
    for a, b, w in zip(first, second, _numpy_reference(q, table, ids, upstream)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-4)


@needs_compiler
def test_sampled_dot_casts_half_precision_inputs():
    q, table, ids, upstream = _case(seed=2)
    got = native.sampled_dot(tf.constant(q, tf.bfloat16), tf.constant(table, tf.float16), ids)
    assert got.dtype == tf.float32
    want = _numpy_reference(q.astype(np.float32), table, ids, upstream)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=0.05, atol=0.1)


@needs_compiler
def test_sampled_dot_under_a_mirrored_strategy(mirrored_strategy):
    q, table, ids, upstream = _case(seed=3, n=8)
    with mirrored_strategy.scope():
        variable = tf.Variable(table)

    def step(q_part, ids_part, up_part):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(native.sampled_dot(q_part, variable, ids_part) * up_part)
        return tape.gradient(loss, variable)

    def fn():
        ctx = tf.distribute.get_replica_context()
        r = ctx.replica_id_in_sync_group
        half = 8 // ctx.num_replicas_in_sync
        rows = tf.range(r * half, (r + 1) * half)
        return ctx.all_reduce("sum", step(tf.gather(q, rows), tf.gather(ids, rows),
                                          tf.gather(upstream, rows)))

    got = mirrored_strategy.run(tf.function(fn))
    got = mirrored_strategy.experimental_local_results(got)[0]
    np.testing.assert_allclose(got.numpy(), _numpy_reference(q, table, ids, upstream)[2],
                               rtol=1e-5, atol=1e-5)


@needs_compiler
def test_sampled_dot_rejects_bad_inputs_by_name():
    q, table, ids, _ = _case()
    bad = ids.copy()
    bad[2, 4] = 11
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[2, 4\] = 11 is not in"):
        native.sampled_dot(q, table, bad)
    bad[2, 4] = -1
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[2, 4\] = -1"):
        native.sampled_dot(q, table, bad)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="same dim"):
        native.sampled_dot(q, table[:, :5], ids)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="number of rows"):
        native.sampled_dot(q[:4], table, ids)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank|must be"):
        native.sampled_dot(q[None], table, ids)


@needs_compiler
def test_build_is_cached_atomic_and_reports_compiler_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("TFRS_LOGQ_CACHE", str(tmp_path))
    path = native.build()
    assert path.parent == tmp_path and path.exists()
    mtime = path.stat().st_mtime_ns
    assert native.build() == path and path.stat().st_mtime_ns == mtime  # not rebuilt
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".so"] == [path.name]

    # A failing compiler: a clear error, and nothing half-written left behind.
    broken = tmp_path / "broken"
    broken.mkdir()
    monkeypatch.setenv("TFRS_LOGQ_CACHE", str(broken))
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(native.NativeBuildError, match="failed"):
        native.build()
    assert not [p for p in broken.iterdir() if p.suffix == ".so"]
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(native.NativeBuildError, match="no C\\+\\+ compiler"):
        native.build()
    # A compiler that writes part of its output and then fails.
    fake = tmp_path / "half-compiler"
    fake.write_text('#!/bin/sh\nfor a; do case "$prev" in -o) echo partial > "$a";; esac; '
                    'prev="$a"; done\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(native.NativeBuildError, match="failed"):
        native.build()
    assert not [p for p in broken.iterdir() if p.suffix == ".so"]


_BUILD = """
import sys
from tfrs_logq import native
print(native.build())
"""


@needs_compiler
def test_concurrent_builds_produce_one_library(tmp_path):
    env = {**os.environ, "TFRS_LOGQ_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(paths) == 1
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".so"] == [
        os.path.basename(paths.pop())]


_FALLBACK = """
import os, sys, logging
logging.basicConfig()
import numpy as np
from tfrs_logq import native
from tfrs_logq.objectives import make_objective
import tensorflow as tf
counts = np.ones(13)
objective = make_objective("mns-corrected", 12, counts, num_negatives=8)
targets = tf.constant([[1, 2, 3, 0]])
loss = objective(tf.ones([1, 4, 4]), targets, targets > 0, tf.ones([13, 4]))
print("native", objective._native, "available", native.available(), "finite",
      bool(np.isfinite(loss.numpy())))
"""


@pytest.mark.parametrize("env", [{"TFRS_LOGQ_NATIVE": "0"},
                                 {"CXX": "no-such-compiler-xyz", "TFRS_LOGQ_NATIVE": "auto"}])
def test_objectives_fall_back_to_tensorflow_ops(env, tmp_path):
    """Turned off, or no compiler: a warning and TensorFlow ops, not an error."""
    result = subprocess.run([sys.executable, "-c", _FALLBACK], capture_output=True, text=True,
                            env={**os.environ, "TFRS_LOGQ_CACHE": str(tmp_path), **env},
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "native False available False finite True" in result.stdout
    if "CXX" in env:
        assert "native kernels unavailable" in result.stderr


def test_a_required_native_kernel_that_cannot_build_is_an_error(tmp_path):
    code = _FALLBACK.replace('num_negatives=8)', 'num_negatives=8, native_kernels=True)')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "TFRS_LOGQ_CACHE": str(tmp_path),
                                 "CXX": "no-such-compiler-xyz", "TFRS_LOGQ_NATIVE": "auto"},
                            timeout=300)
    assert result.returncode != 0
    assert "native kernels are unavailable" in result.stderr


def test_native_mode_is_validated(monkeypatch):
    monkeypatch.setenv("TFRS_LOGQ_NATIVE", "maybe")
    with pytest.raises(ValueError, match="TFRS_LOGQ_NATIVE"):
        native.load()


@needs_compiler
@pytest.mark.skipif(bool(tf.config.list_logical_devices("GPU")),
                    reason="by default the kernel is used on CPU-only hosts")
def test_objective_uses_the_kernel_by_default_on_a_cpu_host_and_not_when_told():
    counts = np.ones(13)
    targets = tf.constant([[1, 2, 3, 0]])
    on = make_objective("mns-corrected", 12, counts, num_negatives=8)
    off = make_objective("mns-corrected", 12, counts, num_negatives=8, native_kernels=False)
    inbatch = make_objective("inbatch-corrected", 12, counts, num_negatives=8)
    for objective in (on, off, inbatch):
        objective(tf.ones([1, 4, 4]), targets, targets > 0, tf.ones([13, 4]))
    assert on._native is True and off._native is False
    assert not inbatch._native  # no per-position negatives: nothing to fuse
