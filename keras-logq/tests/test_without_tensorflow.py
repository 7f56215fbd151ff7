"""keras_logq needs neither TensorFlow nor tf-keras: a fresh process in which importing
``tensorflow`` fails computes the corrected loss and its gradient equal to the numpy
reference (run on the JAX and PyTorch backends; those environments have no TensorFlow)."""

import os
import subprocess
import sys
import textwrap

import pytest
from conftest import BACKEND

SCRIPT = textwrap.dedent(
    """
    import sys

    # A None entry makes `import tensorflow` raise ImportError (and find_spec say "absent").
    for blocked in ("tensorflow", "tf_keras", "tensorflow_recommenders"):
        sys.modules[blocked] = None
    sys.path.append(REPO_TESTS)  # for reference.py; conftest.py is this directory's
    import numpy as np
    import keras
    from keras_logq.losses import sampled_softmax_loss
    import reference
    from conftest import value_and_grads

    rng = np.random.default_rng(1)
    s_p, s_n = rng.normal(size=4), rng.normal(size=(4, 6))
    log_q = np.log(rng.uniform(0.01, 0.3, size=(4, 6)))
    mask = rng.uniform(size=(4, 6)) > 0.3
    loss, (g_p, g_n) = value_and_grads(
        lambda a, b, c, m: sampled_softmax_loss(a, b, correction="corrected",
                                                negative_log_q=c, is_negative=m),
        [s_p.astype("float32"), s_n.astype("float32"), log_q.astype("float32"), mask], [0, 1])
    ref, ref_p, ref_n, _ = reference.loss_corrected(s_p, s_n, log_q, mask)
    np.testing.assert_allclose(loss, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_p, ref_p, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_n, ref_n, rtol=1e-5, atol=1e-6)
    assert sys.modules["tensorflow"] is None
    assert not any(m.startswith("tensorflow.") for m in sys.modules), "TF was imported"
    print("OK", keras.backend.backend())
    """
)


@pytest.mark.skipif(BACKEND == "tensorflow", reason="the TensorFlow backend needs TensorFlow")
def test_corrected_loss_and_gradient_without_tensorflow():
    here = os.path.dirname(os.path.abspath(__file__))
    preamble = f"REPO_TESTS = {os.path.join(here, '..', '..', 'tests')!r}\n"
    preamble += f"sys_path_tests = {here!r}\n"
    script = preamble + "import sys\nsys.path.insert(0, sys_path_tests)\n" + SCRIPT
    env = {**os.environ, "KERAS_BACKEND": BACKEND}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"OK {BACKEND}" in out.stdout


@pytest.mark.skipif(BACKEND == "tensorflow", reason="the TensorFlow backend needs TensorFlow")
def test_this_environment_has_no_tensorflow():
    """The JAX/PyTorch environment (.venv-keras) is installed without TensorFlow."""
    import importlib.util

    if os.environ.get("KERAS_LOGQ_ALLOW_TF") == "1":
        pytest.skip("KERAS_LOGQ_ALLOW_TF=1")
    assert importlib.util.find_spec("tensorflow") is None
