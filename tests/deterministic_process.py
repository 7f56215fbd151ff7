"""Trainings that a test compares bit for bit, run in a fresh interpreter where TensorFlow is
deterministic by construction: one intra-op thread, `enable_op_determinism`, nothing left by
an earlier test.

Why: in the suite's processes (pytest-xdist, two workers on two cores) a kernel's work split
is not a function of its inputs alone. TensorFlow's oneDNN kernels (on by default on CPUs with
AVX-512 VNNI or AMX, Intel Xeons among them) run on the intra-op pool through an adapter that
reports "already in parallel" when the caller is a pool thread, and oneDNN then runs the
kernel serially (tensorflow/core/util/mkl_threadpool.h); which thread calls a kernel (the
executor's, a tf.data function's, an inlined op's) depends on scheduling, and a GEMM split
over threads may split its reduction too. The same ops on the same inputs then differ by an
ulp, and a metric decided by a tie differs by a hit: TFRS's top-1 accuracy with a streaming
index compares a positive's score (a row-wise product) with its own score in the index (a
matmul), a hit or a miss by one ulp. A fresh clone's suite on a 2-core Intel Xeon (AVX-512,
AMX) failed that way once in 1,268 tests (top-1 0.003125 against 0.00234375, one hit of
1,280), and passed run alone. With one intra-op thread every kernel takes its serial path,
and with op determinism tf.data and the ops that have a nondeterministic kernel take their
deterministic one: the same ops on the same inputs give the same bits, whatever ran before
in the process and whatever else runs on the machine.

`run_deterministic(fn, *args)` calls ``fn(*args)`` in such an interpreter (spawned, so no
TensorFlow state is inherited) and returns its result; an exception in it (a failed
assertion) is raised here. ``fn`` must be importable by its module's name.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os


def _initialise(logical_cpus: int) -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    # Inter-op threads only decide which ops run side by side, not any op's result; two,
    # so that a MirroredStrategy's collectives (one op per device) are never starved.
    tf.config.threading.set_inter_op_parallelism_threads(2)
    if logical_cpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * logical_cpus)
    tf.config.experimental.enable_op_determinism()


def run_deterministic(fn, *args, logical_cpus: int = 1, timeout: float = 900.0):
    """``fn(*args)`` in a fresh interpreter, one intra-op thread, op determinism enabled and
    ``logical_cpus`` logical CPU devices (for a `tf.distribute.MirroredStrategy` there)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=_initialise,
            initargs=(logical_cpus,)) as pool:
        return pool.submit(fn, *args).result(timeout=timeout)


def configuration() -> dict:
    """What the interpreter runs with (read inside ``fn``, for a test that checks the set-up)."""
    import tensorflow as tf
    from tensorflow.python.framework import config as tf_config  # no public reader in 2.20

    return {
        "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
        "determinism": bool(tf_config.is_op_determinism_enabled()),
        "logical_cpus": len(tf.config.list_logical_devices("CPU")),
    }
