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
