"""Shared helpers for the benchmark scripts (timing and machine description); importing it
also puts this checkout's lab (lab/: the study, the SASRec grid; not installed) in reach."""

import os
import statistics
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # TFRS needs Keras 2 (tf-keras)
# The repository's root, appended: `import lab` finds the checkout's lab, and an installed
# tfrs_logq still comes first.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import tfrs_logq  # noqa: E402,F401
from tfrs_logq._util.hostinfo import cpu_description  # noqa: E402


def machine() -> str:
    gpus = tf.config.list_physical_devices("GPU")
    cpu = cpu_description()
    dev = f"{len(gpus)} GPU(s): " + ", ".join(
        tf.config.experimental.get_device_details(g).get("device_name", "?") for g in gpus
    ) if gpus else "no GPU"
    return f"{os.cpu_count()} CPU cores ({cpu}), {dev}, TensorFlow {tf.__version__}"


def time_fn(fn, *, warmup: int = 3, repeats: int = 20) -> tuple[float, float]:
    """Median and min seconds per call of ``fn`` (which must block until done)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), min(samples)


DEFAULT_ML1M = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared",
                            "data", "ml-1m-sasrec")


def ml1m_or_stand_in(data_dir: str):
    """SASRec's ML-1M from ``data_dir`` if present, else a synthetic stand-in of the same
    size (1M interactions, 6,000 users, 3,400 items); returns (interactions, description)."""
    import numpy as np

    from tfrs_logq.pipelines.datasets import load_movielens_1m
    from tfrs_logq.pipelines.interactions import build_interactions

    if os.path.isdir(data_dir):
        inter = load_movielens_1m(data_dir, fmt="sasrec", download_ok=False)
        return inter, f"ML-1M (SASRec ml-1m.txt, {len(inter):,} interactions)"
    rng = np.random.default_rng(0)
    n = 1_000_000
    inter = build_interactions(rng.integers(0, 6000, n), rng.zipf(1.2, n) % 3400 + 1,
                               np.arange(n), min_item_interactions=1)
    return inter, "synthetic stand-in (../shared/data absent)"
