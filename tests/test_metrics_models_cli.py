"""Rank metrics against numpy, the two-tower model, the demo CLI and the public API."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfrs_logq
from tfrs_logq.metrics import recall_ndcg_from_ranks, target_ranks


def test_target_ranks_and_metrics_match_numpy():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(50, 6)).astype(np.float32)
    items = rng.normal(size=(40, 6)).astype(np.float32)
    targets = rng.integers(1, 40, 50)
    exclude = rng.integers(0, 40, size=(50, 5))
    exclude[:, 0] = targets  # the target is never excluded
    ranks = target_ranks(q, items, targets, exclude=exclude, chunk_size=16)
    scores = q @ items.T
    expected = []
    for i in range(50):
        valid = np.ones(40, bool)
        valid[0] = False
        valid[exclude[i]] = False
        valid[targets[i]] = False
        expected.append(int((scores[i][valid] >= scores[i, targets[i]]).sum()))
    np.testing.assert_array_equal(ranks, expected)
    metrics = recall_ndcg_from_ranks(ranks, (1, 10))
    r = np.array(expected)
    assert metrics["recall@10"] == pytest.approx(np.mean(r < 10))
    assert metrics["ndcg@10"] == pytest.approx(np.mean(np.where(r < 10, 1 / np.log2(r + 2), 0)))


def test_recall_ndcg_from_ranks_histograms_and_the_beam_evaluator_agree():
    """One implementation: the Beam Evaluator's figures are `tfrs_logq.metrics`' on the same
    ranks, and both are the formula in numpy."""
    from tfrs_logq.pipelines.beam import evaluation

    from tfrs_logq.metrics import rank_histogram, recall_ndcg_from_histogram

    ranks = np.random.default_rng(2).integers(0, 3000, size=500) // 3
    r = ranks.astype(np.float64)
    histogram = rank_histogram(ranks, 1000)
    assert histogram.sum() == 500 and histogram[-1] == int(np.sum(ranks >= 1000))
    from_ranks = recall_ndcg_from_ranks(ranks, (10, 20, 100, 1000))
    from_histogram = recall_ndcg_from_histogram(histogram, (10, 100, 1000), (20,))
    beam = evaluation.metrics_from_histogram(histogram)
    assert beam == from_histogram
    for k in (10, 100, 1000):
        assert from_histogram[f"recall@{k}"] == pytest.approx(np.mean(r < k), rel=1e-12)
        assert from_ranks[f"recall@{k}"] == pytest.approx(np.mean(r < k), rel=1e-12)
    expected = np.mean(np.where(r < 20, 1 / np.log2(r + 2), 0))
    assert from_histogram["ndcg@20"] == pytest.approx(expected, rel=1e-12)
    assert from_ranks["ndcg@20"] == pytest.approx(expected, rel=1e-12)
    # The docstring's example: ranks [0, 3, miss].
    example = evaluation.metrics_from_histogram(rank_histogram([0, 3, 5000], 1000))
    assert example["recall@10"] == pytest.approx(2 / 3)
    assert round(example["ndcg@20"], 4) == 0.4769


def test_metrics_docstring_examples_run():
    import doctest

    from tfrs_logq import metrics

    result = doctest.testmod(metrics, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 2


def test_ties_count_against_the_target():
    ranks = target_ranks(np.zeros((2, 3), np.float32), np.ones((5, 3), np.float32), [1, 4])
    np.testing.assert_array_equal(ranks, [3, 3])  # 4 real items, all tied


# The documented public API: each name and the module that defines it.
PUBLIC_API = {
    "CORRECTIONS": "tfrs_logq.losses",
    "CorrectedRetrieval": "tfrs_logq.tasks",
    "CountMinSketch": "tfrs_logq.frequency",
    "ExactFrequency": "tfrs_logq.frequency",
    "InBatchSampler": "tfrs_logq.sampling",
    "MixedSampler": "tfrs_logq.sampling",
    "SampledNegatives": "tfrs_logq.sampling",
    "StreamingFrequency": "tfrs_logq.frequency",
    "UniformSampler": "tfrs_logq.sampling",
    "sampled_softmax_loss": "tfrs_logq.losses",
}
PUBLIC_MODULES = ("frequency", "losses", "sampling", "tasks")


def test_public_api_names_import():
    """`__all__` is the hand-written list, and every name is the object its module defines."""
    import importlib
    import types

    assert sorted(tfrs_logq.__all__) == sorted([*PUBLIC_API, *PUBLIC_MODULES, "__version__"])
    for name, module_name in PUBLIC_API.items():
        module = importlib.import_module(module_name)
        obj = getattr(tfrs_logq, name)
        assert obj is getattr(module, name), name
        if isinstance(obj, (type, types.FunctionType)):
            assert obj.__module__ == module_name, (name, obj.__module__)
    for name in PUBLIC_MODULES:
        assert getattr(tfrs_logq, name) is importlib.import_module(f"tfrs_logq.{name}")
    from tfrs_logq._version import __version__

    assert tfrs_logq.__version__ == __version__ and __version__.count(".") >= 2
    assert tfrs_logq.CORRECTIONS == ("none", "logq", "corrected")
    with pytest.raises(AttributeError):
        tfrs_logq.no_such_name  # noqa: B018


def test_two_tower_model_trains_on_the_stream_and_beats_untrained(tmp_path):
    from tfrs_logq.pipelines.synthetic import SyntheticStream

    from tfrs_logq.models import TwoTowerModel

    stream = SyntheticStream(num_items=2000, num_users=500, num_topics=10, seed=0)
    eval_batch = next(iter(stream.dataset(1024, num_batches=1, start_batch=10**6)))
    model = TwoTowerModel(
        2001, 16, tfrs_logq.CorrectedRetrieval(),
        frequency=tfrs_logq.CountMinSketch(depth=3, width=4096),
    )
    model.compile(optimizer=tf.keras.optimizers.Adam(0.01))

    def recall100():
        ranks = target_ranks(model.query_tower(eval_batch["history"]), model.item_embeddings(),
                             eval_batch["target"])
        return recall_ndcg_from_ranks(ranks, (100,))["recall@100"]

    before = recall100()
    model.fit(stream.dataset(256, num_batches=150), verbose=0)
    after = recall100()
    assert after > before + 0.1
    assert float(model.frequency.total.numpy()) == 150 * 256


def test_demo_cli_writes_table_csv_and_png(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "demo", "--output-dir", str(out),
         "--num-items", "3000", "--num-users", "500", "--steps", "30", "--batch-size", "128",
         "--num-eval", "256", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    methods = [r["method"] for r in result["results"]]
    assert methods == ["oracle (true P(d|u))", "in-batch, none", "in-batch, logq",
                       "in-batch, corrected"]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and 0 <= float(rows[1]["recall@1000"]) <= 1
    assert (out / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_says_what_it_is_doing_in_a_log(tmp_path):
    # Issue 23: piped or logged (stdout not a terminal), a demo correction printed
    # nothing for its whole training (Keras' bar is one line per epoch, the demo one
    # epoch). Now: a timed line per phase and a line every tenth of the steps.
    steps = 30
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "demo", "--output-dir", str(tmp_path / "d"),
         "--num-items", "3000", "--num-users", "500", "--steps", str(steps), "--batch-size",
         "128", "--num-eval", "256"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    every = -(-steps // 10)
    expected = [f"step {n}/{steps}:" for n in range(every, steps + 1, every)]
    for correction in ("none", "logq", "corrected"):
        start = next(i for i, line in enumerate(lines) if f"correction={correction!r}" in line)
        done = next(i for i, line in enumerate(lines) if f"{correction}: trained in" in line)
        steps_seen = [line.split()[0] + " " + line.split()[1] for line in lines[start + 1:done]]
        assert steps_seen == expected, lines[start:done + 1]
        assert lines[done - 1].endswith("about 0 s left")
    stamped = [line for line in lines if line.startswith("[")]
    assert len(stamped) == 2 + 2 * 3  # the stream, 2 a correction, the files
    seconds = [float(line[1:line.index(" s]")]) for line in stamped]
    assert seconds == sorted(seconds)


def test_demo_cli_rejects_bad_corrections():
    proc = subprocess.run(
        [sys.executable, "-m", "tfrs_logq.cli", "demo", "--corrections", "none,bogus"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and "bogus" in proc.stderr


def _fresh_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in __import__("os").environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)


def test_import_selects_tf_keras_even_after_tensorflow_if_keras_untouched():
    proc = _fresh_python("import tensorflow as tf\nimport tfrs_logq\n"
                         "print(tf.keras.__name__ if hasattr(tf.keras, '__name__') else '')")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tf_keras" in proc.stdout


def test_import_after_keras3_was_loaded_fails_with_instructions():
    proc = _fresh_python("import tensorflow as tf\n_ = tf.keras.layers\nimport tfrs_logq\n")
    assert proc.returncode != 0
    assert "TF_USE_LEGACY_KERAS=1" in proc.stderr and "Keras 3" in proc.stderr
