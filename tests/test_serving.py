"""Export, model server and client end to end, on a model the tests train.

The server runs for real on ephemeral loopback ports; clients are the official
`PredictionServiceStub` / `ModelServiceStub` and plain HTTP.
"""

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
)
from tfrs_logq.serving.client import make_request, predict_stub, ranks_through_server
from tfrs_logq.serving.export import export, load_trained, scann_parameters
from tfrs_logq.serving.server import ModelServer, ServerOptions

from tfrs_logq.metrics import target_ranks
from tfrs_logq.training import resolve_config, train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    os.environ["TFRS_LOGQ_CACHE_DIR"] = str(root / "cache")
    rng = np.random.default_rng(0)
    lines = []
    for u in range(1, 61):
        for k in range(int(rng.integers(8, 16))):
            item = 100 + int(rng.zipf(1.4) % 40)  # raw ids 100..139
            lines.append(f"{u}::{item}::4::{1_000_000 + 1000 * k + u}\n")
    data = root / "data"
    data.mkdir()
    (data / "ratings.dat").write_text("".join(lines))
    config = resolve_config("smoke", loss="mns-corrected", split="loo", data_dir=str(data),
                            max_epochs=2)
    model_dir = str(root / "model")
    train(config, model_dir, verbose=0)
    return {"root": root, "model_dir": model_dir, "data": str(data)}


@pytest.fixture(scope="module")
def exports(trained):
    base = trained["root"] / "exports"
    paths = {index: export(trained["model_dir"], str(base), index.replace("-", "_"),
                           index=index, default_k=10)
             for index in ("brute-force", "scann")}
    return {"base": base, "paths": paths}


def _histories():
    return np.array([[101, 102, 103, 0], [0, 0, 0, 110], [104, 999_999, 105, 106]], np.int64)


def test_export_layout_assets_and_atomic_versions(trained, exports):
    for index, path in exports["paths"].items():
        assert os.path.basename(path) == "1"
        meta = json.load(open(os.path.join(path, "assets", "export.json")))
        assert meta["index"] == index and meta["history_dtype"] == "int64"
        assert meta["max_length"] == 30 and meta["padding"] == 0
        siblings = os.listdir(os.path.dirname(path))
        assert siblings == ["1"]  # no temporary directory left behind
    second = export(trained["model_dir"], str(exports["base"]), "brute_force",
                    index="brute-force", default_k=10)
    assert os.path.basename(second) == "2"
    with pytest.raises(FileExistsError):
        export(trained["model_dir"], str(exports["base"]), "brute_force", version=2,
               index="brute-force")
    assert scann_parameters(1_000_000, 100)["tree"] and not scann_parameters(5000, 100)["tree"]


def test_scann_equals_brute_force_and_both_equal_exact_ranking(trained, exports):
    encoder, config, raw_ids = load_trained(trained["model_dir"])
    loaded = {i: tf.saved_model.load(p) for i, p in exports["paths"].items()}
    h = tf.constant(_histories())
    outs = {i: m.signatures["top_k"](history=h, k=tf.constant(8),
                                     exclude_history=tf.constant(False))
            for i, m in loaded.items()}
    np.testing.assert_array_equal(outs["scann"]["item_ids"], outs["brute-force"]["item_ids"])
    np.testing.assert_allclose(outs["scann"]["scores"], outs["brute-force"]["scores"], rtol=1e-4)
    # Reference: map raw -> internal ids, right-align, encode, exact dot products.
    lookup = {int(r): i + 1 for i, r in enumerate(raw_ids)}
    aligned = np.zeros((3, config["max_length"]), np.int32)
    for row, hist in enumerate(_histories()):
        ids = [lookup[x] for x in hist if x in lookup]
        aligned[row, config["max_length"] - len(ids):] = ids
    q = encoder.last_query(aligned).numpy()
    scores = q @ encoder.item_embeddings().numpy()[1:].T
    top = np.argsort(-scores, axis=1)[:, :8]
    np.testing.assert_array_equal(outs["brute-force"]["item_ids"].numpy(), raw_ids[top])
    emb = loaded["scann"].signatures["query_embedding"](history=h)["query_embedding"]
    np.testing.assert_allclose(emb.numpy(), q, rtol=1e-4, atol=1e-5)


FRESH = r"""
import sys, json
import numpy as np
import tensorflow as tf
import scann  # registers the ScaNN ops
m = tf.saved_model.load(sys.argv[1])
out = m.signatures["serving_default"](history=tf.constant([[101, 102, 0]], tf.int64))
assert not any(name.startswith("tfrs_logq") for name in sys.modules), "project code imported"
print(json.dumps(out["item_ids"].numpy().tolist()))
"""


@pytest.mark.parametrize("index", ["brute-force", "scann"])
def test_export_loads_in_fresh_process_with_only_tensorflow_and_scann(exports, index):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    proc = subprocess.run([sys.executable, "-c", FRESH, exports["paths"][index]],
                          capture_output=True, text=True, timeout=300, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout.strip().splitlines()[-1])[0]) == 10


@pytest.fixture(scope="module")
def server(exports):
    options = ServerOptions(model_name="ml", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "scann"),
                            file_system_poll_wait_seconds=0.2, max_request_bytes=200_000)
    srv = ModelServer(options).start()
    yield srv
    srv.stop()


def _http(server, method, path, body=None):
    url = f"http://127.0.0.1:{server.rest_port}{path}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_grpc_and_rest_predict_equal_the_in_process_savedmodel(server, exports):
    local = tf.saved_model.load(exports["paths"]["scann"])
    expected = local.signatures["serving_default"](history=tf.constant(_histories()))
    stub, channel = predict_stub(f"127.0.0.1:{server.port}")
    response = stub.Predict(make_request("ml", _histories()), timeout=30)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["item_ids"]),
                                  expected["item_ids"].numpy())
    assert response.model_spec.version.value == 1
    k_response = stub.Predict(make_request("ml", _histories(), k=4), timeout=30)
    np.testing.assert_array_equal(tf.make_ndarray(k_response.outputs["item_ids"]),
                                  expected["item_ids"].numpy()[:, :4])
    status, body = _http(server, "POST", "/v1/models/ml:predict",
                         {"instances": _histories().tolist()})
    assert status == 200
    assert [p["item_ids"] for p in body["predictions"]] == expected["item_ids"].numpy().tolist()
    status, body = _http(server, "POST", "/v1/models/ml/versions/1:predict",
                         {"signature_name": "top_k",
                          "inputs": {"history": _histories().tolist(), "k": 3}})
    assert status == 200
    assert body["outputs"]["item_ids"] == expected["item_ids"].numpy()[:, :3].tolist()
    status, body = _http(server, "POST", "/v1/models/ml:predict",
                         {"signature_name": "top_k",
                          "instances": [{"history": r, "k": 2} for r in _histories().tolist()]})
    assert status == 200 and len(body["predictions"][0]["item_ids"]) == 2
    channel.close()


def test_status_and_metadata(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "ml"}), timeout=30)
    assert status.model_version_status[0].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    stub, _ = predict_stub(f"127.0.0.1:{server.port}")
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "ml"
    meta = stub.GetModelMetadata(request, timeout=30)
    sigs = get_model_metadata_pb2.SignatureDefMap()
    meta.metadata["signature_def"].Unpack(sigs)
    assert {"serving_default", "top_k", "query_embedding"} <= set(sigs.signature_def)
    code, body = _http(server, "GET", "/v1/models/ml")
    assert code == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    code, body = _http(server, "GET", "/v1/models/ml/metadata")
    assert code == 200 and "serving_default" in body["metadata"]["signature_def"]["signature_def"]
    channel.close()


@pytest.mark.parametrize("case", [
    "float_history", "rank_one", "unknown_model", "unknown_version", "too_long",
    "missing_input", "bad_k", "k_beyond_int32", "unknown_signature"])
def test_grpc_bad_input_gets_a_clear_status_and_server_keeps_serving(server, case):
    from tensorflow_serving.apis import predict_pb2

    stub, channel = predict_stub(f"127.0.0.1:{server.port}")
    request = make_request("ml", _histories())
    expected = grpc.StatusCode.INVALID_ARGUMENT
    if case == "float_history":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([[1.5, 2.0]])))
    elif case == "rank_one":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([101, 102])))
    elif case == "unknown_model":
        request.model_spec.name, expected = "other", grpc.StatusCode.NOT_FOUND
    elif case == "unknown_version":
        request.model_spec.version.value, expected = 99, grpc.StatusCode.NOT_FOUND
    elif case == "too_long":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.ones((1, 31), np.int64)))
    elif case == "missing_input":
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "ml"
    elif case == "bad_k":
        request = make_request("ml", _histories(), k=10_000)
    elif case == "k_beyond_int32":  # used to wrap to int32: k=5
        request = make_request("ml", _histories(), k=3)
        request.inputs["k"].CopyFrom(tf.make_tensor_proto(np.int64(2**32 + 5)))
    elif case == "unknown_signature":
        request.model_spec.signature_name = "nope"
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    assert info.value.code() == expected
    assert info.value.details()  # says what was wrong
    if case == "k_beyond_int32":
        assert "k must be in [1, " in info.value.details() and str(2**32 + 5) in \
            info.value.details()
    ok = stub.Predict(make_request("ml", _histories()), timeout=30)
    assert ok.outputs["item_ids"].tensor_shape.dim[0].size == 3
    channel.close()


@pytest.mark.parametrize("body,status,fragment", [
    (b'{"instances": [[1, 2', 400, "JSON"),
    ({"instances": [[1.5, 2]]}, 400, "int64"),
    ({"instances": [[1, 2], [3]]}, 400, "rectangular"),
    ({"instances": [[True, 101]]}, 400, "one type"),  # was taken as [[1, 101]]
    ({"instances": [[101, None]]}, 400, "null"),
    ({"instances": [[1]], "inputs": [[1]]}, 400, "exactly one"),
    ({"instances": [list(range(31))]}, 400, "at most 30"),
    ({"instances": [[1] * 30] * 3000}, 413, "exceeds the limit"),
])
def test_rest_bad_input(server, body, status, fragment):
    code, reply = _http(server, "POST", "/v1/models/ml:predict", body)
    assert code == status and fragment in reply["error"]
    assert _http(server, "POST", "/v1/models/nope:predict", {"instances": [[1]]})[0] == 404
    assert _http(server, "GET", "/v1/models/ml/versions/7")[0] == 404
    assert _http(server, "POST", "/v1/models/ml:predict", {"instances": [[101]]})[0] == 200


def test_version_swap_under_load_drops_nothing(trained, exports):
    base = exports["base"] / "swap"
    export(trained["model_dir"], str(exports["base"]), "swap", index="brute-force", version=1)
    options = ServerOptions(model_name="swap", port=0, rest_api_port=0,
                            model_base_path=str(base), file_system_poll_wait_seconds=0.1)
    srv = ModelServer(options).start()
    stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
    versions, errors = [], []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            try:
                r = stub.Predict(make_request("swap", _histories()), timeout=30)
                versions.append(r.model_spec.version.value)
            except grpc.RpcError as exc:  # pragma: no cover - the assertion reports it
                errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    export(trained["model_dir"], str(exports["base"]), "swap", index="brute-force", version=2)
    deadline = time.time() + 30
    while time.time() < deadline and (not versions or versions[-1] != 2):
        time.sleep(0.1)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    srv.stop()
    channel.close()
    assert not errors, errors[:1]
    assert 1 in versions and versions[-1] == 2
    assert len(versions) > 20


def test_ranks_through_server_equal_exact_for_brute_force(trained, exports):
    options = ServerOptions(model_name="bf", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"))
    srv = ModelServer(options).start()
    encoder, config, raw_ids = load_trained(trained["model_dir"])
    rng = np.random.default_rng(1)
    internal = [rng.choice(np.arange(1, len(raw_ids) + 1), size=int(n), replace=False)
                for n in rng.integers(1, 8, size=40)]
    targets = rng.integers(1, len(raw_ids) + 1, size=40)
    histories_raw = [raw_ids[h - 1] for h in internal]
    stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
    served = ranks_through_server(stub, "bf", histories_raw, raw_ids[targets - 1], max_k=20,
                                  batch_size=7, num_items=len(raw_ids))
    channel.close()
    srv.stop()
    padded = np.zeros((40, config["max_length"]), np.int32)
    exclude = np.zeros((40, 8), np.int64)
    for row, h in enumerate(internal):
        padded[row, -len(h):] = h
        exclude[row, :len(h)] = h
    exact = target_ranks(encoder.last_query(padded), encoder.item_embeddings(), targets,
                         exclude=exclude)
    np.testing.assert_array_equal(served, np.minimum(exact, 20))


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


# ------------------------------------------------------------------ REST hardening


def _predict_body(k=None):
    inputs = {"history": [[101, 102, 103]]}
    if k is not None:
        return json.dumps({"signature_name": "top_k", "inputs": {**inputs, "k": k}}).encode()
    return json.dumps({"instances": inputs["history"]}).encode()


def test_rest_200_concurrent_clients_all_succeed(server):
    """socketserver's listen backlog of 5 reset connections under this load."""
    import http.client

    clients, per_client = 200, 3
    barrier = threading.Barrier(clients, timeout=30)
    errors, done = [], []
    lock = threading.Lock()

    def client(index):
        keep_alive = index % 2 == 0  # half reuse one connection, half connect per request
        connection = None
        try:
            barrier.wait()
            for _ in range(per_client):
                if connection is None or not keep_alive:
                    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port,
                                                            timeout=15)
                connection.request("POST", "/v1/models/ml:predict", _predict_body(),
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                reply = json.loads(response.read())
                assert response.status == 200, reply
                assert len(reply["predictions"][0]["item_ids"]) == 10
                if not keep_alive:
                    connection.close()
            with lock:
                done.append(index)
        except Exception as exc:  # the assertion below reports it
            with lock:
                errors.append(f"client {index}: {exc!r}")
        finally:
            if connection is not None:
                connection.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, 40 - (time.monotonic() - start)))
    assert not errors, f"{len(errors)} of {clients} clients failed, e.g. {errors[:3]}"
    assert len(done) == clients


def test_a_second_server_on_a_port_in_use_is_refused(server, exports):
    """grpc binds with SO_REUSEPORT by default: a second server would share the port."""
    base = str(exports["base"] / "scann")
    for grpc_port, rest_port, words in [(server.port, 0, ("gRPC", f"{server.port}")),
                                        (0, server.rest_port, ("REST", f"{server.rest_port}"))]:
        options = ServerOptions(model_name="ml", port=grpc_port, rest_api_port=rest_port,
                                model_base_path=base)
        with pytest.raises(OSError, match="already in use") as info:
            ModelServer(options).start().stop()
        for word in words:
            assert word in str(info.value)
    stub, channel = predict_stub(f"127.0.0.1:{server.port}")
    for _ in range(8):  # every new connection still reaches the one server
        fresh, fresh_channel = predict_stub(f"127.0.0.1:{server.port}")
        assert fresh.Predict(make_request("ml", _histories()), timeout=30).outputs["item_ids"]
        fresh_channel.close()
    channel.close()
    assert _http(server, "POST", "/v1/models/ml:predict", {"instances": [[101]]})[0] == 200


def _raw(server, data: bytes, method="POST", timeout=15, half_close=False):
    """Sends ``data`` as is and parses the reply: (status, headers, JSON body)."""
    import http.client
    import socket

    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=timeout) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock, method=method)
        response.begin()
        body = response.read()
    assert response.getheader("Content-Type") == "application/json", body[:200]
    return response.status, response.headers, json.loads(body)


def _post_raw(body: bytes, length="auto", extra=b""):
    head = b"POST /v1/models/ml:predict HTTP/1.1\r\nHost: x\r\n" + extra
    if length == "auto":
        head += b"Content-Length: %d\r\n" % len(body)
    elif length is not None:
        head += b"Content-Length: " + length.encode() + b"\r\n"
    return head + b"\r\n" + body


@pytest.mark.parametrize("case,request_bytes,status,fragments", [
    ("deep_json", _post_raw(b'{"instances": ' + b"[" * 100_000), 400, ["nest"]),
    ("negative_length", _post_raw(b"", "-5"), 400, ["Content-Length", "-5"]),
    ("text_length", _post_raw(b"", "abc"), 400, ["Content-Length", "abc"]),
    ("no_length", _post_raw(b"", None), 400, ["Content-Length"]),
    ("two_lengths", _post_raw(b"{}", "2", b"Content-Length: 9\r\n"), 400, ["Content-Length"]),
    ("too_large", _post_raw(b"", "10000000"), 413, ["10000000", "200000"]),
    ("k_beyond_int32", _post_raw(_predict_body(k=2**32 + 5)), 400,
     ["k must be in [1, {num_items}]", str(2**32 + 5)]),
    ("k_beyond_int64", _post_raw(_predict_body(k=2**70)), 400,
     ["k must be in [1, {num_items}]", str(2**70)]),
    ("k_zero", _post_raw(_predict_body(k=0)), 400, ["k must be in [1, {num_items}]"]),
    ("k_bool", _post_raw(_predict_body(k=True)), 400, ["'k'", "integers"]),
    ("history_beyond_int64", _post_raw(b'{"instances": [[1, %d]]}' % 2**64), 400,
     ["history", "int64"]),
    ("invalid_utf8", _post_raw(b'{"instances": [[101]], "signature_name": "\xff\xfe"}'),
     400, ["UTF-8"]),
    ("utf8_surrogate", _post_raw(b'{"instances": [[101]], "signature_name": "\xed\xa0\x80"}'),
     400, ["UTF-8"]),
    ("integer_of_5000_digits", _post_raw(b'{"instances": [[1%s]]}' % (b"1" * 5000)), 400,
     ["JSON"]),
    ("chunked_not_json", _post_raw(b"5\r\nhello\r\n0\r\n\r\n", None,
                                   b"Transfer-Encoding: chunked\r\n"), 400, ["JSON"]),
    ("chunked_too_large", _post_raw(b"40000\r\n" + b"[" * 0x40000 + b"\r\n0\r\n\r\n", None,
                                    b"Transfer-Encoding: chunked\r\n"), 413,
     ["exceeds the limit", "200000"]),
    ("bad_transfer_encoding", _post_raw(b"{}", None, b"Transfer-Encoding: gzip\r\n"), 400,
     ["Transfer-Encoding"]),
    ("short_body", _post_raw(b"{}", "10", b"Connection: close\r\n"), 400, ["ended after 2"]),
    ("bad_request_line", b"GARBAGE\r\n\r\n", 400, []),
    ("unknown_method", b"BREW /v1/models/ml HTTP/1.1\r\nHost: x\r\n\r\n", 501, ["BREW"]),
])
def test_rest_malformed_requests_get_a_json_error(server, case, request_bytes, status,
                                                  fragments):
    code, headers, reply = _raw(server, request_bytes, half_close=case == "short_body")
    assert code == status, reply
    assert isinstance(reply.get("error"), str) and reply["error"], reply
    num_items = server.manager.get("ml").meta["num_items"]
    for fragment in fragments:
        assert fragment.format(num_items=num_items) in reply["error"], (fragment, reply)
    if case in ("negative_length", "text_length", "two_lengths", "bad_transfer_encoding",
                "short_body", "bad_request_line"):
        # The framing is unknown: the bytes that follow are not a request. (A refusal of a
        # well-framed request keeps the connection: the server skips its body; see
        # test_rest_keep_alive_serves_several_requests_on_one_connection.)
        assert headers["Connection"] == "close"
    assert _http(server, "POST", "/v1/models/ml:predict", {"instances": [[101]]})[0] == 200


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_rest_other_methods_get_a_json_405(server, method):
    code, headers, reply = _raw(
        server, f"{method} /v1/models/ml HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}"
        .encode(), method=method)
    assert code == 405 and method in reply["error"], reply
    assert set(headers["Allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "POST"}


def test_rest_keep_alive_serves_several_requests_on_one_connection(server):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=15)
    for _ in range(3):
        connection.request("POST", "/v1/models/ml:predict", _predict_body())
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["predictions"]
        connection.request("GET", "/v1/models/ml")
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["model_version_status"]
    # A body refused from its Content-Length is skipped by its framing, unread: the
    # connection serves the next request.
    connection.request("POST", "/v1/models/ml:predict", b"x" * 300_000)
    response = connection.getresponse()
    assert response.status == 413 and response.getheader("Connection") is None
    assert "exceeds the limit" in json.loads(response.read())["error"]
    connection.request("POST", "/v1/models/ml:predict", _predict_body())
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.read())["predictions"]
    # A chunked body (which the hand-written server refused) is read like any other.
    connection.request("POST", "/v1/models/ml:predict", iter([_predict_body()]),
                       encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.read())["predictions"]
    connection.close()


def test_string_inputs_are_sent_to_the_model_as_utf8():
    """numpy's astype(bytes) is ASCII: non-ASCII raw ids were refused."""
    from tfrs_logq.serving.server import _utf8_strings

    encoded = _utf8_strings(np.array([["café", "b"]]))
    assert encoded.tolist() == [["café".encode(), b"b"]]
    assert _utf8_strings(np.array([b"x\xff"], dtype=object)).tolist() == [b"x\xff"]  # gRPC
    with pytest.raises(ValueError, match="surrogates"):
        _utf8_strings(np.array(["\ud800"]))  # JSON's "\ud800" escape: no UTF-8 for it
    with pytest.raises(TypeError, match="expected strings"):
        _utf8_strings(np.array([1, 2]))


@pytest.mark.parametrize("index", ["brute-force", "scann"])
def test_served_top_k_leaves_out_the_history_by_default(trained, exports, index):
    """serving_default and top_k (exclude_history, default True through the server) never
    return an item of the request's history; with False they equal the exact ranking."""
    from tfrs_logq.serving.server import Servable, ServerOptions

    encoder, config, raw_ids = load_trained(trained["model_dir"])
    path = exports["paths"][index]
    model = tf.saved_model.load(path)
    h = _histories()
    out = model.signatures["serving_default"](history=tf.constant(h))["item_ids"].numpy()
    for row, hist in zip(out, h):
        assert not set(row.tolist()) & set(hist.tolist())
    lookup = {int(r): i + 1 for i, r in enumerate(raw_ids)}
    aligned = np.zeros((3, config["max_length"]), np.int32)
    for row, hist in enumerate(h):
        ids = [lookup[x] for x in hist if x in lookup]
        aligned[row, config["max_length"] - len(ids):] = ids
    scores = encoder.last_query(aligned).numpy() @ encoder.item_embeddings().numpy()[1:].T
    for row, hist in enumerate(h):
        seen = [lookup[x] - 1 for x in hist if x in lookup]
        scores[row, seen] = -np.inf
    np.testing.assert_array_equal(out[:, :5], raw_ids[np.argsort(-scores, axis=1)[:, :5]])
    # Through the server the input may be left out (default True) or set to False.
    servable = Servable(path, 1, ServerOptions(model_name="m", model_base_path=str(path)))
    try:
        default = servable.run(servable.validate("top_k", {"history": h, "k": 6}))
        kept = servable.run(servable.validate("top_k", {"history": h, "k": 6,
                                                        "exclude_history": False}))
    finally:
        servable.close()
    assert all(not set(r.tolist()) & set(x.tolist()) for r, x in zip(default["item_ids"], h))
    assert any(set(r.tolist()) & set(x.tolist()) for r, x in zip(kept["item_ids"], h))


# ------------------------------------------------------------------ graceful shutdown


def _predict_in_threads(rest_port, grpc_port, model, n_each, results):
    """Starts ``n_each`` REST and ``n_each`` gRPC predictions; each appends its outcome."""
    import http.client

    def rest():
        try:
            connection = http.client.HTTPConnection("127.0.0.1", rest_port, timeout=60)
            connection.request("POST", f"/v1/models/{model}:predict", _predict_body())
            response = connection.getresponse()
            body = json.loads(response.read())
            predictions = body.get("predictions") or [{"item_ids": []}]
            results.append(("rest", response.status, len(predictions[0]["item_ids"])))
        except Exception as exc:  # the assertion reports it
            results.append(("rest", repr(exc), 0))

    def grpc_call():
        try:
            stub, channel = predict_stub(f"127.0.0.1:{grpc_port}")
            response = stub.Predict(make_request(model, _histories()), timeout=60)
            results.append(("grpc", "OK", response.outputs["item_ids"].tensor_shape.dim[0].size))
            channel.close()
        except Exception as exc:
            results.append(("grpc", repr(exc), 0))

    threads = [threading.Thread(target=fn) for fn in [rest] * n_each + [grpc_call] * n_each]
    for t in threads:
        t.start()
    return threads


def test_sigterm_drains_requests_in_flight_on_both_protocols_and_exits_0(trained, exports):
    """The requests wait in a 4 s batch window when SIGTERM arrives: all are answered,
    the log says how many were drained, the exit code is 0 (it was -15: killed)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "tfrs_logq.cli", "serve", "--model_name", "drain",
         "--model_base_path", str(exports["base"] / "brute_force"), "--port", "0",
         "--rest_api_port", "0", "--batch_timeout_micros", "4000000",
         "--max_batch_size", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "serving drain from ...: gRPC H:P, REST H:P"
        assert "serving drain" in line, (line, proc.stderr.read() if proc.poll() else "")
        grpc_port = int(line.split("gRPC ")[1].split(",")[0].rsplit(":", 1)[1])
        rest_port = int(line.split("REST ")[1].strip().rsplit(":", 1)[1])
        # A first request opens the batch window; the others join it.
        results: list = []
        threads = _predict_in_threads(rest_port, grpc_port, "drain", 6, results)
        time.sleep(1.5)  # every request has reached the server, none is answered yet
        assert not results, results
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(results) == [("grpc", "OK", 3)] * 6 + [("rest", 200, 10)] * 6, results
    assert proc.returncode == 0, err[-3000:]
    drained = [ln for ln in err.splitlines() if "drained" in ln]
    assert len(drained) == 1 and "received SIGTERM" in drained[0], err[-3000:]
    assert "drained 12 request(s) in flight (REST 6, gRPC 6)" in drained[0], drained


def test_sigint_drains_in_process_and_the_ports_then_refuse(exports):
    import signal
    import socket

    options = ServerOptions(model_name="int", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"),
                            batch_timeout_micros=2_000_000, max_batch_size=1000)
    srv = ModelServer(options).start()
    handler_before = signal.getsignal(signal.SIGINT)
    results: list = []
    threads = _predict_in_threads(srv.rest_port, srv.port, "int", 2, results)
    threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGINT)).start()
    summary = srv.serve_until_signal()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [("grpc", "OK", 3)] * 2 + [("rest", 200, 10)] * 2, results
    assert summary["drained"] == {"rest": 2, "grpc": 2} and summary["cut"] == 0, summary
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.rest_port), timeout=5).close()
    assert signal.getsignal(signal.SIGINT) is handler_before  # restored


# ------------------------------------------------------------------ slow clients


@pytest.fixture(scope="module")
def short_timeout_server(exports):
    options = ServerOptions(model_name="slow", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"),
                            rest_api_timeout_in_ms=1500)
    srv = ModelServer(options).start()
    yield srv
    srv.stop()


def test_64_slow_clients_do_not_delay_a_normal_request(short_timeout_server):
    """33 clients that sent part of a request made a normal one wait 29 s (each held one
    of the 32 workers); now they hold a socket each, and only rest_api_timeout_in_ms."""
    import http.client
    import socket

    srv = short_timeout_server
    slow = []
    for i in range(64):
        sock = socket.create_connection(("127.0.0.1", srv.rest_port), timeout=10)
        if i % 2:  # part of the headers
            sock.sendall(b"POST /v1/models/slow:predict HTTP/1.1\r\nHost: x\r\nContent-Le")
        else:  # the headers and part of the body
            sock.sendall(b"POST /v1/models/slow:predict HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"instances\": [[1")
        slow.append(sock)
    time.sleep(0.2)
    try:
        start = time.monotonic()
        connection = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=10)
        connection.request("POST", "/v1/models/slow:predict", _predict_body())
        response = connection.getresponse()
        elapsed = time.monotonic() - start
        assert response.status == 200 and json.loads(response.read())["predictions"]
        assert elapsed < 1.0, f"a normal request took {elapsed:.2f} s beside 64 slow clients"
        # Then each slow client is answered 408 (JSON) and closed, after about 1.5 s.
        for sock in slow[:2]:
            sock.settimeout(10)
            response = http.client.HTTPResponse(sock, method="POST")
            response.begin()
            assert response.status == 408, response.status
            assert "rest_api_timeout_in_ms" in json.loads(response.read())["error"]
        assert time.monotonic() - start < 6
    finally:
        for sock in slow:
            sock.close()


# ------------------------------------------------------------------ strict inputs


@pytest.mark.parametrize("value", ["false", "true", None, 0, 1, [False]])
def test_rest_exclude_history_takes_only_a_json_boolean(server, value):
    """``"false"`` (a string) was taken as true, null as false."""
    body = {"signature_name": "top_k",
            "inputs": {"history": _histories().tolist(), "k": 5, "exclude_history": value}}
    code, reply = _http(server, "POST", "/v1/models/ml:predict", body)
    assert code == 400 and "'exclude_history'" in reply["error"], reply


@pytest.mark.parametrize("value", [True, False])
def test_rest_exclude_history_booleans_equal_the_in_process_savedmodel(server, exports, value):
    local = tf.saved_model.load(exports["paths"]["scann"])
    expected = local.signatures["top_k"](history=tf.constant(_histories()), k=tf.constant(5),
                                         exclude_history=tf.constant(value))
    for body in ({"signature_name": "top_k", "inputs": {
                      "history": _histories().tolist(), "k": 5, "exclude_history": value}},
                 {"signature_name": "top_k", "instances": [
                     {"history": h, "k": 5, "exclude_history": value}
                     for h in _histories().tolist()]}):
        code, reply = _http(server, "POST", "/v1/models/ml:predict", body)
        assert code == 200, reply
        ids = reply["outputs"]["item_ids"] if "outputs" in reply else \
            [p["item_ids"] for p in reply["predictions"]]
        assert ids == expected["item_ids"].numpy().tolist()


# (history sent, whether the model's int64 input accepts it): one rule for both protocols
_DTYPE_CASES = [
    ("int64", np.array([[101, 102]], np.int64), True),
    ("int32", np.array([[101, 102]], np.int32), True),
    ("float_integral", np.array([[101.0, 102.0]], np.float32), False),
    ("float_fraction", np.array([[101.5, 102.0]], np.float64), False),
    ("bool", np.array([[True, False]]), False),
    ("string", np.array([["101", "102"]]), False),
]


@pytest.mark.parametrize("case,history,accepted", _DTYPE_CASES, ids=[c[0] for c in _DTYPE_CASES])
def test_rest_and_grpc_apply_the_same_dtype_rules(server, case, history, accepted):
    """gRPC cast a float32 history to integers while REST refused floats."""
    stub, channel = predict_stub(f"127.0.0.1:{server.port}")
    request = make_request("ml", _histories())
    request.inputs["history"].CopyFrom(tf.make_tensor_proto(history))
    try:
        response = stub.Predict(request, timeout=30)
        grpc_outcome = ("accepted", tf.make_ndarray(response.outputs["item_ids"]).tolist())
    except grpc.RpcError as exc:
        grpc_outcome = (exc.code().name, exc.details())
    channel.close()
    code, reply = _http(server, "POST", "/v1/models/ml:predict",
                        {"instances": history.tolist()})
    rest_outcome = ("accepted", [p["item_ids"] for p in reply["predictions"]]) \
        if code == 200 else (code, reply["error"])
    if accepted:
        assert grpc_outcome == rest_outcome and grpc_outcome[0] == "accepted"
    else:
        assert grpc_outcome[0] == "INVALID_ARGUMENT" and rest_outcome[0] == 400
        for details in (grpc_outcome[1], rest_outcome[1]):
            assert "'history'" in details and "int64" in details, details


@pytest.mark.parametrize("field,value", [("port", 70000), ("rest_api_port", -1),
                                         ("port", 65536)])
def test_ports_are_checked_to_0_65535(field, value):
    with pytest.raises(ValueError, match=f"--{field} {value} is not a port: give 0 to 65535"):
        ServerOptions(model_name="m", model_base_path="/nowhere", **{field: value})


def test_serve_refuses_a_port_out_of_range_and_a_bad_model_name_in_one_line(capsys, tmp_path):
    """`serve --port 70000` ended in an OverflowError traceback; `--model_name a/b` was
    served although `export` refuses it."""
    from tfrs_logq import cli

    for flags, words in [(["--model_name", "m", "--port", "70000"], ["--port 70000", "65535"]),
                         (["--model_name", "a/b"], ["--model_name 'a/b'", "not a valid"])]:
        code = cli.main(["serve", "--model_base_path", str(tmp_path / "missing"), *flags])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        for word in words:
            assert word in err, err


def test_serve_and_export_refuse_the_same_model_names():
    from tfrs_logq.serving.export import check_model_name

    for name in ["a/b", "..", ".hidden", "-x", "", "a" * 200, "ok.name_1-2"]:
        try:
            check_model_name(name)
            export_ok = True
        except ValueError:
            export_ok = False
        try:
            ServerOptions(model_name=name, model_base_path="/nowhere")
            serve_ok = True
        except ValueError:
            serve_ok = False
        assert serve_ok == export_ok, name


# ------------------------------------------------------------------ corrupt versions


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_corrupt_version_is_logged_once_shown_in_the_status_and_the_good_one_serves(
        exports, tmp_path):
    import shutil

    base = tmp_path / "base"
    shutil.copytree(exports["paths"]["brute-force"], base / "1")
    shutil.copytree(exports["paths"]["brute-force"], base / "2")
    (base / "2" / "saved_model.pb").write_bytes(os.urandom(2000))  # corrupt
    records = _Records()
    logger = logging.getLogger("tfrs_logq.serving")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    options = ServerOptions(model_name="c", port=0, rest_api_port=0, model_base_path=str(base),
                            file_system_poll_wait_seconds=0.05)
    srv = ModelServer(options).start()
    try:
        time.sleep(1.0)  # about 20 polls
        failures = [m for m in records.messages if "could not load version 2" in m]
        assert len(failures) == 1, records.messages
        stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
        assert stub.Predict(make_request("c", _histories()), timeout=30) \
            .model_spec.version.value == 1
        code, body = _http(srv, "GET", "/v1/models/c")
        assert code == 200
        statuses = {s["version"]: s for s in body["model_version_status"]}
        assert statuses["1"]["state"] == "AVAILABLE"
        assert statuses["1"]["status"]["error_code"] == "OK"
        assert statuses["2"]["state"] == "END"
        assert statuses["2"]["status"]["error_code"] != "OK"
        assert statuses["2"]["status"]["error_message"]
        assert _http(srv, "GET", "/v1/models/c/versions/2")[1]["model_version_status"] == \
            [statuses["2"]]
        grpc_status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "c"}), timeout=30)
        by_version = {s.version: s for s in grpc_status.model_version_status}
        assert by_version[1].state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
        assert by_version[2].state == get_model_status_pb2.ModelVersionStatus.END
        assert by_version[2].status.error_code != 0 and by_version[2].status.error_message
        channel.close()
        # Changed (still corrupt): tried and logged once more, and only once.
        (base / "2" / "saved_model.pb").write_bytes(os.urandom(3000))
        time.sleep(1.0)
        failures = [m for m in records.messages if "could not load version 2" in m]
        assert len(failures) == 2, records.messages
    finally:
        srv.stop()
        logger.removeHandler(records)
        logger.setLevel(level)


# ------------------------------------------------------------------ metrics, evaluate


def test_client_recall_ndcg_is_the_metrics_implementation():
    from tfrs_logq.serving.client import recall_ndcg

    from tfrs_logq.metrics import recall_ndcg_from_ranks

    ranks = np.random.default_rng(3).integers(0, 1500, size=500)
    got = recall_ndcg(ranks, (10, 100, 1000), (20,))
    assert list(got) == ["recall@10", "recall@100", "recall@1000", "ndcg@20"]
    reference = {f"recall@{k}": np.mean(ranks < k) for k in (10, 100, 1000)}
    reference["ndcg@20"] = np.mean([1 / np.log2(r + 2) if r < 20 else 0.0 for r in ranks])
    for key, value in reference.items():
        assert got[key] == pytest.approx(value, rel=1e-12)
    library = recall_ndcg_from_ranks(ranks, (10, 20, 100, 1000))
    assert all(got[key] == library[key] for key in got)


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
    from tfrs_logq.serving import evaluation

    from tfrs_logq import cli

    calls = []
    monkeypatch.setattr(evaluation, "evaluate_through_server",
                        lambda *a, **kw: calls.append((a, kw)) or {"served": {}})
    code = cli.main(["evaluate", "--server", "h:1", "--model_name", "m", "--model-dir",
                     trained["model_dir"], "--max-targets", "7", "--timeout", "3", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out) == {"served": {}}
    (args, kwargs), = calls
    assert args == ("h:1", "m", trained["model_dir"])
    assert kwargs["max_targets"] == 7 and kwargs["timeout"] == 3.0


def test_the_drain_is_bounded_by_its_timeout_and_counts_what_it_cut(exports):
    """Requests that wait in a 5 s batch window outlive a 0.5 s drain: they are cut,
    counted as cut, and stop() returns in about the drain timeout."""
    options = ServerOptions(model_name="cut", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"),
                            batch_timeout_micros=5_000_000, max_batch_size=1000,
                            drain_timeout_in_ms=500)
    srv = ModelServer(options).start()
    results: list = []
    threads = _predict_in_threads(srv.rest_port, srv.port, "cut", 2, results)
    time.sleep(0.8)
    start = time.monotonic()
    summary = srv.stop()
    assert time.monotonic() - start < 4.0
    for t in threads:
        t.join(timeout=30)
    assert summary["cut"] == 4 and summary["drained"] == {"rest": 0, "grpc": 0}, summary
    assert not any(outcome in (200, "OK") for _, outcome, _ in results), results
