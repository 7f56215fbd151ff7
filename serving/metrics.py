"""Prometheus metrics of one server, at TF Serving's path ``/monitoring/prometheus/metrics``.

Each `ModelServer` has its own `ServerMetrics` and its own
``prometheus_client.CollectorRegistry`` (not the process-wide one), so several servers,
in tests or in one process, count apart. Every label takes a bounded set of values,
never request data: ``protocol`` (``grpc``, ``rest``), ``method`` (the route or RPC:
``predict``, ``metadata``, ``status``, ``live``, ``ready``, ``model_ready``,
``metrics``, ``unmatched``), ``signature`` (a signature of the served version, ``""``
for calls that name none, ``unknown`` for any other name a client sent), ``status``
(a canonical code: ``OK``, ``INVALID_ARGUMENT``, ...; `errors.STATUS`), ``model`` (the
server's one ``--model_name``), ``state`` (TF Serving's version states), ``kind`` (the
index) and ``k`` (the ks the export measured recall at: two at most).

Metrics (``tfrs_logq_`` prefix):

- ``requests_total{protocol, method, signature, status}``: requests answered; errors
  are those whose status is not ``OK``;
- ``request_latency_seconds{protocol, method, signature}``: a histogram, from the
  request's arrival at its front end to its reply;
- ``batch_size{signature}`` (rows a batched model call ran) and
  ``batch_queue_wait_seconds{signature}`` (a request's wait for its batch), histograms;
- ``model_versions{model, state}``: versions by state (``AVAILABLE``, ``UNLOADING``,
  ``END``), and ``served_version{model}``: the version served (absent before one is);
- ``index_info{model, kind}`` (1 for the served version's index kind) and
  ``index_recall{model, kind, k}``: the recall@k its export measured against exact search;
- ``requests_in_flight{protocol}``: requests a front end holds now (`drain.InFlight`: a
  REST request from its head's arrival, the scrape itself included; a gRPC call from the
  moment it reached a worker), read at each scrape.

A scrape runs on the REST server's event loop, not on the workers that run the model, so
it is answered while every worker is busy (tested).
"""

from __future__ import annotations

from typing import Optional

from tfrs_logq.serving.errors import STATUS

PATH = "/monitoring/prometheus/metrics"  # TF Serving's --monitoring_config_file path
METHODS = ("predict", "metadata", "status", "live", "ready", "model_ready", "metrics",
           "unmatched")
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_HTTP_CODES = {http: code for code, http in reversed(list(STATUS.items()))}


class ServerMetrics:
    """One server's counters and histograms, in a registry of its own (``.registry``).

    Args:
        model_name: str. The server's ``--model_name`` (the ``model`` label).
    """

    def __init__(self, model_name: str) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram
        except ImportError as exc:
            raise ImportError(
                f"tfrs-logq serve needs prometheus-client ({exc}): install the serving extra, "
                "pip install -e \".[serving]\" (or pip install 'tfrs-logq[serving]')") from exc

        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self._manager = None
        self._in_flight: dict = {}
        self.requests = Counter(
            "tfrs_logq_requests", "Requests answered, by protocol, method, signature and "
            "status (errors: status other than OK).",
            ["protocol", "method", "signature", "status"], registry=self.registry)
        self.latency = Histogram(
            "tfrs_logq_request_latency_seconds", "Time from a request's arrival to its reply.",
            ["protocol", "method", "signature"], buckets=LATENCY_BUCKETS,
            registry=self.registry)
        self.batch_size = Histogram(
            "tfrs_logq_batch_size", "Rows in one batched model call.", ["signature"],
            buckets=BATCH_BUCKETS, registry=self.registry)
        self.queue_wait = Histogram(
            "tfrs_logq_batch_queue_wait_seconds", "A request's wait in the queue for its batch.",
            ["signature"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_ModelCollector(self))

    def watch(self, manager) -> None:
        """Reads versions and the index from ``manager`` (a `ModelManager`) at each scrape."""
        self._manager = manager

    def watch_in_flight(self, counts: dict) -> None:
        """Reads ``requests_in_flight`` from ``counts`` (``{protocol: drain.InFlight}``)
        at each scrape."""
        self._in_flight = dict(counts)

    def signature_label(self, name: Optional[str], servable=None) -> str:
        """``name`` if the served version has that signature (``""`` means the default),
        ``""`` for a call without one, else ``unknown``: a client's text never becomes a
        label value."""
        if name is None:
            return ""
        if name == "":
            return "serving_default"
        if servable is None and self._manager is not None:
            servable = self._manager.current()
        known = getattr(servable, "signatures", None) or {}
        return name if name in known else "unknown"

    def observe_request(self, protocol: str, method: str, signature: str, status: str,
                        seconds: float) -> None:
        method = method if method in METHODS else "unmatched"
        status = status if status in STATUS or status in ("OK", "CANCELLED") else "UNKNOWN"
        self.requests.labels(protocol, method, signature, status).inc()
        self.latency.labels(protocol, method, signature).observe(seconds)

    def observe_batch(self, signature: str, rows: int, waits: list) -> None:
        """`batching.Batcher`'s ``observe``: one batched call and its requests' waits."""
        label = self.signature_label(signature)
        self.batch_size.labels(label).observe(rows)
        for wait in waits:
            self.queue_wait.labels(label).observe(max(0.0, wait))

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of every metric, and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def status_of_http(code: int) -> str:
    """The canonical status of an HTTP reply that carried no `ServingError`."""
    return "OK" if code < 400 else _HTTP_CODES.get(code, "UNKNOWN")


class _ModelCollector:
    """Versions and the served index, read from the manager when scraped."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []  # read at collect time only: the manager may not exist yet

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        model = self.metrics.model_name
        versions = GaugeMetricFamily("tfrs_logq_model_versions",
                                     "Versions of the model by state.", labels=["model", "state"])
        served = GaugeMetricFamily("tfrs_logq_served_version", "The version being served.",
                                   labels=["model"])
        info = GaugeMetricFamily("tfrs_logq_index_info",
                                 "1 for the index kind of the version served.",
                                 labels=["model", "kind"])
        recall = GaugeMetricFamily(
            "tfrs_logq_index_recall", "recall@k of the served version's index against exact "
            "search, measured at export (held-out queries).", labels=["model", "kind", "k"])
        in_flight = GaugeMetricFamily("tfrs_logq_requests_in_flight",
                                      "Requests a front end holds now.", labels=["protocol"])
        for protocol, counter in sorted(self.metrics._in_flight.items()):
            in_flight.add_metric([protocol], counter.now)
        manager = self.metrics._manager
        if manager is not None:
            counts = {"AVAILABLE": 0, "UNLOADING": 0, "END": 0}
            for status in manager.statuses():
                counts[status.state] = counts.get(status.state, 0) + 1
            for state, count in counts.items():
                versions.add_metric([model, state], count)
            servable = manager.current()
            if servable is not None:
                served.add_metric([model], servable.version)
                kind = str(servable.meta.get("index") or "unknown")
                info.add_metric([model, kind], 1)
                for k, value in servable.measured_recall().items():
                    recall.add_metric([model, kind, k], value)
        yield from (versions, served, info, recall, in_flight)


__all__ = ["BATCH_BUCKETS", "LATENCY_BUCKETS", "METHODS", "PATH", "ServerMetrics",
           "status_of_http"]
