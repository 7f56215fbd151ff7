"""`tfrs_logq.studies.demo`'s outputs that need no training (the demo runs end to end through the
CLI in test_metrics_models_cli.py)."""

import csv
import os

import numpy as np

from tfrs_logq.studies import demo


def _rows():
    return [{"method": name, **{f"recall@{k}": 0.1 * i + k / 10_000 for k in demo.KS},
             "train_seconds": 1.5, "eval_seconds": 0.25}
            for i, name in enumerate(["standard logQ", "corrected, with a comma"])]


def test_write_outputs_writes_results_and_chart_whole(tmp_path):
    (tmp_path / "results.csv").write_text("an older run\n")
    demo.write_outputs(_rows(), str(tmp_path), "a title")
    assert sorted(os.listdir(tmp_path)) == ["recall.png", "results.csv"]  # no temporary
    with open(tmp_path / "results.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [r["method"] for r in read] == ["standard logQ", "corrected, with a comma"]
    assert list(read[0]) == list(_rows()[0])
    assert float(read[1]["recall@100"]) == _rows()[1]["recall@100"]
    assert (tmp_path / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_regime_line_states_the_truths_positive_share():
    from tfrs_logq.pipelines.synthetic import SyntheticStream

    stream = SyntheticStream(num_items=500, num_users=50, num_topics=5, seed=1)
    batch = next(iter(stream.dataset(256, num_batches=1)))
    line = demo.regime_line(stream, batch, 64)
    targets = batch["target"].numpy()
    ratio = np.median(np.exp(stream.true_log_prob(batch["user_id"], targets).numpy()
                             - stream.item_log_marginal()[targets]))
    assert f"median {ratio:,.1f} against about 63 in-batch" in line
    assert f"share of the standard loss's denominator is {ratio / (ratio + 63):.3f}" in line


def test_regime_line_says_how_to_move_a_world_where_the_losses_coincide():
    from tfrs_logq.pipelines.synthetic import SyntheticStream

    def line(num_topics, sharpness, batch_size):
        stream = SyntheticStream(num_items=2000, num_users=100, num_topics=num_topics,
                                 topic_sharpness=sharpness, seed=1)
        batch = next(iter(stream.dataset(512, num_batches=1)))
        return demo.regime_line(stream, batch, batch_size)

    coinciding = line(2, 1.0, 1024)  # P/Q about 2 against 1,023 negatives
    assert float(coinciding.split("denominator is ")[1][:5]) < demo.SMALL_SHARE
    assert "--num-topics 10000 --topic-sharpness 8" in coinciding
    apart = line(500, 8.0, 16)  # P/Q in the hundreds against 15
    assert float(apart.split("denominator is ")[1][:5]) > demo.SMALL_SHARE
    assert "--num-topics" not in apart
