"""`tfrs_logq.experiment`'s outputs that need no training (the grid itself runs end to end
in test_training.py)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from tfrs_logq import experiment  # noqa: E402


def _rows(datasets, low, high, seeds=(0, 1, 2)):
    rng = np.random.default_rng(0)
    return [{"dataset": d, "split": "gsasrec", "loss": loss, "seed": seed, "preset": "smoke",
             "test_ndcg@20": float(rng.uniform(low, high))}
            for d in datasets for loss in experiment.ROW_LABELS for seed in seeds]


@pytest.mark.parametrize("datasets", [["ml-1m"], ["ml-1m", "steam"]])
@pytest.mark.parametrize("low, high", [(0.0031, 0.0042), (0.15, 0.19), (0.0, 0.9)])
def test_table_png_x_tick_labels_do_not_overlap(datasets, low, high, tmp_path):
    # Issue 23: a smoke grid's table.png (NDCG@20 about 0.004) had ten 6-character x tick
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
