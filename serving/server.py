"""`tfrs-logq serve`: a model server that speaks TensorFlow Serving's protocols.

gRPC: ``tensorflow.serving.PredictionService/Predict``, ``/GetModelMetadata`` and
``tensorflow.serving.ModelService/GetModelStatus``, with the official
``tensorflow-serving-api`` messages, so existing TF Serving clients work unchanged.
REST: ``POST /v1/models/NAME[/versions/V]:predict`` ("instances" and "inputs"
forms), ``GET /v1/models/NAME[/versions/V]`` and ``.../metadata``, with TF
Serving's JSON shapes and ``{"error": "..."}`` bodies. Health: gRPC's standard
``grpc.health.v1.Health`` and KServe V2's ``/v2/health/live``, ``/v2/health/ready`` and
``/v2/models/NAME/ready`` beside ``/livez`` and ``/readyz``; Prometheus metrics at TF
Serving's ``/monitoring/prometheus/metrics``.

`ModelServer` is composition only, one concept a module as in TF Serving's
``model_servers/``:

- ``options``: `ServerOptions` (the flags, checked);
- ``manager``: the version manager (newest loadable version, swaps, load errors);
- ``servable``, ``inputs``, ``batching``: one loaded version, its input rules, batching;
- ``grpc_service``: the gRPC services; ``rest_api``: the REST routes (Starlette);
  ``http_server``: the HTTP/1.1 server under them (uvicorn);
- ``errors``: the status table both protocols answer with; ``drain``: requests in flight;
- ``health``: the gRPC health service; ``metrics``: the Prometheus metrics (a registry
  per server);
- ``faiss_index``: the approximate index searched outside the SavedModel (faiss exports).

Both ports are bound before the model loads, so a port in use fails at once. On
SIGTERM or SIGINT (`ModelServer.serve_until_signal`) the server drains, in this order:

1. readiness fails: ``GET /readyz`` (and ``/v2/health/ready``) answers 503, the gRPC
   health service says NOT_SERVING, the model status reports the served version
   ``UNLOADING`` (REST and gRPC), and every REST reply from now on carries
   ``Connection: close``;
2. for ``drain_grace_in_ms`` both ports still accept and serve, so requests already
   sent (on a keep-alive connection, in the listen backlog, in transit) are answered,
   and keep-alive clients learn to reconnect, not to write into a closing socket;
3. both ports close: new gRPC calls get UNAVAILABLE, new REST connections are
   refused, idle keep-alive connections are closed, gRPC health ``Watch`` streams end
   (status OK, after their NOT_SERVING);
4. requests in flight finish (all of it within ``drain_timeout_in_ms``; what still runs
   then is cut), and one line is logged saying how many were drained.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from typing import Optional

from tfrs_logq.serving.drain import InFlight
from tfrs_logq.serving.errors import ServingError
from tfrs_logq.serving.grpc_service import add_services, bind_grpc, build_grpc_server
from tfrs_logq.serving.http_server import HttpServer, bind_error
from tfrs_logq.serving.inputs import check_inputs  # noqa: F401  (re-exported)
from tfrs_logq.serving.manager import ModelManager, VersionStatus
from tfrs_logq.serving.metrics import ServerMetrics
from tfrs_logq.serving.options import ServerOptions
from tfrs_logq.serving.rest_api import RestApi
from tfrs_logq.serving.servable import Servable, read_signature_defs

log = logging.getLogger("tfrs_logq.serving")


class ModelServer:
    """The gRPC and REST front ends over one `ModelManager`.

    Args:
        options: `ServerOptions`.

    Example:

        server = ModelServer(ServerOptions("ml", "/models/ml", port=0, rest_api_port=0))
        server.start()          # server.port, server.rest_port: the bound ports
        server.serve_until_signal()   # or server.stop() from another thread
    """

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.grpc_in_flight, self.rest_in_flight = InFlight(), InFlight()
        self.grpc_server = build_grpc_server(options)
        self.manager: Optional[ModelManager] = None
        self.http: Optional[HttpServer] = None
        self.rest_api: Optional[RestApi] = None
        self._grpc_bound = self._started = False
        self._stopped: Optional[dict] = None
        self._stop_lock = threading.Lock()
        try:
            # REST first: a plain socket closes cleanly if the gRPC port is taken, while
            # grpc only lets go of a bound port once its server has started.
            self.http = HttpServer(options.host, options.rest_api_port,
                                   head_timeout_s=options.rest_api_timeout_in_ms / 1000)
            self.rest_port = self.http.port
            self.port = bind_grpc(self.grpc_server, options.host, options.port)
            self._grpc_bound = True
            # One registry per server (not prometheus_client's global one).
            self.metrics = ServerMetrics(options.model_name)
            self.manager = ModelManager(options, load=functools.partial(
                Servable, metrics=self.metrics))
            self.metrics.watch(self.manager)
            self.metrics.watch_in_flight({"rest": self.rest_in_flight,
                                          "grpc": self.grpc_in_flight})
            self.health = add_services(self.grpc_server, self.manager, self.grpc_in_flight,
                                       self.metrics)
            self.rest_api = RestApi(self.manager, options, self.rest_in_flight, self.metrics)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        """Frees what a failed ``__init__`` took: the watcher, both ports."""
        if self.manager is not None:
            self.manager.stop()
        if self.http is not None:
            self.http.stop(0)
        if self.rest_api is not None:
            self.rest_api.close()
        if self._grpc_bound:
            self.grpc_server.start()
        self.grpc_server.stop(None).wait(5)

    def start(self) -> "ModelServer":
        self.grpc_server.start()
        self.http.start(self.rest_api.app)
        self._started = True
        return self

    def stop(self, drain_timeout_s: Optional[float] = None, reason: str = "stop") -> dict:
        """Graceful shutdown (the module's docstring gives its steps): readiness fails,
        the grace (``drain_grace_in_ms``), both front ends stop accepting, requests in
        flight finish (all within ``drain_timeout_s``, default ``drain_timeout_in_ms``),
        then the versions unload. Logs one line; returns what it did::

            {"drained": {"rest": R, "grpc": G}, "cut": C, "seconds": S}

        ``drained`` counts the requests that finished during the drain, ``cut`` those
        still running at its timeout. A second call returns the first call's result.
        """
        with self._stop_lock:
            if self._stopped is not None:
                return self._stopped
            timeout = self.options.drain_timeout_in_ms / 1000 if drain_timeout_s is None \
                else drain_timeout_s
            start = time.monotonic()
            self.rest_in_flight.mark()
            self.grpc_in_flight.mark()
            # 1. Readiness fails, REST replies say Connection: close; both ports serve on.
            self.manager.begin_drain()
            self.rest_api.drain_timeout_s = timeout
            self.rest_api.draining = True
            grace = min(self.options.drain_grace_in_ms / 1000, timeout)
            log.info("%s: draining: not ready; the ports close in %.2f s", reason, grace)
            time.sleep(grace)
            # 2. The ports close (gRPC refuses new calls, idle REST connections close);
            #    requests in flight finish within what is left of the timeout.
            left = max(0.0, timeout - (time.monotonic() - start))
            self.health.end_watches()  # after their NOT_SERVING: they never end on their own
            grpc_done = self.grpc_server.stop(grace=left)
            self.http.stop(left)  # returns when REST has drained (or timed out)
            grpc_done.wait(max(0.0, timeout - (time.monotonic() - start)) + 1.0)
            self.rest_api.close()
            self.manager.stop()
            rest, grpc = self.rest_in_flight, self.grpc_in_flight
            result = {"drained": {"rest": rest.drained, "grpc": grpc.drained},
                      "cut": rest.cut + grpc.cut + rest.now + grpc.now,
                      "seconds": time.monotonic() - start}
            cut = f"; {result['cut']} cut at drain_timeout_in_ms={timeout * 1000:g}" \
                if result["cut"] else ""
            log.info("%s: stopped accepting, drained %d request(s) in flight (REST %d, "
                     "gRPC %d) in %.2f s%s; exiting", reason, rest.drained + grpc.drained,
                     rest.drained, grpc.drained, result["seconds"], cut)
            self._stopped = result
            return result

    def serve_until_signal(self, signals=(signal.SIGTERM, signal.SIGINT)) -> dict:
        """Serves until one of ``signals`` arrives, then `stop`s (main thread only)."""
        received: list = []
        arrived = threading.Event()

        def handler(signum, frame):
            received.append(signum)
            arrived.set()

        previous = {s: signal.signal(s, handler) for s in signals}
        try:
            while not arrived.wait(0.5):
                pass
        finally:
            for s, old in previous.items():
                signal.signal(s, old)
        return self.stop(reason=f"received {signal.Signals(received[0]).name}")

    def wait(self) -> None:
        self.grpc_server.wait_for_termination()


__all__ = ["ModelManager", "ModelServer", "Servable", "ServerMetrics", "ServerOptions",
           "ServingError",
           "VersionStatus", "bind_error", "check_inputs", "read_signature_defs"]
