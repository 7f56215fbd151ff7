"""Health as platforms call it: the standard gRPC health service over the model manager.

``grpc.health.v1.Health/Check`` and ``/Watch`` (grpcio-health-checking's servicer, as
Kubernetes' gRPC probes, Envoy and grpc-health-probe call it) answer ``SERVING`` only
while a version is loaded and the server is not draining, and ``NOT_SERVING`` before the
first version loads and from the first moment of a shutdown (with REST's ``/readyz``
and the KServe V2 ``/v2/health/ready``). The status is set for the server as a whole
(service ``""``) and for each of its services, ``tensorflow.serving.PredictionService``
and ``tensorflow.serving.ModelService``; it follows the manager (`ModelManager.add_listener`),
so a ``Watch`` stream hears every change. The REST side of health (``/livez``,
``/readyz``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/NAME/ready``) is in
`rest_api`.
"""

from __future__ import annotations

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


class GrpcHealth:
    """The gRPC health servicer, kept in step with ``manager``'s readiness.

    Args:
        manager: `ModelManager`. ``ready()`` is what SERVING means.
    """

    def __init__(self, manager: ModelManager) -> None:
        health, self._pb2, self._grpc = _health_modules()
        self.manager = manager
        self.servicer = health.HealthServicer()
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


__all__ = ["SERVICES", "GrpcHealth"]
