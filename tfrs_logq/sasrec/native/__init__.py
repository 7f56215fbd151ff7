"""Native CPU kernels, compiled on first use.

- `sampled_dot(queries, table, ids)` is ``queries[i] . table[ids[i, j]]`` as `[n, k]`
  without the `[n, k, dim]` block of gathered embeddings that `tf.gather` + `einsum`
  builds, and without the `[n, catalog]` matmul of the dense alternative. It is what
  makes per-position uniform negatives (uniform, MNS, BCE/gBCE) cheap on CPU.
- `layer_norm(x, gamma, beta, epsilon)` is layer normalisation over the last axis in
  one pass forward and one backward, where Keras' `LayerNormalization` takes its
  unfused path (epsilon below 1.001e-5, e.g. gSASRec's 1e-5).
- `dropout(x, seed, rate)` is dropout in one pass with the keep decisions read from a
  few bits of a Philox stream per entry (one bit at rate 0.5), its gradient the same op
  on the upstream gradient (the mask is recomputed, not stored).

The kernels (`sampled_dot.cc`, `layer_norm.cc`, `dropout.cc`, beside this file) are
compiled into one library with TensorFlow's own compile and link flags the first time
they are needed, into the ``native`` directory of the package's cache
(`tfrs_logq._util.cache.cache_dir`: ``$TFRS_LOGQ_CACHE_DIR``, else ``$XDG_CACHE_HOME/tfrs_logq``
or ``~/.cache/tfrs_logq``; ``$TFRS_LOGQ_NATIVE_CACHE_DIR`` moves the kernels alone, e.g.
one kernel cache shared by tests that point the data cache at temporary directories),
keyed by the sources, TensorFlow's version, the compiler and the CPU; the build writes
to a temporary file and renames it, under a file lock, so concurrent processes build it
once and never load a half-written library. ``$CXX`` names the compiler (default ``g++``).
The compiler targets the host (``-march=native``), without AVX512-FP16 where that fails
(TensorFlow 2.21's Eigen does not compile with it), else the generic target; a build that
fails with all three is remembered beside the library and not tried again.
``TFRS_LOGQ_NATIVE=0`` turns the kernels off, ``=1`` makes a failed build an error (and
compiles again); by default a failed build logs a warning once and callers fall back to
TensorFlow ops (the same results up to float rounding; dropout draws other, equally
distributed, masks).

There are CPU kernels only, and XLA cannot compile them: callers use them on CPU-only
hosts, outside XLA compilation (`enabled`, `in_xla_context`; see `SequenceObjective`'s
and `SASRecEncoder`'s ``native_kernels``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Optional

import tensorflow as tf

from tfrs_logq._util import atomic, cache, locks

logger = logging.getLogger(__name__)

ENV_VAR = "TFRS_LOGQ_NATIVE"
CACHE_ENV = "TFRS_LOGQ_NATIVE_CACHE_DIR"
SOURCES = tuple(Path(__file__).with_name(name) for name in ("sampled_dot.cc", "layer_norm.cc",
                                                                "dropout.cc"))
_CXXFLAGS = ["-shared", "-fPIC", "-O3", "-DNDEBUG", "-fopenmp-simd",
             "-Wno-deprecated-declarations"]
# The target flags tried in order, the first that compiles wins. TensorFlow 2.21's Eigen
# does not compile with AVX512-FP16 enabled (`PacketMathFP16.h: expected initializer
# before '<'` under -march=native on an Intel Xeon with AMX), so the second try keeps
# every other extension of the host; the last is the compiler's generic target.
_ARCH_FLAGS = (("-march=native",), ("-march=native", "-mno-avx512fp16"), ())
_BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state: dict = {}  # "module", "error"
_announced = False  # whether this process said it compiles (`_announce_compile`)


class NativeBuildError(RuntimeError):
    """The native kernels could not be compiled or loaded."""


def _mode() -> str:
    value = os.environ.get(ENV_VAR, "auto").strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in ("0", "off", "false", "no"):
        return "off"
    if value in ("1", "on", "true", "yes"):
        return "on"
    raise ValueError(f"{ENV_VAR} must be one of auto, 0/off, 1/on; received {value!r}.")


def cache_dir() -> Path:
    """Where the compiled kernels live: ``$TFRS_LOGQ_NATIVE_CACHE_DIR`` when set (not
    empty), else ``native/`` in the package's cache directory
    (`tfrs_logq._util.cache.cache_dir`)."""
    root = os.environ.get(CACHE_ENV, "").strip()
    if root:
        return Path(root)
    return Path(cache.cache_dir()) / "native"


@functools.lru_cache(maxsize=None)
def _cpu_signature(compiler: str) -> str:
    """What ``-march=native`` means here (code built for one CPU may not run on
    another): the compiler's resolved target options, else the CPU model and flags."""
    parts = [platform.machine(), platform.system()]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        result = subprocess.run([*shlex.split(compiler), "-march=native", "-Q", "--help=target"],
                                capture_output=True, text=True, timeout=60)
        if result.returncode == 0:
            parts.append(result.stdout)
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            seen = set()
            for line in f:
                key = line.split(":")[0].strip()
                if key in ("model name", "flags", "Features", "CPU implementer", "CPU part"):
                    if key in seen:
                        break  # the next processor: the same again
                    seen.add(key)
                    parts.append(line.strip())
    return "\n".join(parts)


def _compiler() -> list[str]:
    """``$CXX`` (may carry arguments, e.g. ``ccache g++``), default ``g++``."""
    return shlex.split(os.environ.get("CXX", "g++")) or ["g++"]


def _build_command(output: str, arch: tuple = _ARCH_FLAGS[0]) -> list[str]:
    return [*_compiler(), *_CXXFLAGS, *arch, *map(str, SOURCES), "-o", output,
            *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def _compiler_errors(stderr: str, limit: int = 6) -> str:
    """The compiler's ``error:`` lines (its notes and include chains are most of its
    output), else the end of its output."""
    errors = [line.strip() for line in stderr.splitlines() if "error" in line]
    return "\n".join(errors[:limit]) if errors else stderr[-2000:].strip()


def library_path() -> Path:
    """Where the library for this source, TensorFlow, compiler and CPU lives."""
    key = hashlib.sha256()
    for source in SOURCES:
        key.update(source.read_bytes() + b"\0")
    compiler = " ".join(_compiler())
    for part in (tf.__version__, compiler, " ".join(_CXXFLAGS), repr(_ARCH_FLAGS),
                 _cpu_signature(compiler),
                 " ".join(tf.sysconfig.get_compile_flags())):
        key.update(b"\0" + part.encode())
    return cache_dir() / f"kernels-{tf.__version__}-{key.hexdigest()[:16]}.so"


def _announce_compile(target: Path) -> None:
    """One line the first time this process compiles (a first training otherwise sits
    silent for the build, about 50 s on 2 busy cores); a cache hit says nothing."""
    global _announced
    if not _announced:
        _announced = True
        logger.warning("compiling native CPU kernels (once, cached in %s)", target.parent)


def failure_path(target: Optional[Path] = None) -> Path:
    """Where a failed build of ``target`` (default `library_path`) is remembered: later
    processes read the error there instead of compiling again (about 30 s each)."""
    target = target or library_path()
    return target.with_name(target.name + ".failed")


def build(force: bool = False) -> Path:
    """Compiles the kernels unless the cached library exists; returns its path.

    The target flags of `_ARCH_FLAGS` are tried in order. A build that fails with all
    of them is remembered (`failure_path`) and not tried again for the same sources,
    TensorFlow, compiler and CPU unless ``force`` (``TFRS_LOGQ_NATIVE=1`` forces it).

    Raises:
      NativeBuildError: no compiler, or the compiler failed (its errors are included).
    """
    target = library_path()
    if target.exists() and not force:
        return target
    failed = failure_path(target)
    if failed.exists() and not force:
        raise NativeBuildError(f"{failed.read_text().strip()} (remembered in {failed}: delete "
                               f"it or set {ENV_VAR}=1 to compile again)")
    if shutil.which(_compiler()[0]) is None:
        raise NativeBuildError(f"no C++ compiler {_compiler()[0]!r} on PATH (set $CXX).")
    target.parent.mkdir(parents=True, exist_ok=True)

    # Waits while another process builds this target (the same key), then finds it built.
    with _build_lock(target):
        if target.exists() and not force:  # built by another process meanwhile
            return target
        # Left by a killed build of this library (the lock is this target's, so only
        # its own temporaries; a build of another key may be running beside it).
        for stale in atomic.stale_temporaries(target):
            with contextlib.suppress(OSError):
                os.remove(stale)
        _announce_compile(target)
        errors = []
        for arch in _ARCH_FLAGS:
            try:
                with atomic.atomic_path(target) as tmp:  # the compiler writes it, then renamed
                    result = subprocess.run(_build_command(tmp, arch), capture_output=True,
                                            text=True, timeout=_BUILD_TIMEOUT_S)
                    if result.returncode != 0:
                        raise NativeBuildError(_compiler_errors(result.stderr))
            except NativeBuildError as e:
                errors.append(f"[{' '.join(arch) or 'generic target'}] {e}")
                continue
            except subprocess.TimeoutExpired as e:
                raise NativeBuildError(f"compiling the native kernels took over "
                                       f"{_BUILD_TIMEOUT_S} s") from e
            if errors:  # the compiler's own lines only at debug level: the build succeeded
                tried = ", ".join(e.split("]", 1)[0] + "]" for e in errors)
                logger.info("native kernels built with %s (%s did not compile with TensorFlow "
                            "%s's headers)", " ".join(arch) or "the generic target", tried,
                            tf.__version__)
                logger.debug("the failed attempts: %s", "; ".join(errors))
            with contextlib.suppress(OSError):
                failed.unlink()
            return target
        message = (f"compiling {', '.join(s.name for s in SOURCES)} with "
                   f"{' '.join(_compiler())} failed: " + " | ".join(errors))
        atomic.write_text(str(failed), message + "\n")
        raise NativeBuildError(message)


@contextlib.contextmanager
def _build_lock(target: Path):
    """Holds ``TARGET.lock``: one build of ``target`` at a time; the others wait. A cache
    on a filesystem that cannot lock: `NativeBuildError` (callers fall back to
    TensorFlow ops)."""
    lock = locks.ExclusiveLock(str(target) + ".lock", wait=True)
    try:
        lock.acquire()
    except locks.LockUnsupported as e:
        raise NativeBuildError(f"cannot lock {lock.path} to build the native kernels "
                               f"({e.strerror}); set {CACHE_ENV} to a local directory") from None
    try:
        yield
    finally:
        lock.release()


def _sampled_dot_grad(op, upstream):
    d_queries, d_table = _state["module"].tfrs_logq_sampled_dot_grad(upstream, *op.inputs)
    return d_queries, d_table, None


def _layer_norm_grad(op, upstream, unused_d_mean, unused_d_rstd):
    # `layer_norm` returns only y: mean and rstd are the gradient's cache.
    x, gamma, _ = op.inputs
    return _state["module"].tfrs_logq_layer_norm_grad(upstream, x, gamma, op.outputs[1],
                                                      op.outputs[2])


def _dropout_grad(op, upstream):
    # y = x * mask: dx = upstream * mask, the same op with the same seed (linear, so
    # it has derivatives of every order).
    return (_state["module"].tfrs_logq_dropout(
        upstream, op.inputs[1], bits=op.get_attr("bits"), threshold=op.get_attr("threshold"),
        scale=op.get_attr("scale")), None)


def _no_second_derivative(op, *upstream):
    raise NotImplementedError(f"tfrs_logq.sasrec.native's {op.type} has no second derivative; use "
                              "native_kernels=False for higher-order gradients.")


# Registered by op name, once per process (a module reload must not register twice).
for _name, _fn in (("TfrsLogqSampledDot", _sampled_dot_grad),
                   ("TfrsLogqSampledDotGrad", _no_second_derivative),
                   ("TfrsLogqLayerNorm", _layer_norm_grad),
                   ("TfrsLogqLayerNormGrad", _no_second_derivative),
                   ("TfrsLogqDropout", _dropout_grad)):
    with contextlib.suppress(KeyError):
        tf.RegisterGradient(_name)(_fn)


def _load_library() -> object:
    path = build(force=_mode() == "on" and not library_path().exists())
    try:
        return tf.load_op_library(str(path))
    except (tf.errors.OpError, OSError):
        # A cached library that does not load (truncated by a crash, or built for
        # another system): rebuild it once.
        with contextlib.suppress(OSError):
            path.unlink()
        return tf.load_op_library(str(build(force=True)))


def load() -> Optional[object]:
    """The loaded op module, or None when turned off or (by default) unavailable.

    Raises:
      NativeBuildError: only with ``TFRS_LOGQ_NATIVE=1``.
    """
    mode = _mode()
    if mode == "off":
        return None
    with _lock:
        if "module" not in _state and "error" not in _state:
            try:
                _state["module"] = _load_library()
            except (NativeBuildError, OSError, tf.errors.OpError, subprocess.SubprocessError) as e:
                _state["error"] = e
                logger.warning("tfrs_logq: native kernels unavailable, using TensorFlow ops "
                               "instead: %s", e)
    if "error" in _state:
        if mode == "on":
            raise NativeBuildError(str(_state["error"])) from _state["error"]
        return None
    return _state["module"]


def available() -> bool:
    """Whether `sampled_dot` can run here (building the kernel if needed)."""
    return load() is not None


def in_xla_context() -> bool:
    """Whether ops built now will be compiled by XLA (``jit_compile``, TPU), which
    cannot compile these kernels: callers then use TensorFlow ops."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # internal modules moved: assume not
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def in_save_context() -> bool:
    """Whether a SavedModel is being traced now (`tf.saved_model.save`, Keras'
    ``model.save``, which also traces training calls): saved graphs must not hold these
    ops, which a process without this package's library cannot load."""
    try:
        from tensorflow.python.saved_model import save_context
    except ImportError:  # internal module moved: assume not
        return False
    return bool(save_context.in_save_context())


def usable_here() -> bool:
    """Whether ops built now may be the kernels: not under XLA compilation
    (`in_xla_context`) nor while a SavedModel is traced (`in_save_context`).

    Checked where the ops are built, i.e. when a `tf.function` traces: a trace made
    outside XLA and later called from inside an XLA cluster is not retraced, so code
    that compiles with XLA must build its models with ``native_kernels=False`` (as
    `tfrs_logq.sasrec.training` does under ``xla`` and on TPU) or trace with ``jit_compile``."""
    return not in_xla_context() and not in_save_context()


def enabled(native_kernels: Optional[bool] = None) -> bool:
    """Whether a caller asked for ``native_kernels`` should use the kernels: None
    means when they build and the host has no GPU or TPU (nor a TPU strategy);
    False never. Callers also check `usable_here` where they build ops.

    Raises:
      NativeBuildError: ``native_kernels=True`` and the kernels are unavailable.
    """
    if native_kernels is None:
        strategy = type(tf.distribute.get_strategy()).__name__
        return (not tf.config.list_logical_devices("GPU")
                and not tf.config.list_logical_devices("TPU")
                and "TPU" not in strategy and available())
    if native_kernels and not available():
        raise NativeBuildError("`native_kernels=True` but the native kernels are unavailable (see "
                               "the warning above, or set TFRS_LOGQ_NATIVE=1 for the compiler's "
                               "error).")
    return bool(native_kernels)


def sampled_dot(queries: tf.Tensor, table: tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """``queries[i] . table[ids[i, j]]`` as `[n, k]` float32, differentiable once in
    ``queries`` and ``table`` (the table's gradient is dense, `[num_rows, dim]`;
    a second derivative raises `NotImplementedError`).

    Args:
      queries: `[n, dim]`, cast to float32.
      table: `[num_rows, dim]`, cast to float32.
      ids: `[n, k]` int32 in ``[0, num_rows)`` (an id outside raises
        `InvalidArgumentError` naming it).

    Raises:
      NativeBuildError: the kernel is off or could not be built.
    """
    module = load()
    if module is None:
        raise NativeBuildError(f"the native kernels are off ({ENV_VAR}=0) or failed to build.")
    return module.tfrs_logq_sampled_dot(tf.cast(queries, tf.float32), tf.cast(table, tf.float32),
                                        tf.cast(ids, tf.int32))


def layer_norm(x: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor, epsilon: float) -> tf.Tensor:
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over the last axis (biased
    variance, as `tf.keras.layers.LayerNormalization` computes it), float32,
    differentiable once in all three inputs (a second derivative raises
    `NotImplementedError`).

    Args:
      x: `[..., dim]` float32.
      gamma: `[dim]` float32 scale.
      beta: `[dim]` float32 offset.
      epsilon: float >= 0.

    Raises:
      NativeBuildError: the kernels are off or could not be built.
    """
    module = load()
    if module is None:
        raise NativeBuildError(f"the native kernels are off ({ENV_VAR}=0) or failed to build.")
    y, _, _ = module.tfrs_logq_layer_norm(x, gamma, beta, epsilon=float(epsilon))
    return y


def dropout(x: tf.Tensor, seed: tf.Tensor, rate: float) -> tf.Tensor:
    """Each entry of float32 ``x`` kept with probability ``1 - rate`` and scaled by
    ``1 / (1 - rate)``, else 0; the decisions are a function of ``seed`` and the
    entry's position only (the same seed gives the same mask on any number of
    threads). Entry ``e`` compares a field of B bits of the Philox stream keyed by
    ``seed`` with ``rate * 2**B``, B the fewest of 1, 8, 16 bits that represent the
    rate exactly (1 for 0.5), else 32.

    Args:
      x: float32 tensor, any shape.
      seed: `[2]` int64.
      rate: float in ``[0, 1)``.

    Raises:
      NativeBuildError: the kernels are off or could not be built.
    """
    module = load()
    if module is None:
        raise NativeBuildError(f"the native kernels are off ({ENV_VAR}=0) or failed to build.")
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"`rate` must be in [0, 1), received {rate}.")
    bits = next((b for b in (1, 8, 16) if (rate * 2 ** b).is_integer()), 32)
    threshold = min(round(rate * 2 ** bits), 2 ** bits - 1)
    return module.tfrs_logq_dropout(x, tf.cast(seed, tf.int64), bits=bits, threshold=threshold,
                                    scale=1.0 / (1.0 - rate))


__all__ = ["CACHE_ENV", "ENV_VAR", "NativeBuildError", "available", "build", "cache_dir",
           "dropout", "enabled", "in_xla_context", "layer_norm", "library_path", "load",
           "sampled_dot"]
