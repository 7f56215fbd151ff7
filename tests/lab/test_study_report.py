"""`lab.study_report`'s chart without a study (the report of a real tiny grid is
checked end to end in test_study.py)."""

import os

import pytest

from lab import study_report


def _rows():
    scenario = {"num_items": 1000, "num_topics": 8, "topic_sharpness": 2.0, "sampler": "mixed",
                "num_in_batch": 4, "num_uniform": 4, "steps": 10, "batch_size": 8,
                "optimizer": "adam"}
    return [{**scenario, "proposal": "unigram", "correction": correction, "seed": seed,
             "run_id": f"{correction}-{seed}",
             **{f"exact_recall@{k}": 0.01 * k ** 0.5 + 0.001 * seed + (0.002 if correction ==
                                                                       "corrected" else 0)
                for k in study_report.KS}}
            for correction in ("logq-tfrs", "corrected") for seed in (0, 1, 2)]


def test_the_chart_is_written_whole_as_a_png(tmp_path):
    (tmp_path / "paired.png").write_bytes(b"an older chart")
    study_report.write_chart(_rows(), str(tmp_path / "paired.png"))
    assert (tmp_path / "paired.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.listdir(tmp_path) == ["paired.png"]  # no temporary left


def test_regime_points_pair_the_same_proposal_at_the_truths_positive_share(tmp_path):
    rows = [{**row, "truth_p_over_q_q50": "24.0"} for row in _rows()]
    rows += [{**row, "proposal": "mixture", "run_id": "m" + row["run_id"]}
             for row in rows if row["correction"] == "logq-tfrs"]
    points = study_report.regime_points(rows, "exact_recall@10")
    # corrected (unigram) has one standard variant of its own proposal; the
    # mixture logq-tfrs rows are another proposal and are not a regime point.
    assert len(points) == 1
    assert points[0]["share"] == 24.0 / (24.0 + 8)  # mixed 4 + 4 negatives
    assert points[0]["mean"] == pytest.approx(0.002)
    study_report.write_regime_chart(rows, str(tmp_path / "regime.png"))
    assert (tmp_path / "regime.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_on_another_machine_stays_in_its_scenario_and_the_table_names_both():
    table_fields = {**{f"oracle_exact_recall@{k}": 0.5 for k in study_report.KS},
                    **{f"truth_p_over_q_q{q}": 8.0 for q in (10, 50, 90)},
                    **{f"{b}_recall@100": 0.3 for b in ("observed", "head", "torso", "tail")},
                    "observed_recall@1000": 0.4, "truth_p_q50": 0.01,
                    "model_p_over_q_q50": 5.0, "seconds_per_step": 0.1}
    rows = [{**row, **table_fields, "machine": "2 cores, CPU A, AVX2"} for row in _rows()]
    rows[0] = {**rows[0], "machine": "2 cores, CPU B, AVX-512"}
    assert len(study_report.scenarios(rows)) == 1
    text = study_report.format_table(rows)
    assert "Ran on: 2 cores, CPU A, AVX2; 2 cores, CPU B, AVX-512." in text
    older = [{k: v for k, v in row.items() if k != "machine"} for row in rows]
    assert "Ran on" not in study_report.format_table(older)  # older rows name none


def test_a_resumed_run_stays_in_its_scenario():
    rows = _rows()
    rows[1] = {**rows[1], "resumed_from_step": "1200"}
    rows = [{"resumed_from_step": "0", **row} for row in rows]
    scenarios = study_report.scenarios(rows)
    assert len(scenarios) == 1
    (variants,) = scenarios.values()
    assert sorted(variants[("unigram", "logq-tfrs")]) == [0, 1, 2]


def test_the_summary_lists_every_scenario_by_share_with_its_paired_differences():
    # The model's P/Q median: the standard variant's seeds give 2, 4, 6 (mean 4), the
    # corrected ones 100, which the model share (the standard model's) must not use.
    def model(row):
        return str(100.0 if row["correction"] == "corrected" else 2.0 + 2 * row["seed"])

    low = [{**row, "truth_p_over_q_q50": "8.0", "model_p_over_q_q50": model(row)}
           for row in _rows()]
    high = [{**row, "num_topics": 80, "truth_p_over_q_q50": "72.0",
             "model_p_over_q_q50": model(row), "run_id": "h" + row["run_id"]}
            for row in _rows()]
    lines = study_report.format_summary(high + low)
    body = [line for line in lines if line.startswith("| 0.")]
    assert len(body) == 2
    # truth 8 / (8 + 8 negatives); model 4 / (4 + 8)
    assert body[0].startswith("| 0.500 | 0.333 | V=1,000, C=8,")
    assert body[1].startswith("| 0.900 | 0.333 | V=1,000, C=80,")
    assert "| logq-tfrs (unigram) | 3 | +0.0020 ± 0.0000" in body[0]
    assert study_report.format_summary([]) == []


def test_each_proposal_is_compared_with_the_unigram_one_under_the_same_correction():
    # inclusion = unigram + 0.003 under logq-tfrs and + (0.001 * seed) under corrected.
    rows = _rows()
    rows += [{**row, "proposal": "inclusion", "run_id": "i" + row["run_id"],
              "exact_recall@10": row["exact_recall@10"]
              + (0.003 if row["correction"] == "logq-tfrs" else 0.001 * row["seed"])}
             for row in _rows()]
    (variants,) = study_report.scenarios(rows).values()
    diffs = study_report.proposal_comparisons(variants, "exact_recall@10")
    assert [(c, p) for c, p, _ in diffs] == [("corrected", "inclusion"),
                                             ("logq-tfrs", "inclusion")]
    corrected, paper = diffs[0][2], diffs[1][2]
    assert corrected["mean"] == pytest.approx(0.001)
    assert corrected["within_noise"]  # 0, 0.001, 0.002: the t(2) interval holds 0
    assert paper["mean"] == pytest.approx(0.003) and not paper["within_noise"]
    # No proposal other than the baseline: nothing to compare.
    assert study_report.proposal_comparisons(study_report.scenarios(_rows())[
        next(iter(study_report.scenarios(_rows())))], "exact_recall@10") == []


def test_the_table_lists_each_proposal_against_the_unigram_one():
    table_fields = {**{f"oracle_exact_recall@{k}": 0.5 for k in study_report.KS},
                    **{f"truth_p_over_q_q{q}": 8.0 for q in (10, 50, 90)},
                    **{f"{b}_recall@100": 0.3 for b in ("observed", "head", "torso", "tail")},
                    "observed_recall@1000": 0.4, "truth_p_q50": 0.01,
                    "model_p_over_q_q50": 5.0, "seconds_per_step": 0.1}
    rows = [{**row, **table_fields} for row in _rows()]
    rows += [{**row, "proposal": "mixture", "run_id": "m" + row["run_id"],
              **{f"exact_recall@{k}": row[f"exact_recall@{k}"] + 0.001 * k ** 0.5
                 for k in study_report.KS}}
             for row in rows]
    lines = study_report.format_table(rows).splitlines()
    (paper,) = [line for line in lines if line.startswith("| mixture − unigram (logq-tfrs)")]
    # +0.001 sqrt(k) at k = 10, 100, 1000, the same in every seed; observed unchanged.
    assert paper.split(" | ")[1:] == ["+0.0032 ± 0.0000", "+0.0100 ± 0.0000",
                                      "+0.0316 ± 0.0000", "+0.0000 ± 0.0000 (within noise) |"]
    assert "proposal minus unigram" not in study_report.format_table(rows[:6])
