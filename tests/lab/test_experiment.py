"""`lab.experiment`'s outputs that need no training (the grid itself runs end to end
in test_training.py)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from lab import experiment  # noqa: E402


def _rows(datasets, low, high, seeds=(0, 1, 2)):
    rng = np.random.default_rng(0)
    return [{"dataset": d, "split": "gsasrec", "loss": loss, "seed": seed, "preset": "smoke",
             "test_ndcg@20": float(rng.uniform(low, high))}
            for d in datasets for loss in experiment.ROW_LABELS for seed in seeds]


@pytest.mark.parametrize("datasets", [["ml-1m"], ["ml-1m", "steam"]])
@pytest.mark.parametrize("low, high", [(0.0031, 0.0042), (0.15, 0.19), (0.0, 0.9)])
def test_table_png_x_tick_labels_do_not_overlap(datasets, low, high, tmp_path):
    # A smoke grid's table.png (NDCG@20 about 0.004) had ten 6-character x tick
    # labels ("0.0000" ... "0.0045") that ran into each other.
    fig = experiment._chart_figure(_rows(datasets, low, high))
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    assert len(fig.axes) == len(datasets)
    for ax in fig.axes:
        left, right = ax.get_xlim()
        labels = [t for t in ax.get_xticklabels()
                  if t.get_text() and left <= t.get_position()[0] <= right]
        assert len(labels) >= 3
        boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
        gaps = [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:])]
        assert min(gaps) > 4, [t.get_text() for t in labels]  # pixels between labels
    experiment._chart(_rows(datasets, low, high), str(tmp_path / "table.png"))
    assert (tmp_path / "table.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_outputs_writes_every_file_whole_and_leaves_no_temporary(tmp_path):
    import csv

    rows = _rows(["ml-1m"], 0.1, 0.2, seeds=(0,))
    for row in rows:
        row["test_recall@20"] = 0.5
    rows[0]["an_old_column"] = "x"  # a row read from an older table: restval for the others
    curves = [[0.1, 0.2]] * len(rows)
    (tmp_path / "results.csv").write_text("old\n")
    experiment.write_outputs(rows, str(tmp_path), curves)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "curves.csv", "curves.png", "results.csv", "table.md", "table.png"]
    with open(tmp_path / "results.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert len(read) == len(rows) and read[0]["an_old_column"] == "x"
    assert read[1]["an_old_column"] == ""
    assert read[0]["test_ndcg@20"] == str(rows[0]["test_ndcg@20"])
    assert list(read[0])[-1] == "an_old_column"  # this release's columns first
    assert (tmp_path / "table.md").read_text() == experiment.markdown_table(rows) + "\n"
    with open(tmp_path / "curves.csv", newline="") as f:
        curve_rows = list(csv.reader(f))
    assert curve_rows[0][-2:] == ["epoch", "val_ndcg@10"] and len(curve_rows) == 1 + 2 * len(rows)
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
