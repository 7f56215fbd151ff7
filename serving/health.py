"""Health as platforms call it: the standard gRPC health service over the model manager.

``grpc.health.v1.Health/Check`` and ``/Watch`` (grpcio-health-checking's servicer, as
Kubernetes' gRPC probes, Envoy and grpc-health-probe call it) answer ``SERVING`` only
while a version is loaded and the server is not draining, and ``NOT_SERVING`` before the
first version loads and from the first moment of a shutdown (with REST's ``/readyz``
and the KServe V2 ``/v2/health/ready``). The status is set for the server as a whole
(service ``""``) and for each of its services, ``tensorflow.serving.PredictionService``
and ``tensorflow.serving.ModelService``; it follows the manager (`ModelManager.add_listener`),
so a ``Watch`` stream hears every change. When the drain closes the ports, every
``Watch`` stream ends with status OK after its NOT_SERVING (`GrpcHealth.end_watches`): a
stream never ends on its own, and one left open would hold the shutdown for the whole
``drain_timeout_in_ms`` and then be cut. The REST side of health (``/livez``,
``/readyz``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/NAME/ready``) is in
`rest_api`.
"""

from __future__ import annotations

import functools
import threading

from tfrs_logq.serving.manager import ModelManager

SERVICES = ("", "tensorflow.serving.PredictionService", "tensorflow.serving.ModelService")


def _health_modules():
    try:
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    except ImportError as exc:
        raise ImportError(
            f"tfrs-logq serve needs grpcio-health-checking ({exc}): install the serving "
            "extra, pip install -e \".[serving]\" (or pip install 'tfrs-logq[serving]')"
        ) from exc
    return health, health_pb2, health_pb2_grpc


class _Stream:
    """One ``Watch`` stream's ``send_response_callback``, which ``None`` ends once: later
    calls (a status set after the end, the servicer's own close) are ignored."""

    def __init__(self, send) -> None:
        self._send, self._lock, self.ended = send, threading.Lock(), False

    def __call__(self, response) -> None:
        with self._lock:
            if self.ended:
                return
            self.ended = response is None
            self._send(response)


@functools.lru_cache(maxsize=None)
def _servicer_class():
    """grpcio-health-checking's ``HealthServicer``, with ``Watch`` streams that
    `end_watches` can end."""
    health, health_pb2, _ = _health_modules()

    class Servicer(health.HealthServicer):
        def __init__(self) -> None:
            self._streams: set = set()
            self._streams_lock = threading.Lock()
            self._ended = False
            super().__init__()  # marks this Watch non-blocking: no worker per stream

        def Watch(self, request, context, send_response_callback=None):  # noqa: N802
            if send_response_callback is None:  # a server that streams from an iterator
                return super().Watch(request, context)
            stream = _Stream(send_response_callback)
            with self._streams_lock:  # never held while a status is sent
                ended = self._ended
                if not ended:
                    self._streams.add(stream)
            if ended:
                stream(health_pb2.HealthCheckResponse(
                    status=health_pb2.HealthCheckResponse.NOT_SERVING))
                stream(None)
                return None
            context.add_callback(functools.partial(self._forget, stream))
            # (ended by end_watches from here on, the stream ignores what follows)
            return super().Watch(request, context, stream)

        def _forget(self, stream) -> None:  # the stream ended (the client left)
            with self._streams_lock:
                self._streams.discard(stream)

        def end_watches(self) -> int:
            with self._streams_lock:
                self._ended = True
                streams, self._streams = list(self._streams), set()
            for stream in streams:
                stream(None)
            return len(streams)

    return Servicer


class GrpcHealth:
    """The gRPC health servicer, kept in step with ``manager``'s readiness.

    Args:
        manager: `ModelManager`. ``ready()`` is what SERVING means.
    """

    def __init__(self, manager: ModelManager) -> None:
        _, self._pb2, self._grpc = _health_modules()
        self.manager = manager
        self.servicer = _servicer_class()()
        manager.add_listener(self.update)

    def add_to(self, server) -> None:
        self._grpc.add_HealthServicer_to_server(self.servicer, server)

    def update(self) -> None:
        """Sets every service SERVING when a version is served and no drain began, else
        NOT_SERVING."""
        states = self._pb2.HealthCheckResponse
        status = states.SERVING if self.manager.ready() else states.NOT_SERVING
        for service in SERVICES:
            self.servicer.set(service, status)

    def end_watches(self) -> int:
        """Ends every ``Watch`` stream with status OK, and answers a later ``Watch`` with
        NOT_SERVING and its end (the drain, as the ports close); returns how many ended."""
        return self.servicer.end_watches()


__all__ = ["SERVICES", "GrpcHealth"]
