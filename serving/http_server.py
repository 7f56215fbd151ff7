"""The HTTP/1.1 server under the REST API: uvicorn (h11) on an event loop in a thread.

What it adds to uvicorn, in a protocol subclass:

- every refusal of the HTTP layer is JSON: a malformed request line, a bad or
  conflicting Content-Length, a missing Host (400) and a request not sent in time
  (408), like the REST API's own errors;
- a client must send its request line and headers within ``rest_api_timeout_in_ms``
  (a client that sends part of a request holds a socket, never a worker, and only
  that long: the body has the same bound in `rest_api.RestApi`);
- a client that half-closes after a short body still gets its reply;
- at shutdown, a connection whose first request may be on its way (new, or a request
  half received) is not closed under it: its request is served (``Connection:
  close``) if it arrives within `FIRST_REQUEST_WAIT_S` (Go's ``net/http`` keeps new
  connections at ``Shutdown`` likewise), where uvicorn would close it at once.

The subclass overrides uvicorn's ``H11Protocol`` methods (``connection_made``,
``data_received``, ``on_response_complete``, ``eof_received``, ``send_400_response``,
``shutdown``), which are internals: they were read against uvicorn `UVICORN_CHECKED`
(a test fails on another minor version, to have them read again). uvicorn has no hook
for a request-head timeout (its keep-alive timer stops at a request's first byte, so a
client sending a byte at a time would hold a socket for ever) nor for JSON refusals of
the HTTP layer, hence the subclass rather than a plain ``uvicorn.Config``.

The listening socket is bound here, before the model loads, with SO_REUSEADDR but
not SO_REUSEPORT, so a port in use is refused at start. Shutdown (`HttpServer.stop`)
is uvicorn's graceful one: stop accepting, close idle keep-alive connections, let
requests in flight finish up to the drain timeout. The server's drain calls it only
after its grace (`server.ModelServer.stop`), during which the REST API answers with
``Connection: close``.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import socket
import sys
import threading
import time
from http import HTTPStatus
from typing import Optional

log = logging.getLogger("tfrs_logq.serving")

_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*([^\r\n]*)")

UVICORN_CHECKED = "0.54"  # the uvicorn minor version the H11Protocol overrides were read in
FIRST_REQUEST_WAIT_S = 1.0  # at shutdown: how long a new connection may take to send its request


class _Shutdown:
    """Shared by a server's connections: set once its shutdown has begun."""

    def __init__(self) -> None:
        self.begun = False


def _reply(status: int, message: str) -> bytes:
    """A complete HTTP/1.1 reply with a JSON error body that closes the connection."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


def _protocol_class(head_timeout_s: float, shutdown: _Shutdown):
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class JsonH11Protocol(H11Protocol):
        """uvicorn's h11 protocol with JSON refusals, a request-head timeout, and a
        shutdown that lets a new connection's first request arrive."""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head = b""  # the start of the request being received (for messages)
            self._head_timer = None
            self._head_limit_s = head_timeout_s  # the deadline the head timer counts
            self._answered = 0  # replies sent on this connection
            if shutdown.begun:  # accepted from the backlog as the listener closed
                self._await_first_request()
            else:
                self._arm_head_timer()

        def shutdown(self) -> None:
            """uvicorn closes every connection without a request under way; one that
            never carried a request, or is receiving one, may have it on its way:
            it gets `FIRST_REQUEST_WAIT_S` to arrive, then is answered and closed."""
            if self._waiting_for_head() and (self._answered == 0 or self._head):
                self._await_first_request()
                return
            super().shutdown()

        def _await_first_request(self) -> None:
            self._cancel_head_timer()
            self._head_limit_s = min(head_timeout_s, FIRST_REQUEST_WAIT_S)
            self._head_timer = self.loop.call_later(self._head_limit_s, self._head_timed_out)

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_head_timer(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or not self._waiting_for_head():
                return
            if self._head and shutdown.begun and self._head_limit_s < head_timeout_s:
                # the shutdown's wait, not rest_api_timeout_in_ms, ran out: say which
                self.transport.write(_reply(
                    503, f"the server is shutting down: the rest of this request's line and "
                         f"headers did not arrive within the {self._head_limit_s:g} s it "
                         "waits for a request on its way; send it again"))
            elif self._head:  # a partial request: say why it is dropped
                self.transport.write(_reply(408, f"the request line and headers did not "
                                                 f"arrive within {head_timeout_s:g} s "
                                                 "(rest_api_timeout_in_ms)"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._waiting_for_head():
                self._head = (self._head + data)[:16384]
            super().data_received(data)
            if self._waiting_for_head():
                # between requests, or discarding a refused body: bounded too
                self._unset_keepalive_if_required()
                self._arm_head_timer()
            else:
                self._head = b""
                self._cancel_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # arms uvicorn's keep-alive (idle) timer
            self._answered += 1
            self._head = b""
            self._cancel_head_timer()

        def connection_lost(self, exc) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def eof_received(self):
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return None  # idle: close
            # The client half-closed with a request under way: what it sent is all of
            # it (a short body is reported by the REST API); keep the socket to reply.
            cycle.keep_alive = False
            if cycle.more_body:
                cycle.more_body = False
                cycle.message_event.set()
            return True

        def send_400_response(self, msg: str) -> None:
            """The parser refused the request (uvicorn calls this in its except block)."""
            exc = sys.exc_info()[1]
            reason = str(exc) if exc is not None else msg
            if "content-length" in reason.lower():
                values = [v.decode("latin-1").strip()[:40]
                          for v in _CONTENT_LENGTH.findall(self._head)]
                reason += f" ({', '.join(map(repr, values))}: Content-Length must be one " \
                          "non-negative integer)"
            self.transport.write(_reply(400, f"malformed HTTP request: {reason}"))
            self.transport.close()

    return JsonH11Protocol


def bind_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on ``host:port`` (SO_REUSEADDR, not SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR lets a restart bind while old connections linger in TIME_WAIT; on
        # Linux it does not let a second server listen on the port (SO_REUSEPORT would).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def bind_error(what: str, option: str, host: str, port: int, reason) -> OSError:
    """An OSError that says which port could not be bound, and why if it can tell."""
    code = getattr(reason, "errno", None)
    if code is None and port:
        # grpc does not say why; binding a plain socket does.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host.strip("[]"), port))
            except OSError as exc:
                code, reason = exc.errno, exc
    if code == errno.EADDRINUSE:
        return OSError(errno.EADDRINUSE,
                       f"{what} port {port} is already in use on {host} ({option}={port}): "
                       "another server holds it; stop that one or choose another port "
                       "(0 picks a free one)")
    detail = getattr(reason, "strerror", None) or reason or "unknown reason"
    return OSError(code or errno.EADDRNOTAVAIL,
                   f"cannot bind the {what} server to {host}:{port} ({option}={port}): {detail}")


class HttpServer:
    """An ASGI app served by uvicorn on a socket bound at construction.

    Args:
        host: str. The address to listen on.
        port: int. 0 picks a free one (`port` says which).
        head_timeout_s: float. Longest a client may take to send a request's line and
            headers (and longest an idle connection with a partial request lives).
        idle_timeout_s: float. How long an idle keep-alive connection stays open.
    """

    def __init__(self, host: str, port: int, head_timeout_s: float,
                 idle_timeout_s: float = 60.0, backlog: int = 1024) -> None:
        try:
            self.socket = bind_socket(host, port, backlog)
        except OSError as exc:
            raise bind_error("REST", "rest_api_port", host, port, exc) from None
        self.port = self.socket.getsockname()[1]
        self.head_timeout_s, self.idle_timeout_s, self.backlog = \
            head_timeout_s, idle_timeout_s, backlog
        self._server = None
        self._thread: Optional[threading.Thread] = None
        self._shutdown = _Shutdown()

    def start(self, app) -> None:
        import uvicorn

        config = uvicorn.Config(
            app, http=_protocol_class(self.head_timeout_s, self._shutdown), lifespan="off",
            log_config=None, log_level=logging.ERROR, access_log=False,
            timeout_keep_alive=int(max(1, self.idle_timeout_s)), backlog=self.backlog,
            proxy_headers=False, server_header=False, date_header=False,
            timeout_graceful_shutdown=None)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self.socket]},
                                        name="tfrs-logq-rest-loop", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and self._thread.is_alive() and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("the REST server did not start")

    def stop(self, drain_timeout_s: float) -> None:
        """Stops accepting and closes idle keep-alive connections; requests in flight
        (and first requests on their way, `FIRST_REQUEST_WAIT_S`) finish within
        ``drain_timeout_s``, then are cut."""
        if self._server is None:
            self.socket.close()
            return
        self._shutdown.begun = True
        try:
            # A backlog of 0: from now on a new SYN is dropped (its client retries it,
            # and is then refused by the closed port) instead of completing into the
            # accept queue, where closing the listener would reset it. What is queued
            # now is still accepted and served (Connection: close) until it closes.
            self.socket.listen(0)
        except OSError:
            pass
        self._server.config.timeout_graceful_shutdown = drain_timeout_s
        self._server.should_exit = True
        self._thread.join(drain_timeout_s + 10)


__all__ = ["FIRST_REQUEST_WAIT_S", "UVICORN_CHECKED", "HttpServer", "bind_error",
           "bind_socket"]
