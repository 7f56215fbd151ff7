"""The REST API: TF Serving's ``/v1/models`` routes as a Starlette (ASGI) application.

``POST /v1/models/NAME[/versions/V]:predict`` ("instances" and "inputs" forms),
``GET /v1/models/NAME[/versions/V]`` (status) and ``.../metadata``, with TF Serving's
JSON shapes (its ``http_rest_api_handler``), and ``GET /livez`` and ``/readyz`` (503
once a shutdown has begun, or before a version loads), the KServe V2 health routes
(``GET /v2/health/live``, ``/v2/health/ready``, ``/v2/models/NAME[/versions/V]/ready``,
the same readiness) and TF Serving's ``GET /monitoring/prometheus/metrics`` (`metrics`,
Prometheus' text format). Every other reply is JSON, refusals included:
``{"error": "..."}`` with the status `errors.STATUS` gives. While the server drains
(`RestApi.draining`) every reply carries ``Connection: close``. The body is read on the
event loop, bounded in size (``max_request_bytes``, 413, refused from its
Content-Length before it is read) and in time (``rest_api_timeout_in_ms``, 408); the
JSON decoding, the model call and the encoding run on ``rest_api_num_threads`` workers.
A JSON input's shape is checked before it becomes an array, a reply over
``max_response_bytes`` is refused.
The HTTP/1.1 server under it is `http_server.HttpServer` (uvicorn).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.serving.drain import InFlight
from tfrs_logq.serving.errors import ServingError, shorten
from tfrs_logq.serving.inputs import check_shape
from tfrs_logq.serving.manager import INT64_MAX, ModelManager
from tfrs_logq.serving.metrics import PATH as metrics_path
from tfrs_logq.serving.metrics import ServerMetrics, status_of_http
from tfrs_logq.serving.options import ServerOptions

log = logging.getLogger("tfrs_logq.serving")

ALLOWED_METHODS = "GET, HEAD, POST"
_HTTP_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"}


def json_response(status: int, body: dict, headers: Optional[dict] = None):
    from starlette.responses import Response

    # json.dumps as is (Starlette's JSONResponse refuses NaN, and scores may hold -inf)
    return Response(json.dumps(body).encode(), status_code=status, headers=headers,
                    media_type="application/json")


def error_response(exc: ServingError, headers: Optional[dict] = None):
    response = json_response(exc.http_status, {"error": str(exc)}, headers)
    response.canonical_status = exc.code  # the metrics' status label
    return response


def _register_segment() -> None:
    """The route parameter type ``segment``: one path segment without ``:`` (a model
    name or a version, before ``:predict``)."""
    from starlette.convertors import Convertor, register_url_convertor

    class Segment(Convertor):
        regex = "[^/:]+"

        def convert(self, value: str) -> str:
            return value

        def to_string(self, value: str) -> str:
            return value

    register_url_convertor("segment", Segment())


class RestApi:
    """The Starlette app over a `ModelManager` (``.app``), counting requests in flight.

    Args:
        manager: `ModelManager`. Resolves model names and versions.
        options: `ServerOptions`. ``max_request_bytes``, ``rest_api_timeout_in_ms``,
            ``rest_api_num_threads``.
        in_flight: `InFlight`. Counts this protocol's requests (for the drain).
        metrics: `ServerMetrics`. What ``/monitoring/prometheus/metrics`` shows and where
            each request is counted. Defaults to a registry of this API's own.
    """

    def __init__(self, manager: ModelManager, options: ServerOptions,
                 in_flight: Optional[InFlight] = None,
                 metrics: Optional[ServerMetrics] = None) -> None:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        _register_segment()
        self.manager, self.options = manager, options
        self.in_flight = in_flight or InFlight()
        if metrics is None:
            metrics = ServerMetrics(options.model_name)
            metrics.watch(manager)
        self.metrics = metrics
        self.draining = False  # set by the server's shutdown: replies say Connection: close
        self.drain_timeout_s: Optional[float] = None  # the shutdown's deadline, once begun
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=options.rest_api_num_threads, thread_name_prefix="tfrs-logq-rest")
        # A model name or version has no ":" (TF Serving's rule), so GET NAME:predict is
        # the predict route with the wrong method (405), not the status of "NAME:predict".
        base = "/v1/models/{name:segment}"
        version = base + "/versions/{version:segment}"
        routes = [Route(base + ":predict", self._endpoint(self.predict), methods=["POST"]),
                  Route(version + ":predict", self._endpoint(self.predict), methods=["POST"])]
        for path in (base, version):
            routes.append(Route(path, self._endpoint(self.status), methods=["GET"]))
            routes.append(Route(path + "/metadata", self._endpoint(self.metadata),
                                methods=["GET"]))
        routes.append(Route("/livez", self._endpoint(self.live), methods=["GET"]))
        routes.append(Route("/readyz", self._endpoint(self.ready), methods=["GET"]))
        # KServe's V2 (Open Inference Protocol) health routes, beside TF Serving's.
        routes.append(Route("/v2/health/live", self._endpoint(self.live, "live"),
                            methods=["GET"]))
        routes.append(Route("/v2/health/ready", self._endpoint(self.ready, "ready"),
                            methods=["GET"]))
        v2_model = "/v2/models/{name:segment}"
        for path in (v2_model + "/ready", v2_model + "/versions/{version:segment}/ready"):
            routes.append(Route(path, self._endpoint(self.model_ready), methods=["GET"]))
        routes.append(Route(metrics_path, self._endpoint(self.prometheus, "metrics"),
                            methods=["GET"]))
        self.app = self._closing_while_draining(
            Starlette(routes=routes, exception_handlers={HTTPException: self._http_exception}))

    def _closing_while_draining(self, app):
        """``app`` whose replies say ``Connection: close`` once the drain has begun, so
        a keep-alive client opens a new connection for its next request instead of
        writing it into one the server is about to close."""

        async def closing(scope, receive, send):
            async def send_closing(message):
                if message["type"] == "http.response.start" and self.draining:
                    headers = [(k, v) for k, v in message.get("headers", [])
                               if k.lower() != b"connection"]
                    message = {**message, "headers": headers + [(b"connection", b"close")]}
                await send(message)

            await app(scope, receive, send_closing)

        return closing

    # -- plumbing ----------------------------------------------------------------

    def _endpoint(self, handler, method: Optional[str] = None):
        """Counts the request in flight and in the metrics (``method``: its label, the
        handler's name by default); a `ServingError` or a bug becomes a JSON reply."""
        method = method or handler.__name__

        @functools.wraps(handler)
        async def endpoint(request):
            start = time.perf_counter()
            request.state.signature = None  # predict: the signature the body names
            response = await self._answer(handler, request)
            status = getattr(response, "canonical_status", None) or \
                status_of_http(response.status_code)
            self.metrics.observe_request("rest", method, self.metrics.signature_label(
                request.state.signature), status, time.perf_counter() - start)
            return response

        return endpoint

    async def _answer(self, handler, request):
        with self.in_flight.track() as tracked:
            try:
                return await handler(request)
            except asyncio.CancelledError:  # the drain timed out: say so if we still can
                tracked.cut = True
                took = "" if self.drain_timeout_s is None else \
                    f" within the {self.drain_timeout_s:g} s its shutdown gives requests"
                return error_response(ServingError(
                    "UNAVAILABLE", f"the server shut down before this request finished"
                                   f"{took} (drain_timeout_in_ms); send it again"),
                    {"Connection": "close"})
            except ServingError as exc:
                # A body that did not arrive in time leaves the framing unknown.
                return error_response(exc, {"Connection": "close"}
                                      if exc.code == "REQUEST_TIMEOUT" else None)
            except Exception as exc:  # a bug answers 500; the server keeps going
                log.exception("REST %s %s failed", request.method, request.url.path)
                return json_response(500, {"error": f"internal error: "
                                                    f"{type(exc).__name__}: {exc}"})

    async def _http_exception(self, request, exc):
        """Starlette's own refusals (no route, a method the route does not take) as JSON,
        counted in the metrics as ``unmatched``."""
        response = self._refusal(request, exc)
        self.metrics.observe_request("rest", "unmatched", "", getattr(
            response, "canonical_status", None) or status_of_http(response.status_code), 0.0)
        return response

    def _refusal(self, request, exc):
        method, path = request.method, request.url.path
        if exc.status_code == 405:
            method, path = method[:32], shorten(path)
            if method not in _HTTP_METHODS:
                return error_response(ServingError(
                    "NOT_IMPLEMENTED", f"method {method} is not supported; this server answers "
                                       f"{ALLOWED_METHODS}"), {"Allow": ALLOWED_METHODS})
            # the route's own methods (Starlette's Allow header), in a stable order
            allowed = ", ".join(sorted(m.strip() for m in (exc.headers or {}).get(
                "Allow", ALLOWED_METHODS).split(",")))
            return error_response(ServingError(
                "METHOD_NOT_ALLOWED", f"method {method} is not allowed on {path}: it answers "
                                      f"{allowed}"), {"Allow": allowed})
        if exc.status_code == 404:
            return error_response(ServingError(
                "NOT_FOUND", f"Malformed request: {method[:32]} {shorten(path)}"))
        return json_response(exc.status_code, {"error": str(exc.detail)}, exc.headers)

    async def _in_worker(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # -- routes ------------------------------------------------------------------

    @staticmethod
    def _version(request) -> Optional[int]:
        text = request.path_params.get("version")
        if text is None:
            return None
        if not (text.isascii() and text.isdigit() and len(text) <= 19 and
                int(text) <= INT64_MAX):
            raise ServingError("INVALID_ARGUMENT", f"Malformed version {shorten(text)}: "
                                                   f"versions are integers 0 to {INT64_MAX}")
        return int(text)

    async def live(self, request):
        return json_response(200, {"live": True})

    async def ready(self, request):
        """Readiness: 200 while a version is served; 503 before, and from the start of
        a shutdown (before the ports close), so a load balancer stops sending."""
        if self.manager.ready():
            return json_response(200, {"ready": True})
        why = "the server is shutting down" if self.manager.draining else \
            "no version is loaded"
        return json_response(503, {"ready": False, "error": why})

    async def model_ready(self, request):
        """KServe V2 model readiness: 200 ``{"name", "ready": true}`` while this model (and
        version, when named) is served and no shutdown began; 503 with ``ready: false``
        before a version loads or once draining; 404 for another model or version."""
        name, version = request.path_params["name"], self._version(request)
        if name != self.options.model_name or self.manager.current() is not None:
            self.manager.get(name, version)  # NOT_FOUND (404) for another name or version
        if self.manager.ready():
            return json_response(200, {"name": name, "ready": True})
        why = "the server is shutting down" if self.manager.draining else \
            "no version is loaded"
        return json_response(503, {"name": name, "ready": False, "error": why})

    async def prometheus(self, request):
        """Every metric of this server in Prometheus' text format (`metrics`)."""
        from starlette.responses import Response

        body, content_type = self.metrics.exposition()
        return Response(body, status_code=200, headers={"Content-Type": content_type})

    async def status(self, request):
        name = request.path_params["name"]
        versions = self.manager.status(name, self._version(request))
        return json_response(200, {"model_version_status": [
            {"version": str(v.version), "state": v.state,
             "status": {"error_code": v.error_code, "error_message": v.error_message}}
            for v in versions]})

    async def metadata(self, request):
        from google.protobuf import json_format

        name = request.path_params["name"]
        servable = self.manager.get(name, self._version(request))
        signatures = {k: json_format.MessageToDict(v)
                      for k, v in servable.signature_defs.items()}
        return json_response(200, {
            "model_spec": {"name": name, "signature_name": "",
                           "version": str(servable.version)},
            "metadata": {"signature_def": {"signature_def": signatures},
                         # Not TF Serving's: the index and its measured recall.
                         "index": servable.index_summary()}})

    async def predict(self, request):
        body = await self._read_body(request)
        name, version = request.path_params["name"], self._version(request)
        servable = self.manager.get(name, version)
        reply = await self._in_worker(_predict_encoded, servable, body,
                                      self.options.max_response_bytes, request.state)
        from starlette.responses import Response

        return Response(reply, status_code=200, media_type="application/json")

    async def _read_body(self, request) -> bytes:
        """The body, within ``max_request_bytes`` and ``rest_api_timeout_in_ms``."""
        limit = self.options.max_request_bytes
        headers = request.headers
        declared: Optional[int] = None
        if "content-length" in headers:  # the server checked its form (digits, one value)
            declared = int(headers["content-length"])
            if declared > limit:
                raise ServingError("RESOURCE_EXHAUSTED",
                                   f"request body of {declared} bytes exceeds the limit of "
                                   f"{limit} (max_request_bytes)")
        elif "transfer-encoding" not in headers:
            raise ServingError("INVALID_ARGUMENT", f"{request.method} needs a Content-Length "
                                                   "header: the body's size in bytes")
        timeout = self.options.rest_api_timeout_in_ms / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(request.receive(), deadline - loop.time())
            except asyncio.TimeoutError:
                raise ServingError("REQUEST_TIMEOUT",
                                   f"the request body did not arrive within {timeout:g} s "
                                   f"(rest_api_timeout_in_ms): {size} bytes came") from None
            if message["type"] == "http.disconnect":
                raise ServingError("INVALID_ARGUMENT", "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ServingError("RESOURCE_EXHAUSTED",
                                   f"request body of more than {limit} bytes exceeds the limit "
                                   f"of {limit} (max_request_bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        if declared is not None and size < declared:
            raise ServingError("INVALID_ARGUMENT", f"the body ended after {size} of the "
                                                   f"{declared} bytes of its Content-Length")
        return b"".join(chunks)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)  # the drain waited already


# ------------------------------------------------------------------ JSON <-> tensors


def _predict_encoded(servable, body: bytes, max_response_bytes: int, seen=None) -> bytes:
    """`_predict`, encoded as JSON and bounded (on a worker, as the rest); ``seen``: an
    object whose ``signature`` is set to the signature name the body gives."""
    reply = json.dumps(_predict(servable, body, seen)).encode()
    if len(reply) > max_response_bytes:
        raise ServingError("INVALID_ARGUMENT",
                           f"the reply would be {len(reply)} bytes, over {max_response_bytes} "
                           "(max_response_bytes): send fewer rows or a smaller k")
    return reply


def _predict(servable, body: bytes, seen=None) -> dict:
    """Runs on a worker: decode, check, run, encode (TF Serving's JSON forms)."""
    request = _decode_json(body)
    if not isinstance(request, dict):
        raise ServingError("INVALID_ARGUMENT", "JSON body must be an object")
    signature = request.get("signature_name", "")
    if not isinstance(signature, str):
        raise ServingError("INVALID_ARGUMENT", "'signature_name' must be a string")
    if seen is not None:
        seen.signature = signature
    if ("instances" in request) == ("inputs" in request):
        raise ServingError("INVALID_ARGUMENT", "JSON Value must have exactly one of "
                                               "'instances' or 'inputs'")
    row_format = "instances" in request
    inputs = json_inputs(servable, signature, request, row_format)
    checked = servable.validate(signature, inputs)
    outputs = servable.run(checked)
    if row_format:
        n = next(iter(outputs.values())).shape[0]
        return {"predictions": [{k: _jsonable(v[i]) for k, v in outputs.items()}
                                for i in range(n)]}
    return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}


def _decode_json(body: bytes):
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ServingError("INVALID_ARGUMENT",
                           f"the body is not valid UTF-8: byte 0x{body[exc.start]:02x} "
                           f"at offset {exc.start} ({exc.reason})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ServingError("INVALID_ARGUMENT", "JSON Parse error: arrays or objects "
                                               "nest too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of over 4300 digits
        raise ServingError("INVALID_ARGUMENT", f"JSON Parse error: {exc}") from None


def _jsonable(value: np.ndarray):
    if value.dtype.kind in ("S", "O"):
        return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else str(b),
                            otypes=[object])(value).tolist()
    return value.tolist()


def json_inputs(servable, signature: str, request: dict, row_format: bool) -> dict:
    """The request's inputs as arrays: a scalar input (``k``, ``exclude_history``) one
    value, the others rectangular lists of one JSON type each, their shape checked
    against the servable's limits before they become arrays (an unknown input stays
    None, for `Servable.validate` to refuse)."""
    specs = servable.input_specs(signature)
    scalars = {k for k, spec in specs.items() if spec.shape.rank == 0}
    input_names = sorted(specs)

    def array(rows, key):
        if key not in specs:
            return None
        return _rectangular(rows, key, specs[key], servable.limits)

    if row_format:
        instances = request["instances"]
        if not isinstance(instances, list) or not instances:
            raise ServingError("INVALID_ARGUMENT", "'instances' must be a non-empty list")
        if all(isinstance(x, dict) for x in instances):
            keys = set(instances[0])
            if any(set(x) != keys for x in instances):
                raise ServingError("INVALID_ARGUMENT", "every instance must have the same keys")
            inputs = {}
            for key in keys:
                values = [x[key] for x in instances]
                if key in scalars:  # one value for the whole request
                    if len({json.dumps(v) for v in values}) != 1:
                        raise ServingError("INVALID_ARGUMENT",
                                           f"all instances must share {key!r}")
                    inputs[key] = _scalar(values[0])
                else:
                    inputs[key] = array(values, key)
            return inputs
        if len(input_names) != 1:
            raise ServingError("INVALID_ARGUMENT", f"instances must be objects naming the inputs "
                                                   f"{input_names}")
        return {input_names[0]: array(instances, input_names[0])}
    value = request["inputs"]
    if isinstance(value, dict):
        return {k: (array(v, k) if isinstance(v, list) else _scalar(v))
                for k, v in value.items()}
    if len(input_names) != 1:
        raise ServingError("INVALID_ARGUMENT", f"'inputs' must be an object naming {input_names}")
    return {input_names[0]: array(value, input_names[0])}


def _scalar(value) -> np.ndarray:
    """A JSON scalar as a 0-d array that keeps its JSON type (null and strings included)."""
    if value is None or isinstance(value, (dict, list)):
        return np.array(value, dtype=object)
    return np.asarray(value)


def _leaves(rows):
    for row in rows:
        if isinstance(row, list):
            yield from _leaves(row)
        else:
            yield row


def _rectangular(rows, key: str, spec, limits) -> np.ndarray:
    """``rows`` as an array; refused unless rectangular, within ``limits``
    (`inputs.check_shape`, before the array is built) and of one JSON type (numbers,
    strings or booleans: ``[true, 1]`` would otherwise become ``[1, 1]``).

    Strings become an object array of the decoded ``str``s, 8 bytes a cell over what
    the JSON parser made: numpy's own string arrays are fixed-width, every cell as
    wide as the longest (1,024 x 50 ids and one of 5,000 characters would take 1 GB).
    Rows without a value (``[[]]``) become an empty array of the input's own dtype."""
    if not _is_rectangular(rows):
        _raise(key, spec)
    shape = _declared_shape(rows)
    check_shape(key, shape, spec, limits)
    kinds = {type(x) for x in _leaves(rows)}
    if not (kinds <= {int, float} or kinds == {str} or kinds == {bool}):
        names = ", ".join(sorted("null" if k is type(None) else k.__name__ for k in kinds))
        raise ServingError("INVALID_ARGUMENT",
                           f"input {key!r} must hold values of one type, got {names}")
    try:
        if not kinds:  # no value to take a type from: the input's own
            return np.zeros(shape, object if spec.dtype == tf.string
                            else spec.dtype.as_numpy_dtype)
        array = np.array(rows, dtype=object) if kinds == {str} else np.array(rows)
    except (ValueError, OverflowError):
        _raise(key, spec)
    if list(array.shape) != shape:  # deeper lists of unequal lengths
        _raise(key, spec)
    return array


def _declared_shape(rows) -> list:
    """The lengths along the first element of each level of nested lists."""
    shape = []
    while isinstance(rows, list):
        shape.append(len(rows))
        rows = rows[0] if rows else None
    return shape


def _is_rectangular(rows) -> bool:
    if not isinstance(rows, list):
        return False
    if rows and isinstance(rows[0], list):
        return len({len(r) if isinstance(r, list) else -1 for r in rows}) == 1
    return True


def _raise(key: str, spec):
    pad = '""' if spec.dtype == tf.string else "0"
    raise ServingError("INVALID_ARGUMENT",
                       f"input {key!r} must be a rectangular list of lists (every row as long "
                       f"as the first): pad shorter rows with {pad}, which the model ignores")


__all__ = ["ALLOWED_METHODS", "RestApi", "json_inputs"]
