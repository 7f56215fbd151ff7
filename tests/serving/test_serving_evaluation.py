"""serving/evaluation.py: `evaluate_through_server` and the `evaluate --server`
command, served figures beside the exact ones."""

import json
import os
import subprocess
import sys

import pytest

from tfrs_logq.serving.server import ModelServer, ServerOptions


@pytest.mark.slow  # a server and the CLI process (10 s on 2 cores): make test-slow
def test_evaluate_cli_reports_served_and_exact_figures(trained, exports):
    options = ServerOptions(model_name="bf_cli", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"))
    srv = ModelServer(options).start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tfrs_logq.cli", "evaluate", "--server",
             f"127.0.0.1:{srv.port}", "--model_name", "bf_cli", "--model-dir",
             trained["model_dir"], "--json"],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "TFRS_LOGQ_CACHE_DIR": str(trained["root"] / "cache")})
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["num_targets"] == 60
    # A brute-force index loses nothing: served figures equal the exact ones.
    assert result["served"] == result["exact"]
    assert set(result["served"]) == {"recall@10", "recall@100", "recall@1000", "ndcg@20"}
    assert result["index"]["kind"] == "brute-force" and result["index"]["recall"] == {}


def test_evaluate_through_server_is_a_library_function(trained, exports):
    from tfrs_logq.serving.evaluation import evaluate_through_server

    options = ServerOptions(model_name="lib", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"))
    srv = ModelServer(options).start()
    try:
        result = evaluate_through_server(f"127.0.0.1:{srv.port}", "lib",
                                         trained["model_dir"], max_targets=30,
                                         recall_ks=(5, 10), ndcg_ks=(10,))
    finally:
        srv.stop()
    assert result["num_targets"] == 30
    assert set(result["served"]) == {"recall@5", "recall@10", "ndcg@10"}
    assert result["served"] == result["exact"]  # brute force loses nothing
    assert (result["index"]["kind"], result["index"]["recall"]) == ("brute-force", {})
    assert "exact" in result["index"]["description"]


def test_the_served_index_is_the_one_its_export_recorded(server, exports, monkeypatch):
    """`served_index` through the server on the ScaNN export: the kind, its settings and
    the recall@k against exact search are those of the version's assets/export.json, with
    the line export printed; a server whose metadata has no index (stock TF Serving's) is
    said not to state it."""
    from tfrs_logq.serving import grpc_service
    from tfrs_logq.serving.client import predict_stub
    from tfrs_logq.serving.evaluation import served_index
    from tfrs_logq.serving.export import describe_index

    with open(os.path.join(exports["paths"]["scann"], "assets", "export.json")) as f:
        meta = json.load(f)
    _, channel = predict_stub(f"127.0.0.1:{server.port}")
    with channel:
        index = served_index(channel, "ml", timeout=30)
        monkeypatch.setattr(grpc_service, "METADATA_FIELDS", ("signature_def",))
        stock = served_index(channel, "ml", timeout=30)
    assert (index["kind"], index["version"]) == ("scann", 1)
    recorded = meta["scann_tuning"]["recall"]
    assert recorded and index["recall"] == {k: float(r) for k, r in recorded.items()}
    assert index["parameters"] == meta["scann"]
    assert index["held_out_queries"] == meta["scann_tuning"]["num_queries"]["held_out"]
    assert index["description"] == describe_index(meta) and "recall@10" in index["description"]
    assert stock["kind"] is None and stock["recall"] == {}
    assert "not stated" in stock["description"]


@pytest.mark.slow  # a faiss export, a server and an evaluation (13 s on 2 cores)
def test_evaluate_states_the_served_index_and_the_recall_its_export_recorded(
        trained, tmp_path, monkeypatch):
    """Through a faiss export: the index kind, its settings and the recall@k against exact
    search are the export's own (assets/export.json), with the line export printed; a
    server whose metadata has no index (stock TF Serving's) is said not to state it."""
    pytest.importorskip("faiss")
    from tfrs_logq.serving import grpc_service
    from tfrs_logq.serving.client import predict_stub
    from tfrs_logq.serving.evaluation import evaluate_through_server, served_index
    from tfrs_logq.serving.export import describe_index, export_version

    path = export_version(trained["model_dir"], str(tmp_path / "ann"), index="faiss",
                          default_k=10)
    with open(os.path.join(path, "assets", "export.json")) as f:
        meta = json.load(f)
    srv = ModelServer(ServerOptions(model_name="ann", port=0, rest_api_port=0,
                                    model_base_path=str(tmp_path / "ann"))).start()
    try:
        result = evaluate_through_server(f"127.0.0.1:{srv.port}", "ann", trained["model_dir"],
                                         max_targets=10, recall_ks=(5, 10), ndcg_ks=(10,))
        monkeypatch.setattr(grpc_service, "METADATA_FIELDS", ("signature_def",))
        _, channel = predict_stub(f"127.0.0.1:{srv.port}")
        with channel:
            stock = served_index(channel, "ann", timeout=30)
    finally:
        srv.stop()
    index = result["index"]
    assert (index["kind"], index["version"]) == ("faiss", 1)
    recorded = meta["faiss_tuning"]["recall"]
    assert recorded and index["recall"] == {k: float(r) for k, r in recorded.items()}
    assert index["parameters"] == meta["faiss"]
    assert index["held_out_queries"] == meta["faiss_tuning"]["num_queries"]["held_out"]
    assert index["description"] == describe_index(meta)
    assert stock["kind"] is None and stock["recall"] == {}
    assert "not stated" in stock["description"]


def test_the_evaluate_command_only_parses_flags_and_calls_the_library(trained, monkeypatch,
                                                                     capsys):
    from tfrs_logq import cli
    from tfrs_logq.serving import evaluation

    calls = []
    monkeypatch.setattr(evaluation, "evaluate_through_server",
                        lambda *a, **kw: calls.append((a, kw)) or {"served": {}})
    code = cli.main(["evaluate", "--server", "h:1", "--model_name", "m", "--model-dir",
                     trained["model_dir"], "--max-targets", "7", "--timeout", "3", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out) == {"served": {}}
    (args, kwargs), = calls
    assert args == ("h:1", "m", trained["model_dir"])
    assert kwargs["max_targets"] == 7 and kwargs["timeout"] == 3.0
