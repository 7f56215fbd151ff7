"""`tf_philox` and the held-out batch against TensorFlow itself (skipped without it).

    .venv/bin/python -m pytest -q benchmarks/accelerator/tests/test_tf_philox.py
"""

import os
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)

from benchmarks.accelerator import tf_philox  # noqa: E402
from benchmarks.accelerator.world import EVAL_BATCH_INDEX, World, WorldConfig  # noqa: E402


@pytest.mark.parametrize("seed", [[0, EVAL_BATCH_INDEX], [3, 7], [-5, 2**40 + 3]])
def test_stateless_draws_equal_tensorflow(seed):
    s = tf.constant(seed, tf.int64)
    np.testing.assert_array_equal(
        tf.random.stateless_uniform([5, 3], seed=s, dtype=tf.float64).numpy(),
        tf_philox.uniform_float64((5, 3), seed))
    np.testing.assert_array_equal(
        tf.random.stateless_uniform([7], seed=s, maxval=20_000, dtype=tf.int64).numpy(),
        tf_philox.uniform_int64((7,), seed, 0, 20_000))
    np.testing.assert_array_equal(tf.random.experimental.stateless_split(s, 2).numpy(),
                                  tf_philox.split(seed, 2))


def test_held_out_batch_and_truth_equal_the_tf_stream():
    from tfrs_logq.pipelines.synthetic import SyntheticConfig, SyntheticStream

    fields = dict(num_items=5000, num_users=700, num_topics=50, topic_sharpness=8.0)
    w = World(WorldConfig(**fields), 300)
    stream = SyntheticStream(SyntheticConfig(**fields))
    batch = next(iter(stream.dataset(300, num_batches=1, start_batch=EVAL_BATCH_INDEX)))
    for key in ("user_id", "history", "target"):
        np.testing.assert_array_equal(batch[key].numpy(), w.eval_batch[key])
    np.testing.assert_allclose(w.log_q[1:], stream.item_log_marginal()[1:], rtol=1e-13)
    np.testing.assert_allclose(
        w.true_log_prob(np.arange(300), w.eval_batch["target"]),
        stream.true_log_prob(batch["user_id"], batch["target"]).numpy(), rtol=1e-13)
