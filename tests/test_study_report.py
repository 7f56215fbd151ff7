"""`tfrs_logq.study_report`'s chart without a study (the report of a real tiny grid is
checked end to end in test_study.py)."""

import os

from tfrs_logq import study_report


def _rows():
    scenario = {"num_items": 1000, "num_topics": 8, "topic_sharpness": 2.0, "sampler": "mixed",
                "num_in_batch": 4, "num_uniform": 4, "steps": 10, "batch_size": 8,
                "optimizer": "adam"}
    return [{**scenario, "proposal": "unigram", "correction": correction, "seed": seed,
             "run_id": f"{correction}-{seed}",
             **{f"exact_recall@{k}": 0.01 * k ** 0.5 + 0.001 * seed + (0.002 if correction ==
                                                                       "corrected" else 0)
                for k in study_report.KS}}
            for correction in ("logq-paper", "corrected") for seed in (0, 1, 2)]


def test_the_chart_is_written_whole_as_a_png(tmp_path):
    (tmp_path / "paired.png").write_bytes(b"an older chart")
    study_report.write_chart(_rows(), str(tmp_path / "paired.png"))
    assert (tmp_path / "paired.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["paired.png"]  # no temporary left
