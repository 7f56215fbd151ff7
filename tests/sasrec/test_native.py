"""The native fused gather-dot kernel against numpy, and its build and fallback."""

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tfrs_logq._util import atomic
from tfrs_logq.sasrec import native
from tfrs_logq.sasrec.objectives import make_objective

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


@pytest.fixture
def package_cache(monkeypatch):
    """No kernel-cache override (conftest sets one for the test run): the kernels follow
    the package's cache directory."""
    monkeypatch.delenv(native.CACHE_ENV, raising=False)
    return monkeypatch


def _fake_compiler(directory):
    """A stand-in compiler that writes ``lib`` to its -o file: a build in no time."""
    fake = directory / "fake-compiler"
    fake.write_text('#!/bin/sh\nfor a; do case "$prev" in -o) echo lib > "$a";; esac; '
                    'prev="$a"; done\nexit 0\n')
    fake.chmod(0o755)
    return str(fake)


def _env_with_kernel_cache(directory, **extra):
    """This process's environment with the kernels (only) cached in ``directory``."""
    return {**os.environ, native.CACHE_ENV: str(directory), **extra}


def test_the_kernels_live_in_the_package_cache_directory(tmp_path, package_cache):
    package_cache.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.cache_dir() == tmp_path / "native"
        assert native.library_path().parent == tmp_path / "native"
        assert native.library_path().name.startswith(f"kernels-{tf.__version__}-")


def test_the_kernel_cache_override_wins_and_empty_counts_as_unset(tmp_path, package_cache):
    package_cache.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "data"))
    package_cache.setenv(native.CACHE_ENV, str(tmp_path / "kernels"))
    assert native.cache_dir() == tmp_path / "kernels"
    package_cache.setenv(native.CACHE_ENV, " ")
    assert native.cache_dir() == tmp_path / "data" / "native"


def test_the_test_session_shares_one_kernel_cache():
    """conftest points the kernels at one directory for every test and subprocess, so a
    test that moves the data cache does not compile them again."""
    assert os.environ.get(native.CACHE_ENV)
    assert native.cache_dir() == Path(os.environ[native.CACHE_ENV])


def test_build_is_cached_atomic_and_reports_compiler_errors(tmp_path, package_cache):
    # A stand-in compiler that logs its calls: what is checked here is the cache, not the
    # compile (test_concurrent_builds_produce_one_library compiles the real kernels).
    monkeypatch = package_cache
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path))
    calls = tmp_path / "calls"
    counting = tmp_path / "counting-compiler"
    counting.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nfor a; do case "$prev" in -o) echo '
                        'lib > "$a";; esac; prev="$a"; done\nexit 0\n')
    counting.chmod(0o755)
    monkeypatch.setenv("CXX", str(counting))

    def builds():  # the compiler's calls that build (`_cpu_signature` asks it --help too)
        return [c for c in calls.read_text().splitlines() if " -o " in f" {c} "]

    path = native.build()
    assert path.parent == tmp_path / "native" and path.read_text() == "lib\n"
    assert len(builds()) == 1
    mtime = path.stat().st_mtime_ns
    assert native.build() == path and path.stat().st_mtime_ns == mtime  # not rebuilt
    assert len(builds()) == 1  # the compiler was not called again
    assert [p.name for p in path.parent.iterdir() if p.suffix == ".so"] == [path.name]

    # A failing compiler: a clear error, and nothing half-written left behind.
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "broken-cache"))
    broken = tmp_path / "broken-cache" / "native"
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(native.NativeBuildError, match="failed"):
        native.build()
    # No library and no temporary: the lock file and the remembered failure (one per
    # key, the compiler's too).
    assert sorted(p.suffix for p in broken.iterdir()) == [".failed", ".lock"]
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
    assert {p.suffix for p in broken.iterdir()} == {".lock", ".failed"}


def _picky_compiler(directory, refuse):
    """A stand-in compiler that fails (printing a note and an error) when its arguments
    contain ``-march=native`` without ``-mno-avx512fp16`` (TF 2.21's Eigen on an
    AVX512-FP16 host) or, with ``refuse="all"``, always; it logs every call."""
    fake = directory / f"picky-{refuse}"
    log = directory / f"picky-{refuse}.log"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        'native=0; nofp16=0; for a; do case "$a" in -march=native) native=1;; '
        '-mno-avx512fp16) nofp16=1;; esac; done\n'
        + ('fail=1\n' if refuse == "all" else
           'fail=0; [ $native = 1 ] && [ $nofp16 = 0 ] && fail=1\n')
        + 'if [ $fail = 1 ]; then echo "In file included from Eigen/Core:1," >&2; '
          'echo "PacketMathFP16.h:740: error: expected initializer before <" >&2; exit 1; fi\n'
          'for a; do case "$prev" in -o) echo lib > "$a";; esac; prev="$a"; done\nexit 0\n')
    fake.chmod(0o755)
    return str(fake), log


def test_the_build_falls_back_to_no_avx512fp16_then_remembers_a_failure(tmp_path, package_cache,
                                                                       caplog):
    # On an Intel host with AVX512-FP16, TF 2.21's Eigen does not compile with
    # -march=native: the kernels must still build (without FP16), and a build that
    # cannot succeed must not be retried (30 s) by every process.
    import logging

    package_cache.setenv(native.CACHE_ENV, str(tmp_path / "k"))
    compiler, log = _picky_compiler(tmp_path, "fp16")
    package_cache.setenv("CXX", compiler)
    with caplog.at_level(logging.INFO, logger=native.__name__):
        path = native.build()
    # A build that succeeded says so in one line, without the failed attempt's compiler
    # errors (a newcomer read "error:" lines from a run that worked).
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO
            and "built with" in r.getMessage()]
    assert len(said) == 1 and "-mno-avx512fp16" in said[0] and "error" not in said[0], said
    assert path.read_text() == "lib\n"
    def builds():  # the compiler's calls that build (`_cpu_signature` asks it --help too)
        return [c for c in log.read_text().splitlines() if " -o " in f" {c} "]

    calls = builds()
    assert len(calls) == 2 and "-mno-avx512fp16" in calls[1] and "-march=native" in calls[1]
    assert not native.failure_path(path).exists()

    compiler, log = _picky_compiler(tmp_path, "all")
    package_cache.setenv("CXX", compiler)
    with pytest.raises(native.NativeBuildError) as error:
        native.build()
    assert "error: expected initializer" in str(error.value)  # the error, not the notes
    assert "In file included" not in str(error.value)
    assert len(builds()) == len(native._ARCH_FLAGS)
    with pytest.raises(native.NativeBuildError, match="remembered in .*failed"):
        native.build()  # no compiler call
    assert len(builds()) == len(native._ARCH_FLAGS)
    with pytest.raises(native.NativeBuildError, match="error: expected"):
        native.build(force=True)  # forced: compiled again
    assert len(builds()) == 2 * len(native._ARCH_FLAGS)


def test_a_killed_builds_temporary_is_removed_by_the_next_build(tmp_path, package_cache):
    package_cache.setenv(native.CACHE_ENV, str(tmp_path / "k"))
    package_cache.setenv("CXX", _fake_compiler(tmp_path))
    target = native.library_path()
    target.parent.mkdir()
    killed = target.parent / f".{target.name}.0123456789ab.tmp"  # left by a SIGKILL
    killed.write_text("half")
    assert atomic.stale_temporaries(target) == [str(killed)]
    other = tmp_path / "k" / ".kernels-other.so.0123456789ab.tmp"  # another key's build
    other.write_text("running")
    assert native.build() == target and target.read_text() == "lib\n"
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        [target.name, target.name + ".lock", other.name])


def test_a_compile_says_so_once_per_process_and_a_cache_hit_says_nothing(tmp_path, package_cache,
                                                                         caplog):
    # The first training compiled for about 50 s without a word. A stand-in
    # compiler (writes its -o file) keeps this test fast.
    monkeypatch = package_cache
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path))
    monkeypatch.setenv("TFRS_LOGQ_CACHE_DIR", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / "native"
    monkeypatch.setattr(native, "_announced", False)  # as in a fresh process

    def lines():
        found = [r.getMessage() for r in caplog.records if r.name == native.logger.name]
        caplog.clear()
        return found

    with caplog.at_level("DEBUG", logger=native.logger.name):
        path = native.build()
        assert path.read_text() == "lib\n"
        assert lines() == [f"compiling native CPU kernels (once, cached in {cache})"]
        assert native.build() == path and lines() == []  # the cache hit: nothing
        native.build(force=True)  # a rebuild (a cached library that did not load)
        assert lines() == []  # once per process


_BUILD = """
import sys
from tfrs_logq._util import atomic
from tfrs_logq.sasrec import native
print(native.build())
"""


@pytest.mark.slow  # two compiler runs (10 s on 2 cores): make test-slow
def test_concurrent_builds_produce_one_library(tmp_path):
    # Two processes build at once through a stand-in compiler that takes a second (the
    # real compile, tested by every kernel test in this file, took about 30 s of the
    # suite here): one compiles, the other waits for it and finds its library.
    calls = tmp_path / "calls"
    fake = tmp_path / "slow-compiler"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncase " $* " in *" -o "*) sleep 1;; esac\n'
                    'for a; do case "$prev" in -o) echo lib > "$a";; esac; prev="$a"; done\n'
                    'exit 0\n')
    fake.chmod(0o755)
    kernels = tmp_path / "k"
    env = _env_with_kernel_cache(kernels, CXX=str(fake))
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    paths = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(paths) == 1
    assert [p.name for p in kernels.iterdir() if p.suffix == ".so"] == [
        os.path.basename(paths.pop())]
    builds = [c for c in calls.read_text().splitlines() if " -o " in f" {c} "]
    assert len(builds) == 1, builds


def test_a_build_waits_for_anothers_build_of_the_same_library(tmp_path, package_cache):
    # The build lock waits (it does not refuse): a second process finds the library the
    # first built, and compiles nothing.
    import threading

    package_cache.setenv(native.CACHE_ENV, str(tmp_path / "k"))
    calls = tmp_path / "calls"
    fake = tmp_path / "counting-compiler"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nfor a; do case "$prev" in -o) echo lib > '
                    '"$a";; esac; prev="$a"; done\nexit 0\n')
    fake.chmod(0o755)
    package_cache.setenv("CXX", str(fake))
    target = native.library_path()
    target.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a+'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.readline(); "
         "open(sys.argv[2], 'w').write('built by the other\\n')",
         str(target) + ".lock", str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = []
        thread = threading.Thread(target=lambda: result.append(native.build()), daemon=True)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive() and not target.exists()  # waiting on the other build
        holder.communicate("go\n", timeout=30)
        thread.join(30)
    finally:
        holder.kill()
        holder.wait()
    assert result == [target] and target.read_text() == "built by the other\n"
    builds = [c for c in (calls.read_text().splitlines() if calls.exists() else [])
              if " -o " in f" {c} "]  # (`_cpu_signature` asks the compiler --help too)
    assert builds == []


def test_a_cache_that_cannot_lock_is_a_build_error(tmp_path, package_cache, monkeypatch):
    import errno
    import fcntl

    package_cache.setenv(native.CACHE_ENV, str(tmp_path / "k"))
    package_cache.setenv("CXX", _fake_compiler(tmp_path))

    def no_flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    with pytest.raises(native.NativeBuildError, match="cannot lock .*lock to build"):
        native.build()
    assert not native.library_path().exists()


_FALLBACK = """
import os, sys, logging
logging.basicConfig()
import numpy as np
from tfrs_logq._util import atomic
from tfrs_logq.sasrec import native
from tfrs_logq.sasrec.objectives import make_objective
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
                            env=_env_with_kernel_cache(tmp_path, **env),
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "native False available False finite True" in result.stdout
    if "CXX" in env:
        assert "native kernels unavailable" in result.stderr


def test_a_required_native_kernel_that_cannot_build_is_an_error(tmp_path):
    code = _FALLBACK.replace('num_negatives=8)', 'num_negatives=8, native_kernels=True)')
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=_env_with_kernel_cache(tmp_path, CXX="no-such-compiler-xyz",
                                                       TFRS_LOGQ_NATIVE="auto"),
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


# --- layer_norm: the fused layer normalisation ------------------------------------------

def _layer_norm_reference(x, gamma, beta, upstream, eps):
    """y and the gradients of sum(y * upstream), from the formulas, in float64."""
    x, gamma, beta, g = (a.astype(np.float64) for a in (x, gamma, beta, upstream))
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    y = xhat * gamma + beta
    gx = g * gamma
    d_x = rstd * (gx - gx.mean(-1, keepdims=True) - xhat * (gx * xhat).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return y, d_x, (g * xhat).sum(axes), g.sum(axes)


def _layer_norm_case(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * 3 + 1).astype(np.float32)
    gamma = rng.normal(size=shape[-1:]).astype(np.float32)
    beta = rng.normal(size=shape[-1:]).astype(np.float32)
    return x, gamma, beta, rng.normal(size=shape).astype(np.float32)


def _layer_norm_and_grads(x, gamma, beta, upstream, eps=1e-5):
    x, gamma, beta = (tf.convert_to_tensor(a) for a in (x, gamma, beta))
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        y = native.layer_norm(x, gamma, beta, eps)
        loss = tf.reduce_sum(y * upstream)
    return [y, *tape.gradient(loss, [x, gamma, beta])]


@needs_compiler
@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("shape", [(3, 70, 64), (5, 131), (4, 1), (0, 8), (2, 0, 6)])
def test_layer_norm_and_its_gradients_match_the_formulas(graph, shape):
    x, gamma, beta, upstream = _layer_norm_case(shape)
    fn = tf.function(_layer_norm_and_grads) if graph else _layer_norm_and_grads
    got = fn(x, gamma, beta, upstream)
    for g, w in zip(got, _layer_norm_reference(x, gamma, beta, upstream, 1e-5)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-4)


@needs_compiler
def test_layer_norm_matches_keras_and_is_deterministic_on_many_rows():
    """Enough rows for every thread to take many blocks of the d/dgamma sums: two runs
    are bitwise equal, and the result is Keras' up to float rounding."""
    x, gamma, beta, upstream = _layer_norm_case((3000, 48), seed=1)
    first = [a.numpy() for a in _layer_norm_and_grads(x, gamma, beta, upstream)]
    second = [a.numpy() for a in _layer_norm_and_grads(x, gamma, beta, upstream)]
    keras = tf.keras.layers.LayerNormalization(epsilon=1e-5)
    keras.build(x.shape)
    keras.set_weights([gamma, beta])
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = keras(xt)
        loss = tf.reduce_sum(y * upstream)
    want = [y, *tape.gradient(loss, [xt, keras.gamma, keras.beta])]
    for a, b, w in zip(first, second, want):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, w.numpy(), rtol=1e-4, atol=1e-4)


@needs_compiler
def test_layer_norm_second_derivative_refused_and_bad_inputs_named():
    x, gamma, beta, upstream = _layer_norm_case((4, 6))
    xt = tf.constant(x)
    with tf.GradientTape() as outer:
        outer.watch(xt)
        with tf.GradientTape() as inner:
            inner.watch(xt)
            loss = tf.reduce_sum(native.layer_norm(xt, gamma, beta, 1e-5) * upstream)
        total = tf.reduce_sum(inner.gradient(loss, xt) ** 2)
    with pytest.raises(NotImplementedError, match="second derivative"):
        outer.gradient(total, xt)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="gamma|Dimensions"):
        native.layer_norm(x, gamma[:5], beta, 1e-5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="beta|Dimensions"):
        native.layer_norm(x, gamma, beta[:5], 1e-5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="epsilon"):
        native.layer_norm(x, gamma, beta, -1.0)


# --- dropout: one pass, bits of a Philox stream -------------------------------------------

@needs_compiler
@pytest.mark.parametrize("rate", [0.5, 0.25, 0.2, 3 / 2 ** 16, 0.9])
def test_dropout_keeps_with_probability_one_minus_rate_and_scales(rate):
    x = tf.constant(np.random.default_rng(0).normal(size=(300, 1001)).astype(np.float32) + 10)
    y = native.dropout(x, [11, 12], rate).numpy()
    kept = y != 0
    np.testing.assert_array_equal(y[kept], x.numpy()[kept] * np.float32(1 / (1 - rate)))
    n = kept.size
    assert abs(kept.mean() - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    # Neighbours (sharing a word of the stream) are independent.
    pairs = kept.reshape(-1)[: n - n % 2].reshape(-1, 2)
    both = np.mean(pairs[:, 0] & pairs[:, 1])
    assert abs(both - (1 - rate) ** 2) < 5 * np.sqrt((1 - rate) ** 2 / (n / 2))


@needs_compiler
def test_dropout_mask_depends_on_the_seed_and_position_only():
    x = tf.random.stateless_normal([5000, 37], [1, 2]) + 5.0
    y = native.dropout(x, [3, 4], 0.5).numpy()
    np.testing.assert_array_equal(native.dropout(x, [3, 4], 0.5).numpy(), y)  # same seed
    other = native.dropout(x, [3, 5], 0.5).numpy()
    assert abs(np.mean((other != 0) == (y != 0)) - 0.5) < 0.01  # another seed: independent
    # A prefix of the flat tensor (fewer chunks, other thread splits) gets the same mask.
    flat = tf.reshape(x, [-1])
    prefix = native.dropout(flat[:12345], [3, 4], 0.5).numpy()
    np.testing.assert_array_equal(prefix, y.reshape(-1)[:12345])
    assert native.dropout(tf.zeros([0, 3]), [3, 4], 0.5).shape == (0, 3)
    np.testing.assert_array_equal(native.dropout(x, [3, 4], 0.0).numpy(), x.numpy())


@needs_compiler
@pytest.mark.parametrize("graph", [False, True])
def test_dropout_gradients_of_every_order_are_the_mask(graph):
    x = tf.random.stateless_normal([64, 33], [5, 6]) + 5.0
    seed = tf.constant([7, 8], tf.int64)

    def fn(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = native.dropout(x, seed, 0.5)
                loss = tf.reduce_sum(y * y)
            grad = inner.gradient(loss, x)
            total = tf.reduce_sum(grad * 3.0)
        return y, grad, outer.gradient(total, x)

    y, grad, second = (tf.function(fn) if graph else fn)(x)
    mask = np.where(y.numpy() != 0, 2.0, 0.0)
    np.testing.assert_allclose(grad.numpy(), 2 * y.numpy() * mask, rtol=1e-6)
    np.testing.assert_allclose(second.numpy(), 3.0 * 2 * mask * mask, rtol=1e-6)


@needs_compiler
def test_dropout_rejects_bad_arguments():
    with pytest.raises(ValueError, match="rate"):
        native.dropout(tf.ones([3]), [1, 2], 1.0)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="seed|rank|must be"):
        native.dropout(tf.ones([3]), [1, 2, 3], 0.5)
    module = native.load()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="bits"):
        module.tfrs_logq_dropout(tf.ones([3]), tf.constant([1, 2], tf.int64), bits=4,
                                 threshold=1, scale=2.0)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="threshold"):
        module.tfrs_logq_dropout(tf.ones([3]), tf.constant([1, 2], tf.int64), bits=1,
                                 threshold=2, scale=2.0)
