"""The two-tower example (keras-logq/examples/two_tower.py) trains with `model.fit` on this
backend: Recall@k over the catalog (keras_rs BruteForceRetrieval) rises well above chance,
and the frequency estimator counted exactly the training items."""

import importlib.util
import os

import pytest

pytest.importorskip("keras_rs")

_PATH = os.path.join(os.path.dirname(__file__), "..", "examples", "two_tower.py")
_spec = importlib.util.spec_from_file_location("two_tower_example", _PATH)
two_tower = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(two_tower)

SMALL = ["--synthetic-items", "300", "--synthetic-users", "300", "--num-topics", "10",
         "--batch-size", "64", "--steps", "60", "--num-test", "600", "--k", "20"]


@pytest.mark.parametrize("extra", [[], ["--num-uniform", "16"], ["--loss", "logq-tfrs"]],
                         ids=["in-batch-corrected", "mns-corrected", "in-batch-logq-tfrs"])
def test_example_trains_on_this_backend(extra):
    result = two_tower.main(SMALL + extra)
    chance = 20 / 300
    assert result["counts_match"]
    assert result["recall_before"] < 2 * chance
    assert result["recall_at_20"] > 3 * chance, result
