"""serving/drain.py and the server's drain: readiness fails first, both ports serve through
a grace with ``Connection: close`` on REST, no request sent before the signal fails on
either protocol, and the drain is bounded by its timeout and counts what it cut."""

import http.client
import itertools
import json
import os
import signal
import threading
import time

import grpc
import pytest
from serving_helpers import _histories, _predict_body, _predict_in_threads, _wait_for
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from tfrs_logq.serving.client import make_request, predict_stub
from tfrs_logq.serving.server import ModelServer, ServerOptions


def _get(port, path, connection=None):
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.getheader("Connection"), json.loads(response.read())
    finally:
        if own:
            connection.close()


def _hold_batches(monkeypatch) -> threading.Event:
    """Every batch waits, before its model call, until the returned event is set: the
    requests in it stay in flight for as long as the test says, whatever the clock."""
    from tfrs_logq.serving.batching import Batcher

    release = threading.Event()
    run_batch = Batcher._run_batch

    def held(self, name, batch):
        release.wait(120)
        return run_batch(self, name, batch)

    monkeypatch.setattr(Batcher, "_run_batch", held)
    return release


def test_the_drain_is_bounded_by_its_timeout_and_counts_what_it_cut(tiny_export, monkeypatch):
    """Requests held in their batch outlive a 0.5 s drain: stop() returns while they are
    still held (a drain that waited for them would not return until they were released),
    and counts them as cut."""
    release = _hold_batches(monkeypatch)
    options = ServerOptions(model_name="cut", port=0, rest_api_port=0,
                            model_base_path=os.path.dirname(tiny_export),
                            max_batch_size=1000, drain_timeout_in_ms=500,
                            request_timeout_in_ms=600_000)  # only the drain can end them
    srv = ModelServer(options).start()
    results: list = []
    threads = _predict_in_threads(srv.rest_port, srv.port, "cut", 2, results)
    _wait_for(lambda: srv.rest_in_flight.now + srv.grpc_in_flight.now == 4,
              what="4 requests in flight")
    summary: list = []
    stopper = threading.Thread(target=lambda: summary.append(srv.stop()), daemon=True)
    stopper.start()
    try:
        stopper.join(60)  # a guard against a hang, not a measure
        assert not stopper.is_alive(), "stop() waited for the requests held in their batch"
    finally:
        release.set()
    for t in threads:
        t.join(timeout=30)
    assert summary[0]["cut"] == 4 and summary[0]["drained"] == {"rest": 0, "grpc": 0}, summary
    assert not any(outcome in (200, "OK") for _, outcome, _ in results), results


class _HeldGrace:
    """The server module's ``time`` with a ``sleep`` (the drain's grace) that lasts until
    the test calls `end`: the checks made during the grace cannot outrun it."""

    def __init__(self) -> None:
        self.begun, self._end = threading.Event(), threading.Event()
        self.asked: list = []  # the seconds of each sleep

    def sleep(self, seconds) -> None:
        self.asked.append(seconds)
        if seconds > 0:  # a grace of none is not held
            self.begun.set()
            self._end.wait(120)

    def end(self) -> None:
        self._end.set()

    def __getattr__(self, name):
        return getattr(time, name)


def test_readiness_fails_first_and_both_ports_serve_through_the_grace(tiny_export,
                                                                       monkeypatch):
    """Readiness is what a load balancer reads: it fails at the signal, while both ports
    still answer (REST with Connection: close) until the grace ends (here: when the test
    ends it), then both close."""
    from tfrs_logq.serving import server as server_module

    grace = _HeldGrace()
    monkeypatch.setattr(server_module, "time", grace)
    options = ServerOptions(model_name="g", port=0, rest_api_port=0,
                            model_base_path=os.path.dirname(tiny_export),
                            drain_grace_in_ms=4000)
    srv = ModelServer(options).start()
    idle = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=15)
    assert _get(srv.rest_port, "/readyz") == (200, None, {"ready": True})
    assert _get(srv.rest_port, "/livez")[0] == 200
    code, connection_header, _ = _get(srv.rest_port, "/v1/models/g", idle)  # kept alive
    assert code == 200 and connection_header is None
    stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
    status_stub = model_service_pb2_grpc.ModelServiceStub(channel)
    summary: list = []
    stopper = threading.Thread(target=lambda: summary.append(srv.stop()), daemon=True)
    stopper.start()
    _wait_for(grace.begun.is_set, what="the drain's grace begun (in time.sleep)")
    _wait_for(lambda: _get(srv.rest_port, "/readyz")[0] == 503, what="/readyz 503")
    code, _, body = _get(srv.rest_port, "/readyz")
    assert code == 503 and body["ready"] is False and "shutting down" in body["error"]
    assert _get(srv.rest_port, "/v1/models/g")[2]["model_version_status"][0]["state"] == \
        "UNLOADING"
    status = status_stub.GetModelStatus(
        get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "g"}), timeout=15)
    assert status.model_version_status[0].state == \
        get_model_status_pb2.ModelVersionStatus.UNLOADING
    # The idle keep-alive connection is served, and told to close.
    idle.request("POST", "/v1/models/g:predict", _predict_body())
    response = idle.getresponse()
    assert response.status == 200 and json.loads(response.read())["predictions"]
    assert response.getheader("Connection") == "close"
    # A new connection and a new gRPC call are still served.
    fresh = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=15)
    fresh.request("POST", "/v1/models/g:predict", _predict_body())
    response = fresh.getresponse()
    assert response.status == 200 and response.getheader("Connection") == "close"
    response.read()
    assert stub.Predict(make_request("g", _histories()), timeout=15).outputs["item_ids"]
    assert stopper.is_alive() and not summary, "the drain ended during its grace"
    assert grace.asked == [4.0], grace.asked  # drain_grace_in_ms
    grace.end()
    stopper.join(timeout=60)
    channel.close()
    assert summary and summary[0]["cut"] == 0, summary
    with pytest.raises(ConnectionRefusedError):
        _get(srv.rest_port, "/readyz")


def test_no_request_sent_before_sigterm_fails_and_keep_alive_clients_are_told_to_close(
        tiny_export):
    """Keep-alive REST clients, new-connection REST clients and gRPC clients send
    requests in a loop when SIGTERM arrives. Before: 25 of 25 keep-alive clients got
    BrokenPipeError/ConnectionResetError on their next request (the server closed the
    connection without saying so), and new connections waiting in the listen backlog
    were reset. Now every request sent before the signal is answered, no request fails
    on a reused connection, and what fails after the signal is a refusal."""
    options = ServerOptions(model_name="t", port=0, rest_api_port=0,
                            model_base_path=os.path.dirname(tiny_export))
    srv = ModelServer(options).start()
    results: list = []  # (kind, client, its place in `order`, outcome, reused, told_to_close)
    lock = threading.Lock()
    signalled: list = []
    order = itertools.count()  # orders the requests and the signal: no clock is compared
    stop_by = time.monotonic() + 60  # a guard against a hang

    def record(*row):
        with lock:
            results.append(row)

    def rest_client(index, keep_alive):
        kind = "keep-alive" if keep_alive else "new-connection"
        connection = None
        while time.monotonic() < stop_by:
            if connection is None or not keep_alive:
                connection = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=30)
            reused = connection.sock is not None
            started = next(order)
            try:
                connection.request("POST", "/v1/models/t:predict", _predict_body())
                response = connection.getresponse()
                response.read()
                closing = (response.getheader("Connection") or "").lower() == "close"
                record(kind, index, started, response.status, reused, closing)
            except ConnectionRefusedError:
                record(kind, index, started, "refused", reused, False)
                return  # the server is gone
            except (OSError, http.client.HTTPException) as exc:
                record(kind, index, started, type(exc).__name__, reused, False)
                connection.close()
                if signalled:
                    return
            if not keep_alive:
                connection.close()

    def grpc_client(index):
        stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
        while time.monotonic() < stop_by:
            started = next(order)
            try:
                stub.Predict(make_request("t", _histories()), timeout=30)
                record("grpc", index, started, "OK", True, False)
            except grpc.RpcError as exc:
                record("grpc", index, started, exc.code().name, True, False)
                if signalled:
                    break
        channel.close()

    threads = [threading.Thread(target=rest_client, args=(i, True)) for i in range(6)]
    threads += [threading.Thread(target=rest_client, args=(i, False)) for i in range(6)]
    threads += [threading.Thread(target=grpc_client, args=(i,)) for i in range(4)]

    def signal_when_every_client_has_been_served():
        def served():
            with lock:
                return len({(r[0], r[1]) for r in results if r[3] in (200, "OK")}) == 16

        _wait_for(served, timeout=30, what="every client served once")
        _wait_for(lambda: signal.getsignal(signal.SIGTERM) is not handler_before,
                  what="the server's SIGTERM handler")
        signalled.append(next(order))
        os.kill(os.getpid(), signal.SIGTERM)

    handler_before = signal.getsignal(signal.SIGTERM)
    for t in threads:
        t.start()
    threading.Thread(target=signal_when_every_client_has_been_served, daemon=True).start()
    summary = srv.serve_until_signal()
    for t in threads:
        t.join(timeout=70)
    assert signalled, "no signal was sent"
    at = signalled[0]
    before = [r for r in results if r[2] < at]
    assert before and all(r[3] in (200, "OK") for r in before), \
        [r for r in before if r[3] not in (200, "OK")][:5]
    failed = [r for r in results if r[3] not in (200, "OK")]
    assert not [r for r in failed if r[0] == "keep-alive" and r[4]], failed[:5]
    # After the grace: a refused connection; a connection reset, only one opened just as
    # the listener closed; a gRPC call UNAVAILABLE, or CANCELLED when it reached grpc
    # as the server stopped (before any handler ran).
    assert all(r[3] in ("refused", "ConnectionResetError", "UNAVAILABLE", "CANCELLED")
               for r in failed), failed[:5]
    assert all(r[0] == "grpc" for r in failed if r[3] in ("UNAVAILABLE", "CANCELLED"))
    # (A keep-alive client told to close opens a new connection for its next request:
    # that one may meet the closing listener like any new connection.)
    assert not [r for r in failed if r[4] and r[3] == "ConnectionResetError"], failed[:5]
    told = {r[1] for r in results if r[0] == "keep-alive" and r[5]}
    assert told == set(range(6)), f"keep-alive clients told to close: {sorted(told)}"
    assert summary["cut"] == 0, summary


def test_clients_cut_by_the_drain_are_told_the_deadline_that_cut_them(tmp_path):
    """A request half sent at SIGTERM was cut after the shutdown's wait (1 s) but told
    "did not arrive within 30 s" (rest_api_timeout_in_ms); one whose body was still on
    its way was cut at the drain's timeout without being told how long that was."""
    import socket

    from serving_helpers import _tiny_export

    _tiny_export(tmp_path / "m", list(range(1, 11)))
    options = ServerOptions(model_name="m", port=0, rest_api_port=0,
                            model_base_path=str(tmp_path / "m"), drain_timeout_in_ms=3000,
                            drain_grace_in_ms=200, rest_api_timeout_in_ms=30_000)
    srv = ModelServer(options).start()
    replies: dict = {}

    def client(kind, data):
        with socket.create_connection(("127.0.0.1", srv.rest_port), timeout=30) as sock:
            sock.sendall(data)
            response = http.client.HTTPResponse(sock)
            response.begin()
            replies[kind] = (response.status, json.loads(response.read())["error"])

    head = b"POST /v1/models/m:predict HTTP/1.1\r\nHost: x\r\n"
    threads = [threading.Thread(target=client, args=args) for args in [
        ("head", head), ("body", head + b"Content-Length: 100\r\n\r\n{\"inst")]]
    for t in threads:
        t.start()
    _wait_for(lambda: srv.rest_in_flight.now == 1, what="the body's request in flight")
    _wait_for(lambda: len(srv.http._server.server_state.connections) == 2,
              what="both clients connected")
    srv.stop()
    for t in threads:
        t.join(timeout=60)  # a guard against a hang, not a measure
    assert not any(t.is_alive() for t in threads) and set(replies) == {"head", "body"}, replies
    status, error = replies["head"]
    assert status == 503 and "within the 1 s" in error and "30 s" not in error, error
    status, error = replies["body"]
    assert status == 503 and "within the 3 s" in error and "drain_timeout_in_ms" in error, error
