"""`benchmarks/study_scann.py --quick`: its output's structure and the exact rows' sanity."""

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("scann")

# A benchmark's smoke run (25-45 s): `make test-slow` (CI runs it after `make test`).
pytestmark = pytest.mark.slow

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "study_scann.py")


def _run(tmp_path, *seeds):
    out = subprocess.run([sys.executable, SCRIPT, "--quick", "--output-dir", str(tmp_path),
                          "--seeds", *map(str, seeds)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_quick_mode_compares_scann_indexes_with_brute_force_and_resumes(tmp_path):
    text = _run(tmp_path, 0)
    assert text.startswith("machine: ")
    number = r"([0-9.]+)"
    row = (r"^\| (\d) \| (corrected|logq-tfrs) \(mixture\) \| ([^|]+) \| "
           + r" \| ".join([number] * 6) + r" \| ([0-9. /]+) \| [0-9.]+ \|$")
    rows = re.findall(row, text, re.M)
    indexes = ["brute force", "export --k 100", "export --k 1000", "k 1000, 1/5 leaves"]
    assert [(r[1], r[2].strip()) for r in rows] == [(c, i) for c in ("logq-tfrs", "corrected")
                                            for i in indexes]
    for r in rows:
        exact = [float(x) for x in r[3:6]]
        assert 0 < exact[0] <= exact[1] <= exact[2] <= 1
        if r[2].strip() != "brute force":
            overlaps = [float(x) for x in r[9].split(" / ")]
            # 20 steps leave the embeddings near random, which is hard for any ANN index:
            # only the range and the head of the list are checked, not the index's quality.
            assert all(0.0 < o <= 1.0 for o in overlaps) and overlaps[0] > 0.5, overlaps
    # One seed: differences without an interval, one per index.
    diffs = re.findall(r"^\| logq-tfrs \| ([^|]+) \| 1 \| ([-+0-9.]+) \| ", text, re.M)
    assert [d[0].strip() for d in diffs] == indexes
    saved = json.loads((tmp_path / "scann.json").read_text())
    assert [r["run"]["seed"] for r in saved] == [0, 0]
    assert saved[0]["indexes"]["export --k 100"]["params"]["tree"]  # the tree was used
    wide = saved[0]["indexes"]["k 1000, 1/5 leaves"]["params"]
    assert wide["num_leaves_to_search"] == wide["num_leaves"] // 5
    assert saved[0]["indexes"]["export --k 1000"]["params"]["reorder"] == 10_000

    # A second call with seeds 0 and 1 reruns only seed 1 and gives intervals.
    text = _run(tmp_path, 0, 1)
    saved2 = json.loads((tmp_path / "scann.json").read_text())
    assert saved2[:2] == saved and [r["run"]["seed"] for r in saved2] == [0, 0, 1, 1]
    diffs = re.findall(r"^\| logq-tfrs \| ([^|]+) \| 2 \| ([-+0-9.]+) ± ([0-9.]+)",
                       text, re.M)
    assert [d[0].strip() for d in diffs] == indexes
    by = {(r["run"]["correction"], r["run"]["seed"]): r["indexes"] for r in saved2}
    for index, mean, _ in diffs:
        index = index.strip()
        expected = sum(by[("corrected", s)][index]["exact_recall@10"]
                       - by[("logq-tfrs", s)][index]["exact_recall@10"] for s in (0, 1)) / 2
        assert abs(float(mean) - expected) < 6e-5, (index, mean, expected)
    assert (tmp_path / "scann.md").read_text() == text


def test_a_foreign_scann_json_is_refused_in_one_line(tmp_path):
    (tmp_path / "scann.json").write_text('{"not": "a list"}')
    out = subprocess.run([sys.executable, SCRIPT, "--quick", "--output-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 2
    assert "is not this script's output" in out.stderr.strip().splitlines()[-1]
