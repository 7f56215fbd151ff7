"""serving/server.py end to end: a running `ModelServer` answering both protocols (the
in-process SavedModel's answers, status and metadata), 200 concurrent REST clients,
a port in use, a version swap under load, and the drain on SIGTERM and SIGINT."""

import json
import os
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import json_format, struct_pb2
from serving_helpers import (
    _histories,
    _http,
    _predict_body,
    _predict_in_threads,
    _wait_for,
)
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
)

from tfrs_logq.serving.client import make_request, predict_stub
from tfrs_logq.serving.export import export
from tfrs_logq.serving.server import ModelServer, ServerOptions


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
    # The export's index and what it measured, from its assets/export.json.
    index = body["metadata"]["index"]
    assert set(index) == {"kind", "scann", "scann_tuning", "faiss", "faiss_tuning"}
    assert index["kind"] in ("scann", "brute-force")  # read from the export, not defaulted
    # The same over gRPC: our "index" field, a Struct (TF Serving has only signature_def).
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["index"])
    request.model_spec.name = "ml"
    meta = stub.GetModelMetadata(request, timeout=30)
    assert set(meta.metadata) == {"index"}
    packed = struct_pb2.Struct()
    meta.metadata["index"].Unpack(packed)
    assert json_format.MessageToDict(packed) == json.loads(json.dumps(index))
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["weights"])
    request.model_spec.name = "ml"
    with pytest.raises(grpc.RpcError) as error:
        stub.GetModelMetadata(request, timeout=30)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "['signature_def', 'index']" in error.value.details()
    channel.close()


@pytest.mark.slow  # a load test (11 s on 2 cores): make test-slow
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
    try:  # clients answered by version 1, the swap, then answered by version 2
        _wait_for(lambda: versions.count(1) >= 10 or errors, what="10 answers from version 1")
        export(trained["model_dir"], str(exports["base"]), "swap", index="brute-force",
               version=2)
        _wait_for(lambda: versions.count(2) >= 10 or errors, what="10 answers from version 2")
    finally:
        stop.set()
        for t in threads:
            t.join()
    srv.stop()
    channel.close()
    assert not errors, errors[:1]
    assert 1 in versions and versions[-1] == 2
    assert len(versions) > 20


def test_rest_200_concurrent_clients_all_succeed(server):
    """socketserver's listen backlog of 5 reset connections under this load."""
    import http.client

    clients, per_client = 200, 3
    barrier = threading.Barrier(clients, timeout=120)
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
                                                            timeout=120)
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
    for t in threads:
        t.start()
    for t in threads:  # guards against a hang, not a measure: a loaded machine is slow
        t.join(timeout=300)
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


# `python -m tfrs_logq.cli` with two additions: a line on stdout, "in flight: N", each time
# the server's count of requests in flight changes, so that a test can wait for a count; and
# every batch held before its model call until the server's stop (the drain) begins, so
# that the requests are still in flight when the signal comes, whatever the clock.
_CLI_REPORTING_IN_FLIGHT = """
import runpy, threading, time
from tfrs_logq.serving import batching, server

draining = threading.Event()
run_batch, stop = batching.Batcher._run_batch, server.ModelServer.stop

def held_run_batch(self, name, batch):
    draining.wait(120)
    return run_batch(self, name, batch)

def stop_and_release(self, *args, **kwargs):
    draining.set()
    return stop(self, *args, **kwargs)

batching.Batcher._run_batch = held_run_batch
server.ModelServer.stop = stop_and_release
start = server.ModelServer.start

def start_and_report(self):
    def report():
        last = None
        while True:
            now = self.rest_in_flight.now + self.grpc_in_flight.now
            if now != last:
                print(f"in flight: {now}", flush=True)
                last = now
            time.sleep(0.01)
    threading.Thread(target=report, daemon=True).start()
    return start(self)

server.ModelServer.start = start_and_report
runpy.run_module("tfrs_logq.cli", run_name="__main__", alter_sys=True)
"""


def test_sigterm_drains_requests_in_flight_on_both_protocols_and_exits_0(trained, exports):
    """The requests wait in their batch (held until the drain begins) when SIGTERM
    arrives: all are answered, the log says how many were drained, the exit code is 0
    (it was -15: killed)."""
    import queue
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI_REPORTING_IN_FLIGHT, "serve", "--model_name", "drain",
         "--model_base_path", str(exports["base"] / "brute_force"), "--port", "0",
         "--rest_api_port", "0", "--max_batch_size", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)],
                     daemon=True).start()

    def next_line(prefix, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line {prefix!r} within {timeout} s") from None
            if line is None:  # the server exited
                raise AssertionError(f"exited before {prefix!r}: {proc.stderr.read()[-3000:]}")
            if line.startswith(prefix):
                return line

    try:
        line = next_line("serving drain")  # "serving drain from ...: gRPC H:P, REST H:P"
        grpc_port = int(line.split("gRPC ")[1].split(",")[0].rsplit(":", 1)[1])
        rest_port = int(line.split("REST ")[1].strip().rsplit(":", 1)[1])
        # The first batch is held until the drain; the other requests queue behind it.
        results: list = []
        threads = _predict_in_threads(rest_port, grpc_port, "drain", 6, results)
        next_line("in flight: 12", timeout=30)  # every request has reached the server ...
        assert not results, results  # ... and none is answered yet
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    assert sorted(results) == [("grpc", "OK", 3)] * 6 + [("rest", 200, 10)] * 6, results
    assert proc.returncode == 0, err[-3000:]
    drained = [ln for ln in err.splitlines() if "drained" in ln]
    assert len(drained) == 1 and "received SIGTERM" in drained[0], err[-3000:]
    assert "drained 12 request(s) in flight (REST 6, gRPC 6)" in drained[0], drained


def test_sigint_drains_in_process_and_the_ports_then_refuse(exports, monkeypatch):
    """SIGINT comes once the 4 requests are in flight, held in their batch until the drain
    begins (no timer and no batch window): all 4 are drained and answered."""
    import signal
    import socket

    from tfrs_logq.serving.batching import Batcher

    draining = threading.Event()
    run_batch, stop = Batcher._run_batch, ModelServer.stop

    def held_run_batch(self, name, batch):
        draining.wait(120)
        return run_batch(self, name, batch)

    def stop_and_release(self, *args, **kwargs):
        draining.set()
        return stop(self, *args, **kwargs)

    monkeypatch.setattr(Batcher, "_run_batch", held_run_batch)
    monkeypatch.setattr(ModelServer, "stop", stop_and_release)
    options = ServerOptions(model_name="int", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"),
                            max_batch_size=1000)
    srv = ModelServer(options).start()
    handler_before = signal.getsignal(signal.SIGINT)
    results: list = []
    threads = _predict_in_threads(srv.rest_port, srv.port, "int", 2, results)

    def interrupt_when_all_are_in_flight():
        _wait_for(lambda: srv.rest_in_flight.now + srv.grpc_in_flight.now == 4,
                  what="4 requests in flight")
        _wait_for(lambda: signal.getsignal(signal.SIGINT) is not handler_before,
                  what="the server's SIGINT handler")
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_all_are_in_flight, daemon=True).start()
    summary = srv.serve_until_signal()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [("grpc", "OK", 3)] * 2 + [("rest", 200, 10)] * 2, results
    assert summary["drained"] == {"rest": 2, "grpc": 2} and summary["cut"] == 0, summary
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", srv.rest_port), timeout=5).close()
    assert signal.getsignal(signal.SIGINT) is handler_before  # restored
