"""`tfrs_logq.studies.demo`'s outputs that need no training (the demo runs end to end through the
CLI in test_metrics_models_cli.py)."""

import csv
import os

import numpy as np

from tfrs_logq.studies import demo


def _rows():
    return [{"method": name, **{f"recall@{k}": 0.1 * i + k / 10_000 for k in demo.KS},
             "model_positive_share": 0.5}
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


def test_the_table_has_no_timing_column_and_the_difference_is_spelled_out():
    # A "train s" column of single runs on a shared machine read as "corrected
    # is 2x slower"; equal recalls read as "the correction does nothing".
    rows = [{"method": "in-batch, logq-tfrs", "recall@10": 0.6729, "recall@100": 0.7783,
             "recall@1000": 0.8678, "model_positive_share": 0.3},
            {"method": "in-batch, corrected", "recall@10": 0.6874, "recall@100": 0.7849,
             "recall@1000": 0.8652, "model_positive_share": 0.31}]
    assert "train s" not in demo.format_table(rows)
    lines = demo.difference_lines(rows)
    assert lines[0] == ("corrected minus standard logQ, Recall@k: +0.0145 at 10, "
                        "+0.0066 at 100, -0.0026 at 1000.")
    assert "0.31" in lines[1] and "tfrs-logq compare" in lines[2]


def test_the_default_world_puts_the_positives_share_where_the_losses_differ():
    config = demo.DemoConfig()
    stream = demo.SyntheticStream(demo.SyntheticConfig(
        num_items=config.num_items, num_users=config.num_users, num_topics=config.num_topics,
        topic_sharpness=config.topic_sharpness, seed=config.seed))
    batch = next(iter(stream.dataset(2048, num_batches=1, start_batch=demo.EVAL_START_BATCH)))
    line = demo.regime_line(stream, batch, config.batch_size)
    assert float(line.split("denominator is ")[1][:5]) > 0.3
