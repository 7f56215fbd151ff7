"""Export: TF Serving's base-path layout, name checks, stale temporaries, run fingerprints,
and `evaluate` refusing a served model that is not the run it is given."""

import json
import logging
import os

import numpy as np
import pytest

from tfrs_logq import cli
from tfrs_logq.serving.export import (
    check_model_name,
    export,
    export_version,
    remove_stale_temporaries,
    run_fingerprint,
)


@pytest.fixture
def runs(smoke_runs):
    """conftest's two smoke runs (seeds 0 and 1), trained once per test run."""
    return smoke_runs


def test_export_version_writes_tf_servings_layout_with_the_run_fingerprint(runs, tmp_path):
    base = tmp_path / "ml1m"
    first = export_version(runs[0], str(base), index="brute-force", default_k=5)
    second = export_version(runs[0], str(base), index="brute-force", default_k=5)
    assert (first, second) == (str(base / "1"), str(base / "2"))
    meta = json.loads((base / "1" / "assets" / "export.json").read_text())
    assert meta["run"] == {"model_dir": os.path.abspath(runs[0]),
                           "fingerprint": run_fingerprint(runs[0])}
    assert run_fingerprint(runs[0]) != run_fingerprint(runs[1])
    assert (base / "1").stat().st_mode & 0o777 == 0o755  # readable by a server of another user


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "-flag", "", "a..b"])
def test_bad_model_names_are_refused(runs, tmp_path, name, capsys):
    with pytest.raises(ValueError, match="not a valid servable name"):
        export(runs[0], str(tmp_path), name, index="brute-force")
    assert not any(tmp_path.iterdir())  # nothing written anywhere
    code = cli.main(["export", "--model-dir", runs[0], "--model_base_path",
                     str(tmp_path / "b"), f"--model_name={name}", "--index", "brute-force"])
    err = capsys.readouterr().err
    refused = "argument --model-name: empty" if name == "" else "not a valid servable name"
    assert code == 2 and refused in err and "Traceback" not in err, err  # "": when parsed
    assert check_model_name("ml-1m_v2.0") == "ml-1m_v2.0"


def test_stale_temporaries_of_dead_exports_are_removed_live_ones_kept(runs, tmp_path, caplog):
    base = tmp_path / "m"
    dead = base / ".tmp-3-999999999-abc"  # no such process
    live = base / f".tmp-4-{os.getpid()}-xyz"  # an export in progress in this process
    for d in (dead, live):
        (d / "variables").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        export_version(runs[0], str(base), index="brute-force", default_k=5)
    assert not dead.exists() and live.exists()
    assert "did not finish" in caplog.text
    assert remove_stale_temporaries(str(tmp_path / "absent")) == []


def test_k_larger_than_the_catalog_is_reported(runs, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        path = export_version(runs[0], str(tmp_path / "m"), index="brute-force",
                              default_k=100_000)
    assert "larger than the catalog" in caplog.text
    meta = json.loads((tmp_path / "m" / "1" / "assets" / "export.json").read_text())
    assert meta["default_k"] == meta["num_items"] < 100_000 and path.endswith("1")


def test_cli_export_base_path_is_the_version_directory(runs, tmp_path, capsys):
    base = tmp_path / "ml1m"
    code = cli.main(["export", "--model-dir", runs[0], "--model_base_path", str(base),
                     "--model_name", "ml1m", "--index", "brute-force", "--k", "5"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() == str(base / "1") and "warning" not in err
    # The unreleased layout BASE/NAME/VERSION is not looked for any more: the next
    # version goes to BASE/2 whatever BASE/NAME holds.
    (base / "ml1m" / "1").mkdir(parents=True)
    code = cli.main(["export", "--model-dir", runs[0], "--model_base_path", str(base),
                     "--model_name", "ml1m", "--index", "brute-force", "--k", "5"])
    out, err = capsys.readouterr()
    assert code == 0 and out.strip() == str(base / "2") and "warning" not in err


def test_an_existing_version_is_refused_before_the_model_is_loaded(runs, tmp_path, monkeypatch,
                                                                    capsys):
    # `export --version N` over an existing N built the (ScaNN) index first.
    from tfrs_logq.serving import export as export_module

    base = tmp_path / "ml1m"
    (base / "3").mkdir(parents=True)
    loaded = []
    real_load = export_module.load_trained
    monkeypatch.setattr(export_module, "load_trained",
                        lambda *a, **k: loaded.append(a) or real_load(*a, **k))
    with pytest.raises(FileExistsError, match="versions are immutable"):
        export_version(runs[0], str(base), version=3, index="scann", default_k=5)
    code = cli.main(["export", "--model-dir", runs[0], "--model_base_path", str(base),
                     "--model_name", "ml1m", "--version", "3"])
    err = capsys.readouterr().err
    assert code == 2 and "versions are immutable" in err and len(err.strip().splitlines()) == 1
    assert loaded == [] and sorted(os.listdir(base)) == ["3"]  # nothing loaded, nothing written
    # A free version still exports (and loads the run once).
    assert export_version(runs[0], str(base), version=4, index="brute-force",
                          default_k=5) == str(base / "4")
    assert len(loaded) == 1


def test_evaluate_refuses_a_server_that_serves_another_run(runs, tmp_path, capsys):
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    base = tmp_path / "other"
    export_version(runs[1], str(base), index="brute-force", default_k=5)
    srv = ModelServer(ServerOptions(model_name="m", port=0, rest_api_port=0,
                                    model_base_path=str(base))).start()
    try:
        code = cli.main(["evaluate", "--server", f"127.0.0.1:{srv.port}", "--model_name", "m",
                         "--model-dir", runs[0], "--json"])
        err = capsys.readouterr().err
        assert code == 2 and "is not the run at --model-dir" in err and "Traceback" not in err
        code = cli.main(["evaluate", "--server", f"127.0.0.1:{srv.port}", "--model_name", "m",
                         "--model-dir", runs[1], "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["served"] == result["exact"]
    finally:
        srv.stop()


# --- the server's batch waits are bounded ----------------------------------------


def _servable(runs, tmp_path, **options):
    from tfrs_logq.serving.server import Servable, ServerOptions

    base = tmp_path / "m"
    path = export_version(runs[0], str(base), index="brute-force", default_k=5)
    return Servable(path, 1, ServerOptions(model_name="m", model_base_path=str(base), **options))


def _request(servable):
    history = np.array([[101, 102, 103]], np.int64)
    return servable.validate("", {"history": history})


def test_a_stuck_batch_worker_times_out_instead_of_hanging(runs, tmp_path, monkeypatch):
    """The worker never answers, so a request can only come back through its own
    timeout (request_timeout_in_ms, named in the error); one that waited for the worker
    would never come back."""
    import threading

    from tfrs_logq.serving.server import ServingError

    servable = _servable(runs, tmp_path, request_timeout_in_ms=300)
    monkeypatch.setattr(servable.batcher, "_run_batch", lambda name, batch: None)  # never answers
    outcome: list = []

    def request():
        try:
            outcome.append(servable.run(_request(servable)))
        except ServingError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    thread.join(60)  # a guard against a hang, not a measure
    assert not thread.is_alive(), "the request waited for a worker that never answers"
    assert len(outcome) == 1 and isinstance(outcome[0], ServingError), outcome
    assert outcome[0].code == "DEADLINE_EXCEEDED" and outcome[0].http_status == 504
    assert "no result within 0.3 s" in str(outcome[0]), outcome[0]
    servable.close()


def test_a_dead_batch_worker_fails_its_requests_and_is_replaced(runs, tmp_path, monkeypatch):
    from tfrs_logq.serving.server import ServingError

    servable = _servable(runs, tmp_path, request_timeout_in_ms=20_000)
    body = servable.batcher._batch_loop_body

    def crash(name, q):
        import time

        deadline = time.monotonic() + 30
        while q.empty() and time.monotonic() < deadline:  # the request queues up, then die
            time.sleep(0.005)
        raise RuntimeError("worker bug")

    monkeypatch.setattr(servable.batcher, "_batch_loop_body", crash)
    with pytest.raises(ServingError, match="batch worker stopped") as info:
        servable.run(_request(servable))
    assert info.value.code == "UNAVAILABLE"
    monkeypatch.setattr(servable.batcher, "_batch_loop_body", body)
    out = servable.run(_request(servable))  # a new worker serves the next request
    assert out["item_ids"].shape == (1, 5)
    servable.close()


# --- the ScaNN index measures itself: its queries and the command's flags --------


def test_tuning_queries_are_validation_users_of_the_run_or_random_histories_with_a_warning(
        runs, tmp_path, caplog):
    import shutil

    from tfrs_logq.pipelines.sequential import left_pad
    from tfrs_logq.sasrec.trained import load_run_split
    from tfrs_logq.serving.export import load_trained, run_queries

    encoder, config, raw_ids = load_trained(runs[0])
    queries, source = run_queries(encoder, runs[0], raw_ids, count=16)
    split = load_run_split(runs[0])
    pick = np.sort(np.random.default_rng(0).choice(len(split.validation), 16, replace=False))
    histories = [split.sequences[u][:n] for u, n in
                 zip(split.validation.users[pick], split.validation.history_lengths[pick])]
    expected = encoder.last_query(left_pad(histories, config["max_length"]).astype(np.int32))
    np.testing.assert_allclose(queries, expected.numpy(), rtol=1e-5, atol=1e-6)
    assert queries.dtype == np.float32
    # The line counts the targets drawn, the users they belong to, and names the split.
    users = len(np.unique(split.validation.users[pick]))
    assert source.split()[:2] == ["16", "validation"], source
    assert f" {users:,} user" in source, source
    # The run's data gone: random histories, said in one warning line and in the source.
    moved = tmp_path / "moved"
    shutil.copytree(runs[0], moved)
    config_path = moved / "config.json"
    saved = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**saved, "data_dir": str(tmp_path / "gone"),
                                       "examples": None}))
    with caplog.at_level(logging.WARNING):
        queries, source = run_queries(encoder, str(moved), raw_ids, count=16)
    assert queries.shape == (16, config["embedding_dim"])
    assert source.startswith("16 random histories (the run's data could not be loaded")
    lines = [r.getMessage() for r in caplog.records if "ScaNN tuning" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "random histories" in lines[0]


def test_cli_export_passes_the_target_recall_and_max_k_on(tmp_path, monkeypatch, capsys):
    import tfrs_logq.cli.export as cli_export
    from tfrs_logq.serving import export as serving_export

    seen = {}
    monkeypatch.setattr(cli_export, "read_model_config", lambda model_dir: {})
    monkeypatch.setattr(serving_export, "export_version",
                        lambda *a, **kw: seen.update(kw) or str(tmp_path / "b" / "1"))
    base = ["export", "--model-dir", str(tmp_path / "m"), "--model_base_path",
            str(tmp_path / "b"), "--model_name", "x"]
    assert cli.main(base) == 0
    assert (seen["target_recall"], seen["max_k"], seen["search_fraction"]) == (0.95, 1000, None)
    assert cli.main(base + ["--target-recall", "0.9", "--max-k", "500"]) == 0
    assert (seen["target_recall"], seen["max_k"]) == (0.9, 500)
    capsys.readouterr()
    for flag, value in (("--target-recall", "0"), ("--target-recall", "1.5"), ("--max-k", "0")):
        try:
            code = cli.main(base + [flag, value])
        except SystemExit as exc:  # argparse's refusal
            code = exc.code
        err = capsys.readouterr().err
        assert code == 2 and flag in err and len(err.strip().splitlines()) == 1, err


def _scann_loads() -> bool:
    try:
        from scann import scann_ops  # noqa: F401
    except Exception:
        return False
    return True


def test_scann_export_records_what_it_measured_on_validation_users(runs, tmp_path):
    if not _scann_loads():
        pytest.skip("ScaNN does not load here (tests/test_tf_versions.py checks the error)")
    path = export_version(runs[0], str(tmp_path / "m"), index="scann", default_k=5, max_k=20,
                          target_recall=0.9)
    meta = json.loads((tmp_path / "m" / "1" / "assets" / "export.json").read_text())
    tuning = meta["scann_tuning"]
    assert tuning["queries"].split()[:2] == [str(sum(tuning["num_queries"].values())),
                                             "validation"], tuning["queries"]
    assert set(tuning["recall"]) == {"5", "20"} and tuning["reached"]
    assert all(0.9 <= r <= 1.0 for r in tuning["recall"].values())
    assert meta["scann"]["tuned"] == tuning["tuned"] and path.endswith("1")
