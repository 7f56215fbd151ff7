"""serving/http_server.py: malformed HTTP framing gets a JSON error, keep-alive
connections, and slow clients that do not delay a normal request (on a server of an
untrained export; a body's JSON refusals: test_serving_rest_api.py)."""

import json
import os

import pytest
from serving_helpers import _http, _predict_body, _raw, _wait_for

from tfrs_logq.serving.server import ModelServer, ServerOptions


def _post_raw(body: bytes, length="auto", extra=b""):
    head = b"POST /v1/models/ml:predict HTTP/1.1\r\nHost: x\r\n" + extra
    if length == "auto":
        head += b"Content-Length: %d\r\n" % len(body)
    elif length is not None:
        head += b"Content-Length: " + length.encode() + b"\r\n"
    return head + b"\r\n" + body


@pytest.mark.parametrize("case,request_bytes,status,fragments", [
    ("negative_length", _post_raw(b"", "-5"), 400, ["Content-Length", "-5"]),
    ("text_length", _post_raw(b"", "abc"), 400, ["Content-Length", "abc"]),
    ("no_length", _post_raw(b"", None), 400, ["Content-Length"]),
    ("two_lengths", _post_raw(b"{}", "2", b"Content-Length: 9\r\n"), 400, ["Content-Length"]),
    ("too_large", _post_raw(b"", "10000000"), 413, ["10000000", "200000"]),
    ("not_json", _post_raw(b'{"instances": [[1, 2'), 400, ["JSON"]),
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
def test_rest_malformed_requests_get_a_json_error(tiny_server, case, request_bytes, status,
                                                  fragments):
    server = tiny_server
    code, headers, reply = _raw(server, request_bytes, half_close=case == "short_body")
    assert code == status, reply
    assert isinstance(reply.get("error"), str) and reply["error"], reply
    assert "\n" not in reply["error"]
    for fragment in fragments:
        assert fragment in reply["error"], (fragment, reply)
    if case in ("negative_length", "text_length", "two_lengths", "bad_transfer_encoding",
                "short_body", "bad_request_line"):
        # The framing is unknown: the bytes that follow are not a request. (A refusal of a
        # well-framed request keeps the connection: the server skips its body; see
        # test_rest_keep_alive_serves_several_requests_on_one_connection.)
        assert headers["Connection"] == "close"
    assert _http(server, "POST", "/v1/models/ml:predict", {"instances": [[101]]})[0] == 200


def test_rest_keep_alive_serves_several_requests_on_one_connection(tiny_server):
    import http.client

    server = tiny_server
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


def _server_with_head_timeout(tiny_export, milliseconds):
    options = ServerOptions(model_name="slow", port=0, rest_api_port=0,
                            model_base_path=os.path.dirname(tiny_export),
                            rest_api_timeout_in_ms=milliseconds)
    return ModelServer(options).start()


def _slow_clients(srv, count):
    """``count`` connections that sent part of a request (odd ones part of the headers,
    even ones the headers and part of the body), once the server holds them all
    (uvicorn's set of open connections)."""
    import socket

    slow = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", srv.rest_port), timeout=60)
        if i % 2:  # part of the headers
            sock.sendall(b"POST /v1/models/slow:predict HTTP/1.1\r\nHost: x\r\nContent-Le")
        else:  # the headers and part of the body
            sock.sendall(b"POST /v1/models/slow:predict HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"instances\": [[1")
        slow.append(sock)
    _wait_for(lambda: len(srv.http._server.server_state.connections) >= count,
              what=f"{count} slow connections accepted")
    return slow


def test_64_slow_clients_do_not_delay_a_normal_request(tiny_export):
    """33 clients that sent part of a request made a normal one wait 29 s (each held one
    of the 32 workers); now they hold a socket each. Here no slow client times out while
    the test runs (rest_api_timeout_in_ms is 10 minutes), so the normal request can only
    be answered beside all 64, still connected and unanswered; on a server whose workers
    they held it would not be answered at all."""
    import http.client
    import select

    srv = _server_with_head_timeout(tiny_export, 600_000)
    slow = _slow_clients(srv, 64)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", srv.rest_port, timeout=60)
        connection.request("POST", "/v1/models/slow:predict", _predict_body())
        response = connection.getresponse()
        assert response.status == 200 and json.loads(response.read())["predictions"]
        connection.close()
        assert len(srv.http._server.server_state.connections) >= 64
        assert select.select(slow, [], [], 0)[0] == [], "a slow client was answered"
    finally:
        for sock in slow:
            sock.close()
        srv.stop()


def test_slow_clients_are_answered_408_at_rest_api_timeout_in_ms(tiny_export):
    """A client that sent part of its headers, and one that sent part of its body, are
    each answered 408 (JSON) naming rest_api_timeout_in_ms and its value, then closed."""
    import http.client

    srv = _server_with_head_timeout(tiny_export, 1500)
    slow = _slow_clients(srv, 2)
    try:
        for sock in slow:
            response = http.client.HTTPResponse(sock, method="POST")
            response.begin()
            assert response.status == 408, response.status
            error = json.loads(response.read())["error"]
            assert "rest_api_timeout_in_ms" in error and "1.5 s" in error, error
            assert sock.recv(1) == b""  # closed
    finally:
        for sock in slow:
            sock.close()
        srv.stop()


def test_uvicorn_is_the_minor_version_the_protocol_subclass_was_read_against():
    """http_server subclasses uvicorn's H11Protocol (internals). On another minor version,
    read its overrides against the new H11Protocol, then update UVICORN_CHECKED and the
    uvicorn pin of pyproject's serving extras."""
    import uvicorn

    from tfrs_logq.serving.http_server import UVICORN_CHECKED

    minor = ".".join(uvicorn.__version__.split(".")[:2])
    assert minor == UVICORN_CHECKED, (uvicorn.__version__, UVICORN_CHECKED)
