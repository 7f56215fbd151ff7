"""Native CPU kernels, compiled on first use: the fused gather-dot of sampled logits.

`sampled_dot(queries, table, ids)` is ``queries[i] . table[ids[i, j]]`` as `[n, k]`
without the `[n, k, dim]` block of gathered embeddings that `tf.gather` + `einsum`
builds, and without the `[n, catalog]` matmul of the dense alternative. It is what
makes per-position uniform negatives (uniform, MNS, BCE/gBCE) cheap on CPU.

The kernel (`sampled_dot.cc`, beside this file) is compiled with TensorFlow's own
compile and link flags the first time it is needed, into a cache directory
(``$TFRS_LOGQ_CACHE``, else ``$XDG_CACHE_HOME/tfrs_logq`` or ``~/.cache/tfrs_logq``),
keyed by the source, TensorFlow's version, the compiler and the CPU; the build writes
to a temporary file and renames it, under a file lock, so concurrent processes build
it once and never load a half-written library. ``$CXX`` names the compiler (default
``g++``). ``TFRS_LOGQ_NATIVE=0`` turns the kernels off, ``=1`` makes a failed build an
error; by default a failed build logs a warning once and callers fall back to
TensorFlow ops (the same results up to float rounding).

There is a CPU kernel only, and XLA cannot compile it: callers use it on CPU-only
hosts, outside ``jit_compile`` (see `SequenceObjective`'s ``native_kernels``).
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
import tempfile
import threading
from pathlib import Path
from typing import Optional

import tensorflow as tf

logger = logging.getLogger(__name__)

ENV_VAR = "TFRS_LOGQ_NATIVE"
SOURCE = Path(__file__).with_name("sampled_dot.cc")
_CXXFLAGS = ["-shared", "-fPIC", "-O3", "-march=native", "-fopenmp-simd",
             "-Wno-deprecated-declarations"]
_BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state: dict = {}  # "module", "error"


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
    root = os.environ.get("TFRS_LOGQ_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfrs_logq"


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


def _build_command(output: str) -> list[str]:
    return [*_compiler(), *_CXXFLAGS, str(SOURCE), "-o", output,
            *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def library_path() -> Path:
    """Where the library for this source, TensorFlow, compiler and CPU lives."""
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    compiler = " ".join(_compiler())
    for part in (tf.__version__, compiler, " ".join(_CXXFLAGS), _cpu_signature(compiler),
                 " ".join(tf.sysconfig.get_compile_flags())):
        key.update(b"\0" + part.encode())
    return cache_dir() / f"sampled_dot-{tf.__version__}-{key.hexdigest()[:16]}.so"


def build(force: bool = False) -> Path:
    """Compiles the kernels unless the cached library exists; returns its path.

    Raises:
      NativeBuildError: no compiler, or the compiler failed (its output is included).
    """
    target = library_path()
    if target.exists() and not force:
        return target
    if shutil.which(_compiler()[0]) is None:
        raise NativeBuildError(f"no C++ compiler {_compiler()[0]!r} on PATH (set $CXX).")
    try:
        import fcntl
    except ImportError as e:  # not POSIX: callers fall back to TensorFlow ops
        raise NativeBuildError("building the native kernels needs a POSIX system") from e
    target.parent.mkdir(parents=True, exist_ok=True)

    with open(str(target) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists() and not force:  # built by another process meanwhile
            return target
        for stale in target.parent.glob(".tmp-*.so"):  # left by a killed build
            with contextlib.suppress(OSError):
                stale.unlink()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            logger.warning("tfrs_logq: compiling the native sampled-logits kernel (once; about "
                           "20 s) into %s", target)
            result = subprocess.run(_build_command(tmp), capture_output=True, text=True,
                                    timeout=_BUILD_TIMEOUT_S)
            if result.returncode != 0:
                raise NativeBuildError(
                    f"compiling {SOURCE.name} failed ({' '.join(_build_command(tmp))}):\n"
                    f"{result.stderr[-4000:]}")
            os.replace(tmp, target)
        except subprocess.TimeoutExpired as e:
            raise NativeBuildError(f"compiling {SOURCE.name} took over {_BUILD_TIMEOUT_S} s") from e
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
    return target


def _sampled_dot_grad(op, upstream):
    d_queries, d_table = _state["module"].tfrs_logq_sampled_dot_grad(upstream, *op.inputs)
    return d_queries, d_table, None


def _no_second_derivative(op, *upstream):
    raise NotImplementedError("tfrs_logq.native.sampled_dot has no second derivative; use "
                              "native_kernels=False for higher-order gradients.")


# Registered by op name, once per process (a module reload must not register twice).
for _name, _fn in (("TfrsLogqSampledDot", _sampled_dot_grad),
                   ("TfrsLogqSampledDotGrad", _no_second_derivative)):
    with contextlib.suppress(KeyError):
        tf.RegisterGradient(_name)(_fn)


def _load_library() -> object:
    path = build()
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


__all__ = ["ENV_VAR", "NativeBuildError", "available", "build", "cache_dir", "library_path",
           "load", "sampled_dot"]
