"""The batch pipeline on Apache Beam (`tfrs_logq.pipelines.beam`), against the in-memory code.

Every Beam run here uses the local FnApiRunner with two worker processes
(multi_processing), as the command does; one run costs about 4-6 s on two
busy cores (BulkInferrer's about 15 s: its workers load TensorFlow), so the runs
are few: one module fixture (the command, all seven components, smoke training,
on a SASRec file), then one per behaviour that needs its own job.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

apache_beam = pytest.importorskip("apache_beam")

from tfrs_logq import cli  # noqa: E402
from tfrs_logq.pipelines import datasets, examples  # noqa: E402
from tfrs_logq.pipelines.beam import (  # noqa: E402
    COMPONENTS,
    ArtifactError,
    ExampleGen,
    artifacts,
    load_item_statistics,
    load_log_q,
    read_split,
    run_components,
    run_pipeline,
)
from tfrs_logq.pipelines.beam.example_gen import plan_shards, read_shard  # noqa: E402
from tfrs_logq.pipelines.interactions import DataFormatError, build_interactions  # noqa: E402
from tfrs_logq.pipelines.splits import gsasrec_split, make_split  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
SASREC_ML1M = [os.path.join(SHARED, "ml-1m-sasrec", name) for name in ("ml-1m.txt",
                                                                       "ml-1m.txt.gz")]
SMALL = {"shard_bytes": 400, "chunk_lines": 40}  # several byte ranges and chunks per file


# ------------------------------------------------------------------------- fixtures


def write_sasrec(path, users=60, items=40, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for u in range(1, users + 1):
            for item in rng.zipf(1.3, size=int(rng.integers(2, 25))) % items + 1:
                f.write(f"{u} {item}\n")


def write_ratings(path, users=50, items=30, seed=1, bad=(), crlf=False):
    """``ratings.dat`` with ties in time, ids that need reindexing, and ``bad`` lines
    inserted at those (1-based) line numbers."""
    rng = np.random.default_rng(seed)
    lines = []
    for u in rng.permutation(np.arange(100, 100 + users)):
        for k in range(int(rng.integers(3, 15))):
            item = 7 * (int(rng.zipf(1.4)) % items) + 3
            lines.append(f"{u}::{item}::{int(rng.integers(1, 6))}::{1000 + k // 2 * 60}")
    for number in sorted(bad):
        assert number <= len(lines) + 1
        lines.insert(number - 1, "1::2::3")  # three fields: malformed
    end = "\r\n" if crlf else "\n"
    with open(path, "w", newline="") as f:
        f.write(end.join(lines) + end)


def in_memory(split_name, read, path, fmt_reindex=True, skip=False, **split_options):
    columns = read(path, skip_bad_lines=skip)
    times = columns[2] if len(columns) == 3 else None
    interactions = build_interactions(columns[0], columns[1], times, reindex=fmt_reindex,
                                      name="")
    return make_split(interactions, split_name, **split_options)


def assert_same_split(got, ref):
    a, b = got.interactions, ref.interactions
    assert (a.num_users, a.num_items, len(a)) == (b.num_users, b.num_items, len(b))
    for name in ("user", "item", "raw_users", "raw_items"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    if b.timestamp is None:
        assert a.timestamp is None
    else:
        np.testing.assert_array_equal(a.timestamp, b.timestamp)
    assert len(got.sequences) == len(ref.sequences)
    for s, t in zip(got.sequences, ref.sequences):
        np.testing.assert_array_equal(s, t)
    np.testing.assert_array_equal(got.train_lengths, ref.train_lengths)
    for part in ("validation", "test"):
        for field in ("users", "history_lengths", "targets"):
            np.testing.assert_array_equal(getattr(getattr(got, part), field),
                                          getattr(getattr(ref, part), field),
                                          err_msg=f"{part}.{field}")
    assert got.stats() == ref.stats()


def cli_run(capsys, *argv):
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``tfrs-logq pipeline run`` on ML-1M as SASRec's file (a small one), leave-one-out
    split, a 64-wide sketch, smoke training, a brute-force export pushed to a serving base
    path."""
    base = tmp_path_factory.mktemp("beam")
    data = base / "ml-1m.txt"
    write_sasrec(data)
    root = base / "root"
    argv = ["pipeline", "run", "--pipeline-root", root, "--dataset", "ml-1m", "--data-dir",
            base, "--data-format", "sasrec", "--split", "loo", "--num-shards", "3",
            "--sketch-width", "64", "--sketch-seed", "7", "--index", "brute-force",
            "--model_base_path", base / "serving"]
    code = cli.main([str(a) for a in argv])
    assert code == 0
    return {"root": str(root), "data": str(data), "argv": argv, "serving": str(base / "serving")}


# ------------------------------------------------------------------------ ExampleGen


def test_example_gen_equals_the_in_memory_split(built):
    ref = in_memory("loo", datasets.read_sasrec_txt, built["data"], fmt_reindex=False)
    got = read_split(os.path.join(built["root"], "ExampleGen"))
    assert_same_split(got, ref)
    manifest = artifacts.verified_manifest(os.path.join(built["root"], "ExampleGen"))
    with open(built["data"]) as f:
        assert manifest["counts"]["num_rows"] == len(f.readlines()) > len(ref.interactions)
    assert manifest["inputs"]["data"]["path"] == os.path.abspath(built["data"])
    assert sorted(manifest["outputs"]) == [
        "examples/data-00000-of-00003.tfrecord", "examples/data-00001-of-00003.tfrecord",
        "examples/data-00002-of-00003.tfrecord", "vocabulary/items.txt", "vocabulary/users.txt"]


def test_records_are_tf_train_examples_tensorflow_parses(built):
    import tensorflow as tf

    path = os.path.join(built["root"], "ExampleGen", "examples", "data-00001-of-00003.tfrecord")
    data = next(iter(tf.data.TFRecordDataset(path)))  # also checks TFRecord's CRCs
    spec = {name: tf.io.VarLenFeature(tf.int64) for name in examples.INT_FEATURES
            if name != "timestamps"}
    parsed = {k: v.values.numpy() for k, v in tf.io.parse_single_example(data, spec).items()}
    ref = in_memory("loo", datasets.read_sasrec_txt, built["data"], fmt_reindex=False)
    user = int(parsed["user"][0])
    assert user % 3 == 1
    np.testing.assert_array_equal(parsed["item_ids"], ref.sequences[user])
    assert parsed["train_length"][0] == ref.train_lengths[user]
    np.testing.assert_array_equal(parsed["test_targets"], ref.sequences[user][-1:])


def test_plain_files_are_read_in_byte_ranges_that_end_at_line_ends(tmp_path):
    path = tmp_path / "r.dat"
    write_ratings(path, users=5, crlf=True)
    text = path.read_bytes()
    ranges = list(plan_shards(str(path), 100))
    assert len(ranges) > 3
    assert b"".join(text[s:s + n] for _, s, n, _ in ranges) == text
    numbered = [(first + k, line) for r in ranges for _, first, lines, _ in
                read_shard(r, "ratings", 3) for k, line in enumerate(lines)]
    with open(path, encoding="latin-1") as f:
        assert numbered == list(enumerate(f, start=1))


def test_ratings_with_bad_lines_fail_naming_file_and_line(tmp_path, capsys):
    """The job fails with the in-memory loader's message: the file (here ML-1M's zip and
    its member) and the first bad line."""
    write_ratings(tmp_path / "ratings.dat", bad=(150, 300))
    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "ml-1m.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.write(tmp_path / "ratings.dat", "ml-1m/ratings.dat")
    with pytest.raises(DataFormatError) as expected:
        datasets.read_ratings_dat(str(path))
    assert f"{path}:ml-1m/ratings.dat, line 150: " in str(expected.value)
    root = tmp_path / "root"
    code, out, err = cli_run(capsys, "pipeline", "run", "--pipeline-root", root, "--data-dir",
                             tmp_path / "data", "--split", "loo")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"tfrs-logq: error: {expected.value}"
    assert not root.exists()  # nothing half-written: a refused first run leaves no root


def test_skip_bad_lines_drops_and_counts_them(tmp_path):
    """ratings.dat (CRLF, reindexed ids, ties in time) with two bad lines, skipped;
    equal to the in-memory loader with skip_bad_lines, counted in the manifest."""
    path = tmp_path / "ratings.dat"
    write_ratings(path, bad=(3, 333), crlf=True)
    root = tmp_path / "root"
    run_components([ExampleGen(str(path), "ratings", split="loo", skip_bad_lines=True,
                               num_shards=2, **SMALL)], str(root))
    ref = in_memory("loo", datasets.read_ratings_dat, str(path), skip=True)
    assert_same_split(read_split(str(root / "ExampleGen")), ref)
    counts = artifacts.read_manifest(str(root / "ExampleGen"))["counts"]
    assert counts["skipped_lines"] == 2
    assert [m.split(": ")[0] for m in counts["skipped_examples"]] == [
        f"{path}, line 3", f"{path}, line 333"]


def test_gzipped_csv_with_string_ids_temporal_split(tmp_path):
    rng = np.random.default_rng(3)
    rows = [f"user{u},item-{int(rng.zipf(1.5)) % 25},{int(rng.integers(0, 50)) * 10}"
            for u in rng.integers(0, 40, size=700)]
    path = tmp_path / "steam.csv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("user,item,timestamp\n" + "\n".join(rows) + "\n")
    root = tmp_path / "root"
    run_components([ExampleGen(str(path), "csv", split="temporal", temporal_fraction=0.2,
                               **SMALL)], str(root))
    ref = in_memory("temporal", datasets.read_interactions_csv, str(path), fraction=0.2)
    got = read_split(str(root / "ExampleGen"))
    assert_same_split(got, ref)
    assert got.interactions.raw_users.dtype.kind == "U"


# ------------------------------------------------------------------------ Statistics


def test_statistics_equal_train_item_counts_and_the_library_count_min_sketch(built):
    import tensorflow as tf

    from tfrs_logq.frequency import CountMinSketch

    ref = in_memory("loo", datasets.read_sasrec_txt, built["data"], fmt_reindex=False)
    directory = os.path.join(built["root"], "Statistics")
    stats = load_item_statistics(directory)
    np.testing.assert_array_equal(stats.counts, ref.train_item_counts())
    np.testing.assert_array_equal(load_log_q(directory), ref.train_log_q())
    cms = CountMinSketch(depth=4, width=64, seed=7)
    cms.update(tf.constant(np.concatenate(ref.train_sequences())))
    np.testing.assert_array_equal(stats.sketch.reshape(-1), cms.counters.numpy())
    ids = np.arange(ref.num_items + 1)
    np.testing.assert_allclose(load_log_q(directory, "count-min"), cms.log_q(ids).numpy(),
                               rtol=1e-6)
    loaded = stats.count_min_sketch()
    np.testing.assert_array_equal(loaded.count(ids).numpy(), cms.count(ids).numpy())
    assert stats.exact_frequency().total.numpy() == ref.train_lengths.sum()


def test_count_min_combine_merges_worker_sketches_by_summing():
    from tfrs_logq.pipelines.beam.statistics import ItemCountsFn

    rng = np.random.default_rng(0)
    batches = [rng.integers(1, 500, size=n) for n in (3, 70_000, 1, 900)]
    fn = ItemCountsFn(num_items=500, depth=3, width=50, seed=2)
    one = fn.create_accumulator()
    for batch in batches:
        one = fn.add_input(one, batch)
    parts = [fn.add_input(fn.create_accumulator(), b) for b in batches]
    merged = fn.merge_accumulators([fn.merge_accumulators(parts[:2]), *parts[2:]])
    a, b = fn.extract_output(one), fn.extract_output(merged)
    np.testing.assert_array_equal(a["sketch"], b["sketch"])
    np.testing.assert_array_equal(a["counts"], np.bincount(np.concatenate(batches),
                                                           minlength=501))
    assert a["sketch"].sum() == 3 * sum(len(x) for x in batches)


# ------------------------------------------------------------ reruns and damaged artifacts


def test_a_rerun_skips_current_components(built, capsys, monkeypatch):
    from tfrs_logq.pipelines.beam import artifacts, runner

    started = []  # Beam jobs and component builds, none of which a rerun starts
    monkeypatch.setattr(runner, "run", lambda *a, **k: started.append("a Beam job"))
    real_staging = artifacts.staging_directory
    monkeypatch.setattr(artifacts, "staging_directory",
                        lambda root, name: started.append(name) or real_staging(root, name))
    code, out, _ = cli_run(capsys, *built["argv"])
    assert code == 0
    assert started == []
    for name in COMPONENTS:
        assert f"{name}: skipped (current" in out, name
    code, out, _ = cli_run(capsys, *built["argv"], "--stop-after", "Statistics")
    assert code == 0 and "Statistics: skipped" in out and "Trainer" not in out


def test_a_damaged_artifact_is_refused_and_rebuilt_identically(built, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(built["root"], root)
    shard = root / "ExampleGen" / "examples" / "data-00002-of-00003.tfrecord"
    original = shard.read_bytes()
    shard.write_bytes(original[:40] + bytes([original[40] ^ 1]) + original[41:])
    with pytest.raises(ArtifactError, match="data-00002-of-00003.tfrecord was altered"):
        read_split(str(root / "ExampleGen"))
    (root / "Statistics" / "extra.txt").write_text("x")
    with pytest.raises(ArtifactError, match="extra.txt is not in the manifest"):
        load_log_q(str(root / "Statistics"))
    (root / "Statistics" / "extra.txt").unlink()
    results = run_pipeline(str(root), built["data"], "sasrec", split="loo", dataset="ml-1m",
                           num_shards=3, sketch_width=64, sketch_seed=7, index="brute-force")
    # The rebuilt records are the same bytes, so nothing downstream reruns.
    assert [(r.name, r.status) for r in results] == [("ExampleGen", "ran")] + [
        (name, "skipped") for name in COMPONENTS[1:-1]]
    assert "altered" in results[0].reason
    assert shard.read_bytes() == original  # deterministic: the same bytes again


def test_stale_reasons_name_what_changed(built, tmp_path):
    directory = os.path.join(built["root"], "Statistics")
    manifest = artifacts.read_manifest(directory)
    same = artifacts.stale_reason(directory, "Statistics", manifest["version"],
                                  manifest["inputs"], manifest["parameters"])
    assert same is None
    wider = {**manifest["parameters"], "width": 128}
    assert "width: 64 -> 128" in artifacts.stale_reason(
        directory, "Statistics", manifest["version"], manifest["inputs"], wider)
    assert "inputs changed (examples)" in artifacts.stale_reason(
        directory, "Statistics", manifest["version"], {"examples": {}}, manifest["parameters"])
    assert artifacts.stale_reason(str(tmp_path / "none"), "Statistics", 1, {}, {}) == \
        "not built yet"


def test_publish_replaces_whole_directories_and_stale_staging_is_removed(tmp_path):
    root = str(tmp_path)
    for content in ("old", "new"):
        with artifacts.staging_directory(root, "C") as staging:
            with open(os.path.join(staging, "f"), "w") as f:
                f.write(content)
            artifacts.write_manifest(staging, {"component": "C"})
            artifacts.publish(staging, os.path.join(root, "C"))
    assert open(os.path.join(root, "C", "f")).read() == "new"
    assert sorted(os.listdir(root)) == ["C"]
    with pytest.raises(RuntimeError):
        with artifacts.staging_directory(root, "C"):
            raise RuntimeError("build failed")
    assert sorted(os.listdir(root)) == ["C"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    os.mkdir(os.path.join(root, f".tmp-C-{dead}-abc"))
    os.mkdir(os.path.join(root, f".tmp-C-{os.getpid()}-abc"))
    assert artifacts.remove_stale(root) == [f".tmp-C-{dead}-abc"]


def test_a_second_run_on_the_same_root_is_refused(tmp_path):
    with artifacts.locked(str(tmp_path)):
        with pytest.raises(ArtifactError, match="in use by another pipeline run") as e:
            run_components([], str(tmp_path))
    if sys.platform.startswith("linux"):  # the holder, from /proc/locks
        assert f"(process {os.getpid()})" in str(e.value)
    with artifacts.locked(str(tmp_path)):  # released with the block
        pass


def test_a_root_that_cannot_be_locked_warns_and_runs(tmp_path, monkeypatch, caplog):
    import errno
    import fcntl
    import logging

    def no_flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    ran = []
    with caplog.at_level(logging.WARNING, logger=artifacts.__name__):
        with artifacts.locked(str(tmp_path)):
            ran.append(True)
    assert ran and any("has no flock" in r.getMessage() for r in caplog.records)



class _Toy:
    """A component that logs to ROOT/.logs (as Beam's workers do) and writes one file,
    then fails when told to (as ExampleGen refusing bad data)."""

    USES_BEAM = False
    version = 1

    def __init__(self, name, fail=False):
        self.name, self.fail = name, fail

    def inputs(self, root):
        return {}

    def parameters(self):
        return {}

    def build(self, root, staging, run):
        os.makedirs(os.path.join(root, ".logs"), exist_ok=True)
        with open(os.path.join(root, ".logs", f"{self.name}.log"), "a") as f:
            f.write("a worker's log\n")
        with open(os.path.join(staging, "data"), "w") as f:
            f.write(self.name)
        if self.fail:
            raise DataFormatError(f"{self.name}: bad data")
        return {}


def _files(root):
    """``{path relative to root: bytes}`` of every file and ``{dir/: None}`` of every
    directory under ``root``."""
    found = {}
    for parent, dirs, files in os.walk(root):
        rel = os.path.relpath(parent, root)
        found.update({os.path.normpath(os.path.join(rel, d)) + "/": None for d in dirs})
        for name in files:
            with open(os.path.join(parent, name), "rb") as f:
                found[os.path.normpath(os.path.join(rel, name))] = f.read()
    return found


def test_a_run_failing_before_any_component_finished_leaves_the_root_as_it_was(tmp_path):
    """A first run refused by its first component leaves no root (nor the parents it
    made); on an existing root it removes what it added and leaves the rest as it was.
    Once a component finished, a later failure keeps the root, its artifact, the lock
    file and the failing component's log."""
    root = tmp_path / "runs" / "r"
    with pytest.raises(DataFormatError, match="A: bad data"):
        run_components([_Toy("A", fail=True)], str(root))
    assert os.listdir(tmp_path) == []
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("mine")
    (root / ".logs").mkdir()
    (root / ".logs" / "A.log").write_text("an older run's log\n")
    before = _files(root)
    with pytest.raises(DataFormatError, match="B: bad data"):
        run_components([_Toy("B", fail=True)], str(root))
    assert _files(root) == before  # .lock and .logs/B.log, which it made, are gone
    with pytest.raises(DataFormatError, match="B: bad data"):
        run_components([_Toy("A"), _Toy("B", fail=True)], str(root))
    after = _files(root)
    assert after["A/data"] == b"A" and after[".logs/B.log"] == b"a worker's log\n"
    assert ".lock" in after and after["notes.txt"] == b"mine"
    assert not [name for name in os.listdir(root) if name.startswith(".tmp-")]


def test_a_run_refused_for_a_held_root_removes_nothing(tmp_path):
    """The lock is taken before anything is undone: a run refused because another holds
    the root leaves that run's root, lock file included, alone."""
    root = tmp_path / "r"
    with artifacts.locked(str(root)):
        with pytest.raises(ArtifactError, match="in use by another pipeline run"):
            run_components([_Toy("A", fail=True)], str(root))
        assert os.listdir(root) == [artifacts.LOCK]
        with pytest.raises(ArtifactError, match="in use by another pipeline run"):
            run_components([], str(root))  # the lock file held is the one in ROOT
    assert os.listdir(root) == [artifacts.LOCK]


# ----------------------------------------------------------------------- the command


def test_pipeline_help_and_other_commands_import_no_beam():
    code = ("import sys\nfrom tfrs_logq import cli\n"
            "cli.parse(['pipeline', 'run', '--pipeline-root', 'x'])\n"
            "cli.parse(['data', 'stats'])\n"
            "for path in (['pipeline', 'run'], ['pipeline'], []):\n"
            "    try:\n        cli.main(path + ['--help'])\n    except SystemExit:\n        pass\n"
            "import tfrs_logq.pipelines.beam as b\nb.read_split, b.load_log_q\n"
            "print('apache_beam' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == "False"
    assert "--pipeline-root" in proc.stdout and "--skip-bad-lines" in proc.stdout


def test_the_old_input_flags_are_refused_and_sasrec_has_no_temporal_split(tmp_path, capsys):
    """A user's log is --interactions now, a dataset's file is found in --data-dir: tyro
    refuses --input (and --data-format's old csv), exit status 2, naming the flag."""
    log = tmp_path / "x.csv"
    log.write_text("user,item\n1,2\n")
    for flags, named in ((("--input", log), "--input"),
                         (("--data-format", "csv"), "--data-format")):
        code, _, err = cli_run(capsys, "pipeline", "run", "--pipeline-root", tmp_path / "r",
                               *flags)
        assert code == 2 and named in err and "Traceback" not in err, err
    data = tmp_path / "d"
    data.mkdir()
    write_sasrec(data / "ml-1m.txt")
    code, _, err = cli_run(capsys, "pipeline", "run", "--pipeline-root", tmp_path / "r",
                           "--data-dir", data, "--data-format", "sasrec", "--split", "temporal")
    assert code == 2 and "temporal split needs timestamps" in err


@pytest.mark.parametrize("flags, message", [
    (("--synthetic-users", "50"), "--synthetic-users is a flag of --dataset synthetic"),
    (("--interactions", "x.csv", "--user-column", "u", "--item-column", "i", "--data-dir", "d"),
     "--data-dir is --dataset's; --interactions names the log itself"),
    (("--interactions", "x.csv", "--user-column", "u"), "--interactions needs --item-column"),
    (("--dataset", "steam", "--user-column", "u"), "--user-column is a flag of --interactions"),
    (("--min-item-interactions", "2",), "--min-item-interactions is a flag of --interactions"),
    (("--weight-column", "w"), "--weight-column: the pipeline's Trainer (SASRec) does not"),
    (("--dataset", "steam", "--data-format", "sasrec"), "steam has no such choice"),
    (("--dataset", "synthetic", "--data-format", "sasrec"), "it takes no --data-format"),
    (("--dataset", "synthetic", "--split", "temporal"), "it takes no --split"),
    (("--dataset", "synthetic", "--temporal-fraction", "0.2"), "no --temporal-fraction"),
    (("--dataset", "synthetic", "--data-dir", "d"), "it takes no --data-dir"),
])
def test_data_flags_the_source_does_not_read_are_refused(tmp_path, capsys, flags, message):
    code, _, err = cli_run(capsys, "pipeline", "run", "--pipeline-root", tmp_path / "r",
                           *flags)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "r").exists()


def test_worker_code_is_shipped_by_value_and_runs_without_tensorflow(tmp_path):
    """What Beam sends to its workers loads and runs in a process that has never
    imported tfrs_logq (so never TensorFlow)."""
    from apache_beam.internal import pickler

    from tfrs_logq.pipelines.beam import runner
    from tfrs_logq.pipelines.beam.bulk_inferrer import (
        EncodePrediction,
        TestQueries,
        TopKModelHandler,
    )
    from tfrs_logq.pipelines.beam.evaluator import RankMetricsFn, TargetRanks
    from tfrs_logq.pipelines.beam.example_gen import WriteShard, assemble, parse_chunk
    from tfrs_logq.pipelines.beam.statistics import ItemCountsFn, TrainingItems

    with runner.code_by_value():
        blob = pickler.dumps([parse_chunk, ItemCountsFn(9, 2, 8, 0), assemble, plan_shards,
                              read_shard, WriteShard("x", 2), TrainingItems(),
                              RankMetricsFn(), TargetRanks(np.zeros(3, np.int64), 1000),
                              TestQueries("v", {"users": "int", "items": "int"}, 5),
                              EncodePrediction(), TopKModelHandler("x", 5)])
    (tmp_path / "fns").write_bytes(blob)
    code = ("import sys\nfrom apache_beam.internal import pickler\n"
            f"fns = pickler.loads(open({str(tmp_path / 'fns')!r}, 'rb').read())\n"
            "chunk = fns[0](('f', 7, ['1 2\\n', 'bad\\n', '1 3\\n'], None), 'sasrec')\n"
            "assert (chunk['rows'], chunk['skipped']) == (2, 1), chunk\n"
            "assert chunk['errors'][0].startswith('f, line 8: '), chunk\n"
            "fn = fns[1]\nacc = fn.add_input(fn.create_accumulator(), chunk['columns'][1])\n"
            "assert fn.extract_output(acc)['counts'].tolist() == [0, 0, 1, 1] + [0] * 6\n"
            "fn = fns[7]\nacc = fn.add_input(fn.create_accumulator(), 3)\n"
            "assert fn.extract_output(acc)['recall@10'] == 1.0\n"
            "print('tensorflow' in sys.modules, 'tfrs_logq' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "False"]


def test_the_source_formats_are_example_gens():
    """`SOURCE_FORMATS` (in the package, which imports no Beam) are the formats ExampleGen
    reads. The package's other names: tests/test_public_api.py."""
    import tfrs_logq.pipelines.beam as beam_pipeline
    from tfrs_logq.pipelines.beam.example_gen import FORMATS

    assert set(beam_pipeline.SOURCE_FORMATS) == set(FORMATS)


# --------------------------------------------------------- Trainer, Exporter, BulkInferrer


def _in_memory_split(built):
    return in_memory("loo", datasets.read_sasrec_txt, built["data"], fmt_reindex=False)


def _trainer_metrics(built):
    with open(os.path.join(built["root"], "Trainer", "metrics.json")) as f:
        return json.load(f)


def test_trainer_on_the_records_equals_training_in_memory(built, tmp_path):
    """Same config and seed: the Trainer (ExampleGen records, Statistics' log Q) and
    `train` on the in-memory split reach the same validation curve and test figures."""
    from tfrs_logq.sasrec.training import resolve_config, train

    ran = _trainer_metrics(built)
    config = resolve_config("smoke", split="loo", dataset="ml-1m")
    result = train(config, str(tmp_path / "in-memory"), verbose=0, split=_in_memory_split(built))
    assert result["validation_curve"] == ran["validation_curve"]
    assert result["test"] == ran["test"]
    with open(os.path.join(built["root"], "Trainer", "config.json")) as f:
        saved = json.load(f)
    assert saved["examples"] == os.path.join(built["root"], "ExampleGen")
    assert saved["log_q"] == os.path.join(built["root"], "Statistics")
    assert (saved["preset"], saved["loss"], saved["seed"], saved["split"]) == (
        "smoke", "mns-corrected", 0, "loo")
    from tfrs_logq.studies.diagnose import model_dir_inputs  # reads the records too

    queries, _, positives, _ = model_dir_inputs(os.path.join(built["root"], "Trainer"), 8)
    assert queries.shape == (8, 16) and positives.shape == (8,)


def test_train_command_reads_the_examples_and_log_q(built, tmp_path, capsys):
    root = built["root"]
    flags = ["train", "--examples", os.path.join(root, "ExampleGen"), "--log-q",
             os.path.join(root, "Statistics"), "--preset", "smoke", "--json"]
    code, _, err = cli_run(capsys, *flags, "--model-dir", tmp_path / "m", "--split", "temporal")
    assert code == 2 and "--split temporal disagrees with --examples" in err
    assert not (tmp_path / "m").exists()
    code, out, err = cli_run(capsys, *flags, "--model-dir", tmp_path / "m")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["test"] == _trainer_metrics(built)["test"]
    assert result["split"] == "loo"


def _exact_ranks(built):
    """The trained model's test ranks as `train` computes them (full catalog, brute
    force, the history left out but the target kept), the split and the encoder."""
    from tfrs_logq.metrics import target_ranks
    from tfrs_logq.pipelines.sequential import evaluation_arrays
    from tfrs_logq.serving.export import load_trained

    encoder, config, raw_ids = load_trained(os.path.join(built["root"], "Trainer"))
    split = read_split(os.path.join(built["root"], "ExampleGen"))
    arrays = evaluation_arrays(split, split.test, config["max_length"])
    queries = encoder.last_query(arrays["history"], training=False).numpy()
    items = encoder.item_embeddings().numpy()
    ranks = target_ranks(queries, items, arrays["targets"], exclude=arrays["exclude"])
    return ranks, split, queries, items, raw_ids


def test_bulk_inferrer_lists_are_the_exact_top_k_without_the_history(built):
    from tfrs_logq.pipelines.beam import read_predictions

    _, split, queries, items, raw_ids = _exact_ranks(built)
    predictions = read_predictions(os.path.join(built["root"], "BulkInferrer"))
    part = split.test
    assert [(int(p["user"][0]), int(p["history_length"][0])) for p in predictions] == list(
        zip(part.users.tolist(), part.history_lengths.tolist()))
    for j, p in enumerate(predictions):
        history = split.sequences[part.users[j]][:part.history_lengths[j]]
        scores = items[1:] @ queries[j]
        unseen = np.setdiff1d(np.arange(1, split.num_items + 1), history)
        best = unseen[np.argsort(-scores[unseen - 1], kind="stable")]
        np.testing.assert_array_equal(p["item_ids"], raw_ids[best - 1], err_msg=str(j))
        np.testing.assert_allclose(p["scores"], scores[best - 1], rtol=1e-5, atol=1e-6)
        assert p["target_id"][0] == raw_ids[part.targets[j] - 1]
        assert p["target_in_history"][0] == (part.targets[j] in history)


def test_evaluator_equals_the_exact_figures_overall_and_by_slice(built):
    """Recall@10/100/1000 and NDCG@20 from the Beam CombineFn equal the figures of the
    exact in-process ranks, overall and per slice; a target already in the history is
    never listed (a miss), which `train`'s ranking (target kept) does not do."""
    from tfrs_logq.metrics import recall_ndcg_from_ranks
    from tfrs_logq.pipelines.beam import load_evaluation

    ranks, split, *_ = _exact_ranks(built)
    ran = _trainer_metrics(built)["test"]
    assert recall_ndcg_from_ranks(ranks, (10, 20)) == pytest.approx(ran, rel=1e-12)
    part = split.test
    seen = np.array([t in split.sequences[u][:n] for u, n, t in
                     zip(part.users, part.history_lengths, part.targets)])
    assert 0 < seen.sum() < len(seen)  # the fixture has both kinds
    ranks = np.where(seen, 1000, ranks)

    def figures(r):
        return {"num_targets": len(r), **{f"recall@{k}": np.mean(r < k) for k in (10, 100, 1000)},
                "ndcg@20": np.mean(np.where(r < 20, 1 / np.log2(r + 2.0), 0.0))}

    evaluation = load_evaluation(os.path.join(built["root"], "Evaluator"))
    assert evaluation["overall"] == pytest.approx(figures(ranks), rel=1e-12)
    counts = split.train_item_counts()[1:]
    by_popularity = sorted(range(split.num_items), key=lambda i: (-counts[i], i))
    decile = {item + 1: min(position * 10 // split.num_items, 9)
              for position, item in enumerate(by_popularity)}
    edges = [(0, 5), (6, 10), (11, 20), (21, 50), (51, 100), (101, 200)]
    bucket = [next((f"{a}-{b}" for a, b in edges if a <= n <= b), "201+")
              for n in part.history_lengths]
    expected = {
        "popularity_decile": [str(decile[t]) for t in part.targets],
        "history_length": bucket,
        "target_in_history": ["yes" if x else "no" for x in seen],
    }
    for name, labels in expected.items():
        labels = np.asarray(labels)
        got = {row.pop("slice"): row for row in evaluation["slices"][name]}
        assert set(got) == set(labels.tolist()), name
        for label, row in got.items():
            assert row == pytest.approx(figures(ranks[labels == label]), rel=1e-12), (name, label)
    assert evaluation["blessed"] is True and evaluation["blessing"]["checks"] == []


def test_rank_metrics_combine_merges_in_any_order():
    from tfrs_logq.pipelines.beam.evaluator import RankMetricsFn

    fn = RankMetricsFn()
    example = fn.create_accumulator()
    for rank in (0, 3, 5000):
        example = fn.add_input(example, rank)
    out = fn.extract_output(example)
    assert out["recall@10"] == pytest.approx(2 / 3)
    assert out["ndcg@20"] == pytest.approx((1 + 1 / np.log2(5)) / 3)  # 0.4769
    rng = np.random.default_rng(0)
    ranks = rng.integers(0, 1500, size=300)
    parts = [fn.create_accumulator() for _ in range(4)]
    for i, r in enumerate(ranks):
        parts[i % 4] = fn.add_input(parts[i % 4], r)
    merged = fn.merge_accumulators([fn.merge_accumulators(parts[2:]), *parts[:2]])
    whole = fn.create_accumulator()
    for r in ranks:
        whole = fn.add_input(whole, r)
    assert fn.extract_output(merged) == fn.extract_output(whole)
    assert fn.extract_output(whole)["recall@100"] == np.mean(ranks < 100)
    with pytest.raises(ValueError, match="max_cutoff"):
        RankMetricsFn(20)


def test_model_handler_loads_a_scann_export(built, tmp_path):
    """The handler loads a ScaNN export (`import scann`, then tf.saved_model.load) and
    answers what the brute-force export answered (tiny catalog: ScaNN scores every item
    and reorders exactly)."""
    pytest.importorskip("scann")
    from tfrs_logq.pipelines.beam import TopKModelHandler, read_predictions
    from tfrs_logq.pipelines.beam.bulk_inferrer import TestQueries
    from tfrs_logq.serving.export import export_version

    path = export_version(os.path.join(built["root"], "Trainer"), str(tmp_path / "scann"),
                          index="scann", default_k=10)
    handler = TopKModelHandler(path, k=1000, max_batch_size=16)
    assert handler.batch_elements_kwargs() == {"min_batch_size": 1, "max_batch_size": 16}
    manifest = artifacts.read_manifest(os.path.join(built["root"], "ExampleGen"))
    queries = TestQueries(os.path.join(built["root"], "ExampleGen", "vocabulary"),
                          manifest["counts"]["raw_id_types"], 30)
    queries.setup()
    shard = os.path.join(built["root"], "ExampleGen", "examples", "data-00000-of-00003.tfrecord")
    batch = [q for data in examples.read_records(shard) for q in queries.process(data)]
    results = list(handler.run_inference(batch, handler.load_model()))
    served = {(int(p["user"][0]), int(p["history_length"][0])): p
              for p in read_predictions(os.path.join(built["root"], "BulkInferrer"))}
    for query, result in zip(batch, results):
        expected = served[(query["user"], query["history_length"])]
        np.testing.assert_array_equal(result.inference["item_ids"], expected["item_ids"])
        np.testing.assert_allclose(result.inference["scores"], expected["scores"], rtol=1e-4,
                                   atol=1e-5)


def _scann_loads() -> bool:
    from tfrs_logq.serving.export import scann_ops_or_error

    try:
        scann_ops_or_error()
    except ImportError:
        return False
    return True


def test_exporter_auto_builds_faiss_where_scann_cannot_load(built, tmp_path, monkeypatch):
    """The Exporter component with ``index="auto"`` where ScaNN does not load makes
    export's own choice (`resolve_index`): a faiss index. Its manifest names the index,
    its settings and the recall@k measured against exact search, recomputed here from the
    stored index on the same held-out queries."""
    pytest.importorskip("faiss")
    from tfrs_logq.pipelines.beam import Exporter
    from tfrs_logq.pipelines.beam.exporter import INDEXES, saved_model_dir
    from tfrs_logq.serving import export as export_module
    from tfrs_logq.serving.faiss_index import FaissIndex
    from tfrs_logq.serving.scann_tuning import exact_top_k, recall_at_k, split_tuning_queries

    assert INDEXES == export_module.INDEXES and "faiss" in INDEXES
    with pytest.raises(ValueError, match="faiss"):
        Exporter("", index="annoy")
    flags = cli.parse(["pipeline", "run", "--pipeline-root", "x", "--index", "faiss"])
    assert flags.serving.index == "faiss"  # the command's flag takes the component's choices

    def no_scann():
        raise ImportError("ScaNN does not load here")

    made_with_scann = {"counts": {"index": "scann"}}
    assert (Exporter("", index="auto").stale_reason(made_with_scann) is None) == _scann_loads()
    monkeypatch.setattr(export_module, "scann_ops_or_error", no_scann)
    # an auto export of a ScaNN index is redone where ScaNN no longer loads
    assert "ScaNN" in Exporter("", index="auto").stale_reason(made_with_scann)
    assert Exporter("", index="scann").stale_reason(made_with_scann) is None
    trainer = os.path.join(built["root"], "Trainer")
    [result] = run_components([Exporter(trainer, index="auto", default_k=5)],
                              str(tmp_path / "root"))
    manifest = artifacts.verified_manifest(result.directory)
    counts = manifest["counts"]
    assert manifest["parameters"]["index"] == "auto" and counts["index"] == "faiss"
    path = saved_model_dir(result.directory)
    with open(os.path.join(path, "assets", "export.json")) as f:
        meta = json.load(f)
    assert meta["index"] == "faiss" and counts["index_parameters"] == meta["faiss"]
    assert counts["index_description"] == export_module.describe_index(meta)
    params = counts["index_parameters"]
    assert params["nlist"] == round(np.sqrt(meta["num_items"])) and params["tuned"]
    assert sorted(int(k) for k in counts["index_recall"]) == [5, meta["num_items"]]

    encoder, _, raw_ids = export_module.load_trained(trainer)
    queries, _ = export_module.run_queries(encoder, trainer, raw_ids)
    items, _, held_out = split_tuning_queries(encoder.item_embeddings().numpy()[1:], queries,
                                              meta["faiss_tuning"]["target_recall"])
    index = FaissIndex.load(path, meta)
    for k, recorded in counts["index_recall"].items():
        found = index.search(held_out, int(k), every_list_when_short=False)[0]
        assert recorded == round(recall_at_k(found, exact_top_k(held_out, items, int(k))), 4)


# ------------------------------------------------------------------ blessing and Pusher


def test_a_blessed_model_is_pushed_as_the_next_version(built):
    base = built["serving"]
    assert sorted(os.listdir(base)) == ["1"]  # no hidden temporary left
    assert os.path.exists(os.path.join(base, "1", "saved_model.pb"))
    assert os.stat(os.path.join(base, "1")).st_mode & 0o055 == 0o055  # readable by all
    manifest = artifacts.verified_manifest(os.path.join(built["root"], "Pusher"))
    assert (manifest["pushed"], manifest["pushed_version"]) == (True, 1)
    assert manifest["pushed_to"] == os.path.join(base, "1")
    exported = os.path.join(built["root"], "Exporter", "serving", "1")
    assert artifacts.output_fingerprints(exported) == artifacts.output_fingerprints(
        os.path.join(base, "1"))


def test_an_unblessed_model_is_not_pushed(built, tmp_path, capsys):
    """Thresholds and a baseline (an Evaluator artifact of the same data): a failed
    threshold withholds the blessing, and Pusher leaves the base path alone."""
    from tfrs_logq.pipelines.beam import Evaluator, Pusher, load_evaluation

    root = tmp_path / "root"
    for name in ("ExampleGen", "Statistics", "Exporter", "BulkInferrer"):
        shutil.copytree(os.path.join(built["root"], name), root / name)
    baseline = tmp_path / "baseline"
    shutil.copytree(os.path.join(built["root"], "Evaluator"), baseline)
    serving = tmp_path / "serving"
    evaluator = Evaluator(str(root / "BulkInferrer"), str(root / "Statistics"),
                          str(root / "ExampleGen"), thresholds={"recall@10": 0.99},
                          baseline=str(baseline))
    pusher = Pusher(str(root / "Exporter"), str(root / "Evaluator"), str(serving))
    results = run_components([evaluator, pusher], str(root))
    evaluation = load_evaluation(str(root / "Evaluator"))
    assert evaluation["blessed"] is False
    checks = evaluation["blessing"]["checks"]
    assert [(c["metric"], c["passed"]) for c in checks if "threshold" in c] == [
        ("recall@10", False)]
    assert all(c["passed"] for c in checks if "baseline" in c) and len(checks) == 5
    manifest = results[1].manifest
    assert manifest["pushed"] is False and not serving.exists()
    assert "not blessed: recall@10" in manifest["counts"]["reason"]
    assert "threshold 0.99" in manifest["counts"]["reason"]


def test_a_run_whose_model_is_not_blessed_exits_non_zero_with_one_line(built, tmp_path,
                                                                         capsys):
    """`pipeline run` exited 0 when the Evaluator withheld the blessing, so a
    scheduler saw a good run. It exits 3 (2 is an error), also when the run is repeated
    and every component is current, and also with --json."""
    root = tmp_path / "root"
    shutil.copytree(built["root"], root)
    argv = list(built["argv"])
    argv[argv.index("--pipeline-root") + 1] = root
    argv[argv.index("--model_base_path") + 1] = tmp_path / "serving"
    argv += ["--threshold", "recall@10=0.99"]
    for extra in ([], ["--json"]):
        code, out, err = cli_run(capsys, *argv, *extra)
        lines = err.strip().splitlines()  # progress lines ("Evaluator: running"), then it
        assert code == 3, (code, err)
        assert [line for line in lines if "blessed" in line] == lines[-1:], err
        assert "not blessed: recall@10" in lines[-1] and "threshold 0.99" in lines[-1]
        assert "nothing pushed" in lines[-1] and "Traceback" not in err
    assert not (tmp_path / "serving").exists()
    code, out, err = cli_run(capsys, *argv[:-2])  # without the threshold: blessed, pushed
    assert code == 0 and "blessed" not in err and os.listdir(tmp_path / "serving") == ["1"]
    # The Trainer ran the smoke preset (the default): the run says it is no usable model.
    assert err.strip().splitlines()[-1] == (
        "tfrs-logq: warning: smoke preset: a plumbing check, not a usable model; use "
        "--preset cpu for a useful one")


def test_bless_holds_figures_to_thresholds_and_a_baseline():
    from tfrs_logq.pipelines.beam.evaluation import bless

    overall = {"recall@10": 0.2, "recall@100": 0.6, "recall@1000": 0.9, "ndcg@20": 0.1}
    assert bless(overall, {}) == {"blessed": True, "checks": []}
    assert bless(overall, {"recall@10": 0.2})["blessed"] is True
    assert bless(overall, {"recall@10": 0.21})["blessed"] is False
    better = {**overall, "ndcg@20": 0.12}
    assert bless(overall, {}, better)["blessed"] is False
    assert bless(overall, {}, better, tolerance=0.02)["blessed"] is True
    with pytest.raises(ValueError, match="thresholds name"):
        from tfrs_logq.pipelines.beam import Evaluator

        Evaluator("p", "s", "e", thresholds={"recall@20": 0.1})


def test_push_copies_into_a_hidden_directory_then_renames(tmp_path, monkeypatch):
    from tfrs_logq.pipelines.beam import pusher

    model = tmp_path / "model"
    (model / "variables").mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"pb")
    (model / "variables" / "variables.index").write_bytes(b"ix")
    base = tmp_path / "base"
    (base / "1").mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (base / f".tmp-2-{dead}-abc").mkdir()  # left by a push that died
    renames = []

    def rename(src, dst):
        renames.append((src, dst, sorted(os.listdir(src))))
        return os.replace(src, dst)

    monkeypatch.setattr(pusher.os, "rename", rename)
    path = pusher.push_version(str(model), str(base))
    assert path == str(base / "2")
    [(src, dst, contents)] = renames
    assert os.path.dirname(src) == str(base) and os.path.basename(src).startswith(
        f".tmp-2-{os.getpid()}-")
    assert dst == path and contents == ["saved_model.pb", "variables"]  # complete first
    assert sorted(os.listdir(base)) == ["1", "2"]
    assert (base / "2" / "variables" / "variables.index").read_bytes() == b"ix"



@pytest.mark.parametrize("flag", ["--pipeline-root", "--train-config", "--interactions",
                                  "--data-dir", "--baseline", "--model_base_path"])
def test_an_empty_path_is_refused_naming_its_flag(tmp_path, capsys, flag):
    """An empty path is refused when the flags are parsed, in one line naming the flag
    (not "No such file or directory" once the data is read); nothing is created."""
    log = tmp_path / "log.csv"
    log.write_text("user,item\n1,2\n1,3\n2,2\n")
    flags = {"--pipeline-root": tmp_path / "r", "--interactions": log,
             "--user-column": "user", "--item-column": "item", "--stop-after": "ExampleGen"}
    if flag == "--data-dir":  # a flag of --dataset
        flags = {"--pipeline-root": tmp_path / "r", "--dataset": "ml-1m"}
    flags[flag] = ""
    code, out, err = cli_run(capsys, "pipeline", "run", *(x for kv in flags.items() for x in kv))
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == "", err
    assert lines[0].startswith("tfrs-logq: error: ") and "empty" in lines[0]
    assert flag.replace("_", "-") in lines[0] and "No such file" not in err
    assert os.listdir(tmp_path) == ["log.csv"]


def test_pipeline_flags_are_checked_before_anything_runs(tmp_path, capsys):
    write_sasrec(tmp_path / "ml-1m.txt")
    common = ["pipeline", "run", "--pipeline-root", tmp_path / "r", "--data-dir", tmp_path,
              "--data-format", "sasrec"]
    code, _, err = cli_run(capsys, *common, "--threshold", "recall@7=0.1")
    assert code == 2 and "recall@7=0.1" in err and "recall@10" in err
    code, _, err = cli_run(capsys, *common, "--threshold", "ndcg@20=2")
    assert code == 2 and "at most 1" in err
    bad = tmp_path / "train.json"
    bad.write_text(json.dumps({"num_blocks": 0}))
    code, _, err = cli_run(capsys, *common, "--train-config", bad)
    assert code == 2 and "num_blocks" in err
    assert not (tmp_path / "r" / "ExampleGen").exists()


# ------------------------------------------------------------------------ real ML-1M


@pytest.mark.skipif(not any(os.path.exists(p) for p in SASREC_ML1M),
                    reason="../shared/data/ml-1m-sasrec/ml-1m.txt[.gz] absent")
def test_ml1m_sasrec_gsasrec_equals_the_in_memory_split(tmp_path):
    """SASRec's ml-1m.txt (999,611 lines), gSASRec's split: about 12 s for both
    components on two busy cores."""
    path = next(p for p in SASREC_ML1M if os.path.exists(p))
    run_pipeline(str(tmp_path), path, "sasrec", split="gsasrec", dataset="ml-1m",
                 stop_after="Statistics")
    ref = gsasrec_split(datasets.load_movielens_1m(os.path.dirname(path), fmt="sasrec",
                                                   use_cache=False, download_ok=False))
    got = read_split(str(tmp_path / "ExampleGen"))
    assert_same_split(got, ref)
    assert (got.interactions.num_users, got.interactions.num_items) == (6040, 3416)
    np.testing.assert_array_equal(load_item_statistics(str(tmp_path / "Statistics")).counts,
                                  ref.train_item_counts())
    with open(tmp_path / "ExampleGen" / "manifest.json") as f:
        assert json.load(f)["counts"]["num_rows"] == 999_611



# ------------------------------------------------ runners, synthetic data, count-min


def test_runner_options_are_checked_before_anything_runs(tmp_path, capsys):
    from tfrs_logq.pipelines.beam.runner import check_runner

    root = {"--pipeline-root": str(tmp_path)}
    dataflow = ["--project", "p", "--region", "r", "--temp_location", "gs://b/tmp",
                "--sdk_container_image", "img"]
    for runner, args, missing in [
            ("DataflowRunner", dataflow[:2], "--region"),
            ("DataflowRunner", dataflow[:4], "--temp_location"),
            ("DataflowRunner", dataflow[:6], "--sdk_container_image"),
            ("FlinkRunner", [], "--flink_master"),
            ("SparkRunner", [], "--spark_master_url"),
            ("PortableRunner", [], "--job_endpoint"),
            ("FnApiRunner", ["--no_such_option", "1"], "--no_such_option")]:
        with pytest.raises(ValueError, match=missing) as info:
            check_runner(runner, args, root)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="gs:// path"):
        check_runner("DataflowRunner", dataflow[:5] + ["/tmp/t"] + dataflow[6:], root)
    for runner, args in [("DataflowRunner", dataflow),
                         ("FlinkRunner", ["--flink_master", "h:8081"]),
                         ("FlinkRunner", ["--job_endpoint", "h:8099"]),
                         ("SparkRunner", ["--spark_master_url", "spark://h:7077"]),
                         ("PortableRunner", ["--job_endpoint", "h:8099"])]:
        with pytest.raises(ValueError, match="local filesystem.*--force-local-root"):
            check_runner(runner, args, root)
        options = check_runner(runner, args, root, force_local_root=True)
        assert options.get_all_options()["runner"] == runner
    with pytest.raises(ValueError, match="POSIX"):
        check_runner("DataflowRunner", dataflow, {"--pipeline-root": "gs://b/root"})
    assert check_runner("FnApiRunner", [], root).get_all_options()["direct_num_workers"] == 2
    # The command: flags after -- are Beam's; the check runs before any component.
    common = ["pipeline", "run", "--pipeline-root", tmp_path / "r", "--dataset", "synthetic"]
    code, _, err = cli_run(capsys, *common, "--runner", "DataflowRunner", "--",
                           "--project", "p")
    assert code == 2 and "DataflowRunner needs --region" in err
    code, _, err = cli_run(capsys, *common, "--runner", "SparkRunner", "--",
                           "--spark_master_url", "spark://h:7077")
    assert code == 2 and "--force-local-root" in err
    code, _, err = cli_run(capsys, "pipeline", "run", "--pipeline-root", tmp_path / "r",
                           "--dataset", "synthetic", "--statistics", "count-min", "--",
                           "--bogus")
    assert code == 2 and "--bogus" in err
    assert not (tmp_path / "r" / "ExampleGen").exists()


TINY = dict(num_users=300, num_items=200, history_length=7, seed=3, num_topics=10,
            users_per_chunk=70)


@pytest.mark.slow  # Beam with 1 and more workers (11 s on 2 cores): make test-slow
def test_synthetic_data_is_the_same_on_any_number_of_workers(tmp_path):
    from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec, generate_ids

    spec = SyntheticSpec(**TINY)
    ids = generate_ids(spec)
    assert ids.shape == (300, 9) and ids.min() >= 1 and ids.max() <= 200
    outputs = []
    for workers in (1, 2):
        root = tmp_path / f"w{workers}"
        run_pipeline(str(root), "", "", synthetic=spec, statistics_mode="exact",
                     stop_after="Statistics", num_workers=workers, sketch_width=64)
        with open(root / "ExampleGen" / "manifest.json") as f:
            manifest = json.load(f)
        outputs.append(manifest["outputs"])
        stats = load_item_statistics(str(root / "Statistics"))
        np.testing.assert_array_equal(stats.counts, np.bincount(ids[:, :7].ravel(),
                                                                minlength=201))
        split = read_split(str(root / "ExampleGen"))
        np.testing.assert_array_equal(np.stack(split.sequences), ids)
        np.testing.assert_array_equal(split.test.targets, ids[:, 8])
        np.testing.assert_array_equal(split.train_item_counts(), stats.counts)
        assert stats.sketch.shape == (4, 64)
        np.testing.assert_array_equal(stats.sketch.sum(axis=1), np.full(4, 300 * 7))
    assert outputs[0] == outputs[1]  # same files, same sha256


def test_count_min_only_statistics_never_hold_exact_counts(tmp_path):
    from reference import count_min_cells

    from tfrs_logq.pipelines.beam.statistics import SyntheticStatistics
    from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec, generate_ids

    spec = SyntheticSpec(**TINY)
    run_components([SyntheticStatistics(spec, depth=3, width=50, seed=5)], str(tmp_path))
    stats = load_item_statistics(str(tmp_path / "Statistics"))
    assert stats.counts is None and stats.total == 300 * 7 and stats.num_items == 200
    counts = np.bincount(generate_ids(spec)[:, :7].ravel(), minlength=201)
    expected = np.zeros(150, np.int64)
    np.add.at(expected, count_min_cells(np.arange(201), 3, 50, 5).reshape(-1),
              np.tile(counts, 3))
    np.testing.assert_array_equal(stats.sketch.reshape(-1), expected)
    assert (stats.sketch_counts() >= counts).all()
    np.testing.assert_allclose(load_log_q(str(tmp_path / "Statistics"), "count-min"),
                               stats.sketch_log_q())
    with pytest.raises(ValueError, match="only the count-min sketch"):
        load_log_q(str(tmp_path / "Statistics"))


def test_train_refuses_a_synthetic_example_gen_artifact_in_one_line(tmp_path, capsys):
    """``train --examples`` on `SyntheticExampleGen`'s artifact says it cannot be trained
    on (a synthetic pipeline stops after Statistics), not that a --dataset the user did
    not give is wrong; no model directory is made."""
    from tfrs_logq.pipelines.beam.example_gen import SyntheticExampleGen
    from tfrs_logq.pipelines.beam.synthetic_source import SyntheticSpec

    run_components([SyntheticExampleGen(SyntheticSpec(**TINY), num_shards=1)],
                   str(tmp_path / "r"))
    examples_dir = tmp_path / "r" / "ExampleGen"
    capsys.readouterr()  # the run's own log lines
    code, _, err = cli_run(capsys, "train", "--model-dir", tmp_path / "m", "--examples",
                           examples_dir)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"tfrs-logq: error: --examples {examples_dir} is a synthetic "
                               "ExampleGen artifact")
    assert "stops after Statistics" in lines[0] and "--dataset)" not in lines[0]
    assert not (tmp_path / "m").exists()
