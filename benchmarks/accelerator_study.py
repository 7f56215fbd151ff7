#!/usr/bin/env python3
"""The synthetic study (research/study.md) on Keras 3 / JAX, without TensorFlow.

    python benchmarks/accelerator_study.py --preset smoke --output-dir /tmp/acc
    python benchmarks/accelerator_study.py --preset curve --output-dir OUT --max-seconds 540

Needs keras, jax, numpy and keras-logq (``keras-logq/``, importable or on PYTHONPATH).
The code is the package ``benchmarks/accelerator/``; the guide is
``research/accelerator-study.md``.
"""

import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
os.environ.setdefault("KERAS_BACKEND", "jax")
try:
    import keras_logq  # noqa: F401
except ImportError:  # the checkout's copy
    sys.path.insert(0, os.path.join(_ROOT, "keras-logq"))

from benchmarks.accelerator.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
