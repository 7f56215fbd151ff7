"""serving/metrics.py and serving/health.py through a running server: the Prometheus
endpoint's counts change with the requests sent (labels bounded: a client's signature name
never becomes a label), each server counts in its own registry, and the gRPC health
service (Check and Watch) and the KServe V2 routes follow the load of a version and the
drain."""

import os
import queue
import threading
import urllib.request

import numpy as np
import pytest
from serving_helpers import _histories, _http, _predict_in_threads, _tiny_export, _wait_for

from tfrs_logq.serving.metrics import METHODS, PATH

prometheus_parser = pytest.importorskip("prometheus_client.parser")


def _scrape(server) -> dict:
    """``{(name, labels as a sorted tuple): value}`` of every sample at the metrics path."""
    url = f"http://127.0.0.1:{server.rest_port}{PATH}"
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in prometheus_parser.text_string_to_metric_families(text)
            for s in family.samples}


def _requests(samples, **labels) -> float:
    want = tuple(sorted(labels.items()))
    return samples.get(("tfrs_logq_requests_total", want), 0.0)


def _server(base, **options):
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    return ModelServer(ServerOptions(model_name="ml", model_base_path=str(base), port=0,
                                     rest_api_port=0, file_system_poll_wait_seconds=3600,
                                     **options)).start()


def test_metrics_count_requests_by_protocol_signature_and_status(tiny_server):
    from tfrs_logq.serving.client import make_request, predict_stub

    before = _scrape(tiny_server)
    long_name = "sig-" + "x" * 500
    ok = {"signature_name": "top_k", "inputs": {"history": [[101, 102]], "k": 3}}
    assert _http(tiny_server, "POST", "/v1/models/ml:predict", ok)[0] == 200
    assert _http(tiny_server, "POST", "/v1/models/ml:predict", ok)[0] == 200
    bad = {"signature_name": long_name, "inputs": {"history": [[101]]}}
    assert _http(tiny_server, "POST", "/v1/models/ml:predict", bad)[0] == 400
    assert _http(tiny_server, "GET", "/v1/models/nope")[0] == 404
    stub, channel = predict_stub(f"127.0.0.1:{tiny_server.port}")
    stub.Predict(make_request("ml", _histories()), timeout=30)
    channel.close()
    after = _scrape(tiny_server)

    def delta(**labels):
        return _requests(after, **labels) - _requests(before, **labels)

    assert delta(protocol="rest", method="predict", signature="top_k", status="OK") == 2
    assert delta(protocol="rest", method="predict", signature="unknown",
                 status="INVALID_ARGUMENT") == 1
    assert delta(protocol="rest", method="status", signature="", status="NOT_FOUND") == 1
    assert delta(protocol="grpc", method="predict", signature="serving_default",
                 status="OK") == 1
    # Each request's latency is in its histogram; the batched calls in theirs.
    count = ("tfrs_logq_request_latency_seconds_count",
             (("method", "predict"), ("protocol", "rest"), ("signature", "top_k")))
    assert after[count] - before.get(count, 0) == 2
    rows = ("tfrs_logq_batch_size_sum", (("signature", "top_k"),))
    assert after[rows] - before.get(rows, 0) == 2  # one row each
    waits = ("tfrs_logq_batch_queue_wait_seconds_count", (("signature", "top_k"),))
    assert after[waits] - before.get(waits, 0) == 2
    # The version and the index of the version served.
    assert after[("tfrs_logq_served_version", (("model", "ml"),))] == 1
    assert after[("tfrs_logq_model_versions", (("model", "ml"), ("state", "AVAILABLE")))] == 1
    assert after[("tfrs_logq_index_info", (("kind", "brute-force"), ("model", "ml")))] == 1
    # Bounded labels: no label value comes from the request.
    values = {(k, v) for _, labels in after for k, v in labels}
    assert not any(long_name in v or "nope" in v for _, v in values)
    assert {v for k, v in values if k == "method"} <= set(METHODS)
    assert {v for k, v in values if k == "signature"} <= {
        "", "unknown", "serving_default", "top_k", "query_embedding"}
    assert {v for k, v in values if k == "protocol"} <= {"rest", "grpc"}


def test_each_server_counts_in_its_own_registry(tiny_server, tiny_export):
    _http(tiny_server, "POST", "/v1/models/ml:predict", {"instances": [[101, 102]]})
    other = _server(os.path.dirname(tiny_export))
    try:
        samples = _scrape(other)  # its own scrape is the only request it has seen
        predicts = [v for (name, labels), v in samples.items()
                    if name == "tfrs_logq_requests_total" and ("method", "predict") in labels]
        assert predicts == []
        assert _requests(_scrape(other), protocol="rest", method="metrics", signature="",
                         status="OK") == 1
    finally:
        other.stop(0)


def test_metrics_answer_while_every_worker_is_busy(tiny_export, monkeypatch):
    """Scrapes are answered while every REST and gRPC worker is held in the model call
    and more requests wait for one: they report exactly the requests in flight and none
    of them answered yet; once released, every request is answered and counted."""
    server = _server(os.path.dirname(tiny_export), rest_api_num_threads=2, num_threads=2,
                     max_batch_size=1)  # unbatched: each request calls the model itself
    servable = server.manager.current()
    entered, release = threading.Semaphore(0), threading.Event()
    model_call = servable.batcher._call

    def held(name, inputs):
        entered.release()
        assert release.wait(60)
        return model_call(name, inputs)

    monkeypatch.setattr(servable.batcher, "_call", held)
    results: list = []
    threads = []
    try:
        before = _scrape(server)
        threads = _predict_in_threads(server.rest_port, server.port, "ml", 4, results)
        for _ in range(4):  # both REST workers and both gRPC workers are in the model
            assert entered.acquire(timeout=60)
        # the other two REST requests wait for a worker (gRPC's two wait in its queue)
        _wait_for(lambda: server.rest_in_flight.now == 4, what="4 REST requests in flight")
        during = [_scrape(server), _scrape(server)]  # urlopen's 30 s timeout bounds each
        assert not results  # nothing was answered while they were scraped
    finally:
        release.set()
        for thread in threads:
            thread.join(60)
    try:
        after = _scrape(server)
    finally:
        server.stop(0)
    for samples in during:
        assert samples[("tfrs_logq_requests_in_flight", (("protocol", "rest"),))] == 5
        assert samples[("tfrs_logq_requests_in_flight", (("protocol", "grpc"),))] == 2
        for protocol in ("rest", "grpc"):
            assert _requests(samples, protocol=protocol, method="predict",
                             signature="serving_default", status="OK") == 0
    scrapes = [_requests(samples, protocol="rest", method="metrics", signature="",
                         status="OK") for samples in (before, *during)]
    assert scrapes == [0, 1, 2]  # each scrape answered and counted, one after another
    # gRPC: 3 rows each; REST: default_k (10) items for its one row
    assert sorted(results) == [("grpc", "OK", 3)] * 4 + [("rest", 200, 10)] * 4
    for protocol in ("rest", "grpc"):
        assert _requests(after, protocol=protocol, method="predict",
                         signature="serving_default", status="OK") == 4
    assert after[("tfrs_logq_requests_in_flight", (("protocol", "grpc"),))] == 0
    assert after[("tfrs_logq_requests_in_flight", (("protocol", "rest"),))] == 1


def _health(server, service=""):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=30)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_grpc_health_and_v2_routes_follow_the_load_and_the_drain(tmp_path):
    base = tmp_path / "ml"
    base.mkdir()
    server = _server(base)
    try:
        # No version yet: alive, not ready.
        assert _health(server) == "NOT_SERVING"
        assert _http(server, "GET", "/v2/health/live") == (200, {"live": True})
        assert _http(server, "GET", "/v2/health/ready")[0] == 503
        assert _http(server, "GET", "/v2/models/ml/ready")[0] == 503

        _tiny_export(base, np.arange(100, 140))
        server.manager.poll()  # what the watcher does every file_system_poll_wait_seconds
        for service in ("", "tensorflow.serving.PredictionService",
                        "tensorflow.serving.ModelService"):
            assert _health(server, service) == "SERVING"
        assert _http(server, "GET", "/v2/health/ready") == (200, {"ready": True})
        assert _http(server, "GET", "/v2/models/ml/ready") == (200, {"name": "ml",
                                                                     "ready": True})
        assert _http(server, "GET", "/v2/models/ml/versions/1/ready")[0] == 200
        assert _http(server, "GET", "/v2/models/ml/versions/7/ready")[0] == 404
        assert _http(server, "GET", "/v2/models/other/ready")[0] == 404

        # The drain's first step (`ModelServer.stop` takes it before its grace, while the
        # ports still accept): readiness fails on every route and service at once.
        server.manager.begin_drain()
        assert _health(server) == "NOT_SERVING"
        assert _health(server, "tensorflow.serving.PredictionService") == "NOT_SERVING"
        assert _http(server, "GET", "/v2/health/ready")[0] == 503
        status, body = _http(server, "GET", "/v2/models/ml/ready")
        assert status == 503 and body["ready"] is False and "shutting down" in body["error"]
        assert _http(server, "GET", "/v2/health/live")[0] == 200
    finally:
        server.stop(0)


def _watch(server, service=""):
    """A health ``Watch`` stream read on a thread: a queue of its statuses by name, then
    ``"END"`` (the server ended it, status OK) or ``("ERROR", code)``."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    stream = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=service))
    heard: queue.Queue = queue.Queue()

    def read():
        try:
            for reply in stream:
                heard.put(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
            heard.put("END")
        except grpc.RpcError as exc:
            heard.put(("ERROR", exc.code().name))
        finally:
            channel.close()

    threading.Thread(target=read, daemon=True).start()
    return stream, heard


def _next_change(heard, last):
    """The next status a stream hears that is not ``last`` (the servicer may repeat one)."""
    while True:
        status = heard.get(timeout=60)  # a bound on a hung stream, not a timing
        if status != last:
            return status


def test_grpc_health_watch_hears_the_load_and_the_drain_then_ends(tmp_path):
    """A Watch stream hears NOT_SERVING before a version loads, SERVING once it has,
    NOT_SERVING when the drain begins (the stream still open, the ports still serving),
    and is ended by the server (status OK) when the ports close, so it never holds the
    shutdown until drain_timeout_in_ms cuts it."""
    base = tmp_path / "ml"
    base.mkdir()
    server = _server(base, drain_grace_in_ms=0, drain_timeout_in_ms=60_000)
    try:
        streams = {service: _watch(server, service)
                   for service in ("", "tensorflow.serving.PredictionService")}
        for _, heard in streams.values():
            assert heard.get(timeout=60) == "NOT_SERVING"

        _tiny_export(base, np.arange(100, 140))
        server.manager.poll()
        for _, heard in streams.values():
            assert _next_change(heard, "NOT_SERVING") == "SERVING"

        server.manager.begin_drain()
        for _, heard in streams.values():
            assert _next_change(heard, "SERVING") == "NOT_SERVING"
        assert all(heard.empty() or heard.queue[0] == "NOT_SERVING"
                   for _, heard in streams.values())  # still open: not ended by the drain
        assert _health(server) == "NOT_SERVING"
    finally:
        result = server.stop()
    for _, heard in streams.values():
        assert _next_change(heard, "NOT_SERVING") == "END"
    assert result["cut"] == 0
