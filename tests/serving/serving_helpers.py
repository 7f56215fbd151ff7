"""What the tests/serving/test_serving_*.py files share: request histories, REST calls
(JSON and raw bytes), predictions on both protocols from threads, and both protocols'
request checks on a `Servable` without a server. The trained model, its exports and the
running server on them are fixtures of tests/conftest.py, built once a test run; the
servable and server of an untrained export, of tests/serving/conftest.py."""

import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from tfrs_logq.serving.client import make_request, predict_stub


def _wait_for(condition, timeout=30.0, what="condition", every=0.01):
    """Polls ``condition()`` until it is true; AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(every)


def _histories():
    return np.array([[101, 102, 103, 0], [0, 0, 0, 110], [104, 999_999, 105, 106]], np.int64)


def _http(server, method, path, body=None):
    url = f"http://127.0.0.1:{server.rest_port}{path}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _predict_body(k=None):
    inputs = {"history": [[101, 102, 103]]}
    if k is not None:
        return json.dumps({"signature_name": "top_k", "inputs": {**inputs, "k": k}}).encode()
    return json.dumps({"instances": inputs["history"]}).encode()


def _rest_predict(servable, body) -> tuple:
    """REST's predict once its body is read (`rest_api._predict_encoded`: decode, check,
    run, encode, the reply bounded), on ``servable`` without a server: ``(HTTP status,
    JSON reply)``, a refusal as ``{"error": ...}`` as the server sends it."""
    from tfrs_logq.serving.errors import ServingError
    from tfrs_logq.serving.rest_api import _predict_encoded

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        return 200, json.loads(_predict_encoded(servable, data,
                                                servable.options.max_response_bytes))
    except ServingError as exc:
        return exc.http_status, {"error": str(exc)}


def _grpc_predict(servable, request) -> tuple:
    """gRPC Predict's steps once the servable is found (`grpc_service`: each tensor
    checked and built, the inputs checked, the model run), without a server:
    ``("OK", outputs)`` or ``(status name, details)``."""
    from tfrs_logq.serving.errors import ServingError

    signature = request.model_spec.signature_name
    try:
        inputs = servable.arrays_from_protos(signature, request.inputs)
        return "OK", servable.run(servable.validate(signature, inputs))
    except ServingError as exc:
        return exc.grpc_status.name, str(exc)


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


def _tiny_export(base, raw_ids, max_length=5, default_k=3) -> str:
    """A brute-force export of an untrained SASRec encoder over ``raw_ids``: a servable
    in a second, for tests of the server rather than of the model."""
    import tensorflow as tf

    from tfrs_logq.sasrec.models import SASRecEncoder
    from tfrs_logq.serving.export import RetrievalModule, export_version

    encoder = SASRecEncoder(len(raw_ids) + 1, max_length, 8, 1, 1, 0.0)
    encoder(tf.zeros([1, max_length], tf.int32))
    module = RetrievalModule(encoder, np.asarray(raw_ids), "brute-force", default_k=default_k)
    return export_version("", str(base), index="brute-force", module=module)
