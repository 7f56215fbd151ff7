"""`tfrs-logq serve`: a model server that speaks TensorFlow Serving's protocols.

gRPC: ``tensorflow.serving.PredictionService/Predict``, ``/GetModelMetadata`` and
``tensorflow.serving.ModelService/GetModelStatus``, with the official
``tensorflow-serving-api`` messages, so existing TF Serving clients work unchanged.
REST: ``POST /v1/models/NAME[/versions/V]:predict`` ("instances" and "inputs"
forms), ``GET /v1/models/NAME[/versions/V]`` and ``.../metadata``, with TF
Serving's JSON shapes and ``{"error": "..."}`` bodies.

REST is HTTP/1.1 with keep-alive, a listen backlog of 1024 and a bounded pool of
``rest_api_num_threads`` workers; a connection holds a worker only while one of its
requests is being served (see `_RestServer`). Every reply is JSON, refusals
included: a malformed or missing Content-Length, a body over ``max_request_bytes``
(413), invalid UTF-8 or JSON, a ``k`` or an id out of range, another method (405).
Both ports are refused at start when in use (no SO_REUSEPORT).

It serves the newest integer version under ``--model_base_path``, polls for new
ones every ``--file_system_poll_wait_seconds`` and swaps them in: requests in
flight finish on the version they started with. Concurrent requests to the same
version and signature are batched (up to ``max_batch_size`` rows, waiting at most
``batch_timeout_micros``). Request sizes are bounded. Bad input is answered with
INVALID_ARGUMENT / NOT_FOUND (gRPC) or 400 / 404 (REST) and the server keeps going.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import errno
import json
import logging
import os
import queue
import re
import selectors
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Optional

import numpy as np
import tensorflow as tf

log = logging.getLogger("tfrs_logq.serving")


class ServingError(Exception):
    """An error with a gRPC status name and an HTTP status code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "INTERNAL"

    @property
    def http_status(self) -> int:
        return {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 413,
                "FAILED_PRECONDITION": 400, "METHOD_NOT_ALLOWED": 405,
                "DEADLINE_EXCEEDED": 504, "UNAVAILABLE": 503}.get(self.code, 500)


@dataclasses.dataclass
class ServerOptions:
    model_name: str
    model_base_path: str
    port: int = 8500
    rest_api_port: int = 8501
    host: str = "127.0.0.1"
    file_system_poll_wait_seconds: float = 1.0
    max_batch_size: int = 256
    batch_timeout_micros: int = 500
    max_request_rows: int = 1024
    max_request_bytes: int = 16 * 1024 * 1024
    num_threads: int = 16  # gRPC workers
    rest_api_num_threads: int = 32  # REST workers (requests served at once)
    rest_api_timeout_in_ms: int = 30_000  # longest wait on a REST client's bytes
    request_timeout_in_ms: int = 60_000  # longest a request waits for its batch's result


class Servable:
    """One loaded version: the SavedModel, its signatures' metadata and a batcher."""

    def __init__(self, path: str, version: int, options: ServerOptions) -> None:
        try:
            import scann  # noqa: F401  (registers the ScaNN ops a ScaNN export needs)
        except ImportError:
            pass
        self.path, self.version = path, version
        self.model = tf.saved_model.load(path)
        self.signatures = dict(self.model.signatures)
        meta_path = os.path.join(path, "assets", "export.json")
        self.meta = {}
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                self.meta = json.load(f)
        self.signature_defs = _read_signature_defs(path)
        self.options = options
        self._queues: dict = {}
        self._lock = threading.Lock()
        self._stop = False

    # -- input validation --------------------------------------------------------

    def validate(self, signature_name: str, inputs: dict) -> dict:
        name = signature_name or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
        if name not in self.signatures:
            raise ServingError("INVALID_ARGUMENT",
                               f"Serving signature name: \"{name}\" not found in signature def "
                               f"(available: {sorted(self.signatures)})")
        fn = self.signatures[name]
        specs = fn.structured_input_signature[1]
        defaults = self.meta.get("input_defaults", {}).get(name, {})
        inputs = {**{k: v for k, v in defaults.items() if k in specs}, **inputs}
        missing = sorted(set(specs) - set(inputs))
        extra = sorted(set(inputs) - set(specs))
        if missing:
            raise ServingError("INVALID_ARGUMENT", f"input(s) {missing} missing for signature "
                                                   f"{name!r}, which takes {sorted(specs)}")
        if extra:
            raise ServingError("INVALID_ARGUMENT", f"unknown input(s) {extra} for signature "
                                                   f"{name!r}, which takes {sorted(specs)}")
        out = {}
        for key, spec in specs.items():
            value = np.asarray(inputs[key])
            try:
                if spec.dtype == tf.string:
                    value = _utf8_strings(value)
                elif spec.dtype.is_integer:
                    value = _integers(key, value, spec.dtype.as_numpy_dtype,
                                      self._k_range(spec.dtype) if key == "k" else None)
                else:
                    value = value.astype(spec.dtype.as_numpy_dtype)
            except (TypeError, ValueError) as exc:
                raise ServingError("INVALID_ARGUMENT",
                                   f"input {key!r} must be {spec.dtype.name}: {exc}") from None
            if spec.shape.rank is not None and value.ndim != spec.shape.rank:
                raise ServingError("INVALID_ARGUMENT",
                                   f"input {key!r} must have rank {spec.shape.rank} (shape "
                                   f"{spec.shape}), received shape {list(value.shape)}")
            out[key] = value
        history = out.get("history")
        if history is not None:
            max_length = self.meta.get("max_length")
            if max_length and history.shape[1] > max_length:
                raise ServingError("INVALID_ARGUMENT",
                                   f"history has {history.shape[1]} items; the model takes at "
                                   f"most {max_length}")
            if history.shape[0] > self.options.max_request_rows:
                raise ServingError("INVALID_ARGUMENT",
                                   f"{history.shape[0]} rows in one request; at most "
                                   f"{self.options.max_request_rows}")
            if history.shape[0] == 0:
                raise ServingError("INVALID_ARGUMENT", "history has no rows")
        return {"signature": name, "inputs": out}

    def _k_range(self, dtype: tf.DType) -> tuple:
        """The values ``k`` may take: 1 to the catalog size (and what ``dtype`` holds)."""
        most = int(np.iinfo(dtype.as_numpy_dtype).max)
        return 1, min(int(self.meta.get("num_items") or most), most)

    # -- batched execution -------------------------------------------------------

    def run(self, request: dict) -> dict:
        """Runs a validated request, batched with concurrent ones of the same kind."""
        name, inputs = request["signature"], request["inputs"]
        history = inputs.get("history")
        if history is None or self.options.max_batch_size <= 1:
            return self._call(name, inputs)
        # Requests batch together only when their scalar options agree.
        scalars = tuple(sorted((k, bool(v)) for k, v in inputs.items() if k == "exclude_history"))
        key = (name, history.dtype.kind, scalars)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if key not in self._queues:
                q: queue.Queue = queue.Queue()
                self._queues[key] = q
                threading.Thread(target=self._batch_loop, args=(name, q), daemon=True).start()
        self._queues[key].put((inputs, future))
        timeout = self.options.request_timeout_in_ms / 1000
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # a batch that picks it up later skips it
            raise ServingError("DEADLINE_EXCEEDED",
                               f"no result within {timeout:g} s (request_timeout_in_ms); the "
                               "server is overloaded or its batch worker failed") from None

    def _call(self, name: str, inputs: dict) -> dict:
        tensors = {k: tf.constant(v) for k, v in inputs.items()}
        try:
            outputs = self.signatures[name](**tensors)
        except tf.errors.InvalidArgumentError as exc:
            raise ServingError("INVALID_ARGUMENT", exc.message.split("\n")[0]) from None
        return {k: v.numpy() for k, v in outputs.items()}

    def _batch_loop(self, name: str, q: queue.Queue) -> None:
        """Runs batches until the servable closes; whatever happens, no request is left
        waiting: on exit the queue is retired and its requests are failed."""
        try:
            self._batch_loop_body(name, q)
        except Exception:  # noqa: BLE001  (logged; its requests fail below)
            log.exception("the batch worker of signature %r stopped", name)
        finally:
            with self._lock:
                for key, queue_ in list(self._queues.items()):
                    if queue_ is q:
                        del self._queues[key]  # the next request starts a new worker
            _fail_pending(q, ServingError("UNAVAILABLE", "the model version is unloading"
                                          if self._stop else "the batch worker stopped"))

    def _batch_loop_body(self, name: str, q: queue.Queue) -> None:
        timeout = self.options.batch_timeout_micros / 1e6
        while not self._stop:
            try:
                first = q.get(timeout=0.5)
            except queue.Empty:
                continue
            batch = [first]
            rows = first[0]["history"].shape[0]
            deadline = time.monotonic() + timeout
            while rows < self.options.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = q.get(timeout=remaining)
                except queue.Empty:
                    break
                batch.append(item)
                rows += item[0]["history"].shape[0]
            self._run_batch(name, batch)

    def _run_batch(self, name: str, batch: list) -> None:
        batch = [(inputs, f) for inputs, f in batch if f.set_running_or_notify_cancel()]
        if not batch:
            return
        try:
            width = max(inputs["history"].shape[1] for inputs, _ in batch)
            pad = b"" if batch[0][0]["history"].dtype.kind in ("S", "O") else 0
            histories = [np.pad(inputs["history"], ((0, 0), (width - inputs["history"].shape[1],
                                                             0)), constant_values=pad)
                         for inputs, _ in batch]
            merged = {"history": np.concatenate(histories, axis=0)}
            ks = [int(inputs["k"]) for inputs, _ in batch if "k" in inputs]
            if ks:
                merged["k"] = np.int32(max(ks))
            if "exclude_history" in batch[0][0]:
                merged["exclude_history"] = batch[0][0]["exclude_history"]
            outputs = self._call(name, merged)
            start = 0
            for inputs, future in batch:
                n = inputs["history"].shape[0]
                k = int(inputs["k"]) if "k" in inputs else None
                part = {}
                for key, value in outputs.items():
                    value = value[start:start + n]
                    if k is not None and value.ndim == 2 and key in ("item_ids", "scores"):
                        value = value[:, :k]
                    part[key] = value
                future.set_result(part)
                start += n
        except Exception as exc:  # every waiter learns the outcome
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, ServingError)
                                         else ServingError("INTERNAL", str(exc)))

    def close(self) -> None:
        self._stop = True


def _fail_pending(q: queue.Queue, error: Exception) -> None:
    while True:
        try:
            _, future = q.get_nowait()
        except queue.Empty:
            return
        if future.set_running_or_notify_cancel():
            future.set_exception(error)


def _utf8_strings(value: np.ndarray) -> np.ndarray:
    """Strings (JSON text, or bytes from a tensor proto) as UTF-8 bytes for a tf.string input."""
    kind = value.dtype.kind
    if kind not in ("U", "S", "O"):
        raise TypeError(f"expected strings, got {value.dtype}")
    if kind == "S":
        return value
    if kind == "U":
        return np.char.encode(value, "utf-8")  # numpy's astype(bytes) would be ASCII only
    encoded = np.empty(value.shape, dtype=object)
    for index, item in np.ndenumerate(value):
        if isinstance(item, (bytes, np.bytes_)):
            encoded[index] = bytes(item)
        elif isinstance(item, str):
            encoded[index] = item.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
        else:
            raise TypeError(f"expected strings, got {type(item).__name__} {item!r:.40}")
    return encoded


def _integers(key: str, value: np.ndarray, dtype, k_range: Optional[tuple] = None) -> np.ndarray:
    """``value`` as the integer ``dtype``, refusing what ``astype`` would silently wrap.

    Integral floats (``5.0``) are accepted, as TF Serving's JSON parser does. Python ints
    too large for int64 arrive as an object array and are range-checked like the rest.
    ``k_range`` replaces the dtype's range for the scalar ``k``.
    """
    if value.size:
        kind = value.dtype.kind
        if kind == "O":
            if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                       for x in value.flat):
                raise TypeError("expected integers, got "
                                + ", ".join(sorted({type(x).__name__ for x in value.flat})))
        elif kind == "f":
            if not np.all(np.isfinite(value)) or not np.all(np.mod(value, 1) == 0):
                raise TypeError(f"expected integers, got {value.dtype}")
        elif kind not in ("i", "u"):
            raise TypeError(f"expected integers, got {value.dtype}")
        lowest, highest = value.min(), value.max()
        if k_range is not None:
            if lowest < k_range[0] or highest > k_range[1]:
                raise ServingError("INVALID_ARGUMENT",
                                   f"k must be in [{k_range[0]}, {k_range[1]}], got "
                                   f"{lowest if lowest < k_range[0] else highest}")
        else:
            info = np.iinfo(dtype)
            if lowest < info.min or highest > info.max:
                bad = lowest if lowest < info.min else highest
                raise ServingError("INVALID_ARGUMENT",
                                   f"input {key!r} must be {np.dtype(dtype).name}: {bad} is "
                                   f"outside its range [{info.min}, {info.max}]")
    return value.astype(dtype)  # in range now: nothing wraps


def _read_signature_defs(path: str):
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto.meta_graphs[0].signature_def


class ModelManager:
    """Watches ``model_base_path`` and keeps the newest version loaded."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self._servable: Optional[Servable] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.poll()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def versions_on_disk(self) -> list[int]:
        base = self.options.model_base_path
        if not os.path.isdir(base):
            return []
        return sorted(int(d) for d in os.listdir(base)
                      if d.isdigit() and os.path.exists(os.path.join(base, d, "saved_model.pb")))

    def poll(self) -> None:
        versions = self.versions_on_disk()
        if not versions:
            return
        newest = versions[-1]
        current = self._servable
        if current is not None and current.version == newest:
            return
        try:
            servable = Servable(os.path.join(self.options.model_base_path, str(newest)), newest,
                                self.options)
        except Exception as exc:  # a broken version must not take the server down
            log.error("could not load version %s: %s", newest, exc)
            return
        with self._lock:
            old, self._servable = self._servable, servable
        log.info("serving %s version %d", self.options.model_name, newest)
        if old is not None:
            # Requests already holding `old` finish on it; its batchers stop later.
            threading.Timer(30.0, old.close).start()

    def _watch(self) -> None:
        while not self._stop.wait(self.options.file_system_poll_wait_seconds):
            self.poll()

    def get(self, model_name: str, version: Optional[int] = None) -> Servable:
        if model_name != self.options.model_name:
            raise ServingError("NOT_FOUND", f"Servable not found for request: Latest({model_name})"
                               if version is None else
                               f"Servable not found for request: Specific({model_name}, "
                               f"{version})")
        servable = self._servable
        if servable is None:
            raise ServingError("NOT_FOUND", f"Servable not found for request: "
                                            f"Latest({model_name}): no version loaded yet")
        if version is not None and version != servable.version:
            raise ServingError("NOT_FOUND", f"Servable not found for request: Specific("
                                            f"{model_name}, {version})")
        return servable

    def stop(self) -> None:
        self._stop.set()


# ------------------------------------------------------------------------------- gRPC


def _grpc_services(manager: ModelManager):
    import grpc
    from google.protobuf import any_pb2
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    codes = {"INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
             "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
             "RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
             "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION,
             "DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,
             "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE}

    def version_of(spec) -> Optional[int]:
        if spec.HasField("version"):
            return int(spec.version.value)
        if spec.version_label:
            raise ServingError("INVALID_ARGUMENT", "version labels are not supported")
        return None

    def guarded(fn):
        def wrapper(self, request, context):
            try:
                return fn(self, request, context)
            except ServingError as exc:
                context.abort(codes.get(exc.code, grpc.StatusCode.INTERNAL), str(exc))

        return wrapper

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        @guarded
        def Predict(self, request, context):  # noqa: N802 (gRPC method name)
            servable = manager.get(request.model_spec.name, version_of(request.model_spec))
            try:
                inputs = {k: tf.make_ndarray(v) for k, v in request.inputs.items()}
            except Exception as exc:
                raise ServingError("INVALID_ARGUMENT", f"malformed input tensor: {exc}") from None
            checked = servable.validate(request.model_spec.signature_name, inputs)
            outputs = servable.run(checked)
            response = predict_pb2.PredictResponse()
            response.model_spec.name = request.model_spec.name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = checked["signature"]
            wanted = set(request.output_filter) or set(outputs)
            for key, value in outputs.items():
                if key in wanted:
                    response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
            return response

        @guarded
        def GetModelMetadata(self, request, context):  # noqa: N802
            servable = manager.get(request.model_spec.name, version_of(request.model_spec))
            fields = set(request.metadata_field)
            if fields != {"signature_def"}:
                raise ServingError("INVALID_ARGUMENT",
                                   "Metadata field(s) must be ['signature_def'], got "
                                   f"{sorted(fields)}")
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = request.model_spec.name
            response.model_spec.version.value = servable.version
            signature_map = get_model_metadata_pb2.SignatureDefMap()
            for key, value in servable.signature_defs.items():
                signature_map.signature_def[key].CopyFrom(value)
            packed = any_pb2.Any()
            packed.Pack(signature_map)
            response.metadata["signature_def"].CopyFrom(packed)
            return response

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        @guarded
        def GetModelStatus(self, request, context):  # noqa: N802
            servable = manager.get(request.model_spec.name, version_of(request.model_spec))
            response = get_model_status_pb2.GetModelStatusResponse()
            status = response.model_version_status.add()
            status.version = servable.version
            status.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
            return response

    return PredictionService(), ModelService(), prediction_service_pb2_grpc, model_service_pb2_grpc


# ------------------------------------------------------------------------------- REST


def _jsonable(value: np.ndarray):
    if value.dtype.kind in ("S", "O"):
        return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else str(b),
                            otypes=[object])(value).tolist()
    return value.tolist()


_ALLOWED_METHODS = "GET, HEAD, POST"
_CONTENT_LENGTH = re.compile(r"[0-9]{1,19}")


def _rest_handler(manager: ModelManager, options: ServerOptions):
    limit = options.max_request_bytes

    class Handler(BaseHTTPRequestHandler):
        """One connection's requests; `_RestServer` calls `handle_one_request` per request.

        Every reply, http.server's own refusals included, is JSON. A reply that leaves
        a request body unread closes the connection (saying ``Connection: close``), so
        the unread bytes are never taken for the next request.
        """

        protocol_version = "HTTP/1.1"
        default_request_version = "HTTP/1.0"  # a status line and headers, even for junk
        disable_nagle_algorithm = True  # small JSON replies on keep-alive connections
        timeout = options.rest_api_timeout_in_ms / 1000  # per read of a request's bytes
        body_read = False  # whether the current request's body (if any) was consumed
        linger = False  # closing must drain what the client still sends (see _RestServer)

        def log_message(self, fmt, *args):  # quiet
            log.debug(fmt, *args)

        def send_error(self, code, message=None, explain=None):
            """http.server's own refusals (request line, headers, unknown method) as JSON."""
            if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
                message = (f"method {self.command} is not supported; this server answers "
                           f"{_ALLOWED_METHODS}")
            self.close_connection = self.linger = True  # the client may still be sending
            self.log_error("code %d, message %s", code, message)
            self._send(code, {"error": message or HTTPStatus(code).phrase})

        def _declares_body(self) -> bool:
            headers = getattr(self, "headers", None)
            if headers is None:
                return False
            return bool(headers.get("Transfer-Encoding")) or \
                (headers.get("Content-Length") or "0").strip() != "0"

        def _send(self, status: int, body: dict, headers: tuple = ()) -> None:
            data = json.dumps(body).encode()
            if not self.body_read and self._declares_body():
                self.close_connection = self.linger = True
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers:
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if getattr(self, "command", None) != "HEAD":
                self.wfile.write(data)

        def _answer(self, produce, headers: tuple = ()) -> None:
            """Sends what ``produce()`` returns, or the error it raised, as JSON."""
            try:
                status, body = 200, produce()
            except ServingError as exc:
                status, body = exc.http_status, {"error": str(exc)}
            except (ConnectionError, TimeoutError):
                raise  # the connection failed: nothing can be sent
            except Exception as exc:  # a bug answers 500; the server keeps going
                log.exception("REST %s %s failed", self.command, self.path)
                status, body = 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}
            self._send(status, body, headers)

        def _body_length(self) -> int:
            if self.headers.get("Transfer-Encoding"):
                raise ServingError("INVALID_ARGUMENT",
                                   f"Transfer-Encoding {self.headers['Transfer-Encoding']!r} is "
                                   "not supported: send the body with a Content-Length header")
            values = [v.strip() for v in self.headers.get_all("Content-Length") or []]
            if not values:
                raise ServingError("INVALID_ARGUMENT", f"{self.command} needs a Content-Length "
                                                       "header: the body's size in bytes")
            if len(set(values)) > 1:
                raise ServingError("INVALID_ARGUMENT",
                                   f"conflicting Content-Length headers: {', '.join(values)}")
            if not _CONTENT_LENGTH.fullmatch(values[0]):
                raise ServingError("INVALID_ARGUMENT", f"Content-Length must be a non-negative "
                                                       f"integer, got {values[0][:40]!r}")
            length = int(values[0])
            if length > limit:
                raise ServingError("RESOURCE_EXHAUSTED",
                                   f"request body of {length} bytes exceeds the limit of "
                                   f"{limit} (max_request_bytes)")
            return length

        def handle_expect_100(self) -> bool:
            """Refuses a body it would refuse anyway before the client sends it."""
            if self.command == "POST":
                try:
                    self._body_length()
                except ServingError as exc:
                    self._send(exc.http_status, {"error": str(exc)})
                    return False
            return super().handle_expect_100()

        def _read_json(self):
            length = self._body_length()
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                raise ServingError("INVALID_ARGUMENT", f"the body ended after {len(body)} of "
                                                       f"the {length} bytes of its Content-Length")
            self.body_read = True
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

        def _route(self):
            path = self.path.split("?", 1)[0]
            parts = path.strip("/").split("/")
            if len(parts) < 3 or parts[0] != "v1" or parts[1] != "models":
                raise ServingError("NOT_FOUND", f"Malformed request: {self.command} {path}")
            rest = parts[2:]
            action = None
            if ":" in rest[-1]:
                rest[-1], action = rest[-1].split(":", 1)
            name, version, extra = rest[0], None, rest[1:]
            if extra[:1] == ["versions"]:
                if len(extra) < 2 or not extra[1].isdigit():
                    raise ServingError("INVALID_ARGUMENT", f"Malformed version in {path}")
                version, extra = int(extra[1]), extra[2:]
            return name, version, extra, action

        def _status_or_metadata(self) -> dict:
            name, version, extra, action = self._route()
            servable = manager.get(name, version)
            if extra == ["metadata"] and action is None:
                from google.protobuf import json_format

                sigs = {k: json_format.MessageToDict(v)
                        for k, v in servable.signature_defs.items()}
                return {"model_spec": {"name": name, "signature_name": "",
                                       "version": str(servable.version)},
                        "metadata": {"signature_def": {"signature_def": sigs}}}
            if not extra and action is None:
                return {"model_version_status": [{
                    "version": str(servable.version), "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""}}]}
            raise ServingError("NOT_FOUND", f"Malformed request: {self.command} {self.path}")

        def _predict(self) -> dict:
            request = self._read_json()
            name, version, extra, action = self._route()
            if action != "predict" or extra:
                raise ServingError("NOT_FOUND", f"Malformed request: POST {self.path}")
            servable = manager.get(name, version)
            if not isinstance(request, dict):
                raise ServingError("INVALID_ARGUMENT", "JSON body must be an object")
            signature = request.get("signature_name", "")
            if not isinstance(signature, str):
                raise ServingError("INVALID_ARGUMENT", "'signature_name' must be a string")
            if ("instances" in request) == ("inputs" in request):
                raise ServingError("INVALID_ARGUMENT", "JSON Value must have exactly one of "
                                                       "'instances' or 'inputs'")
            row_format = "instances" in request
            inputs = _rest_inputs(servable, signature, request, row_format)
            checked = servable.validate(signature, inputs)
            outputs = servable.run(checked)
            if row_format:
                n = next(iter(outputs.values())).shape[0]
                return {"predictions": [{k: _jsonable(v[i]) for k, v in outputs.items()}
                                        for i in range(n)]}
            return {"outputs": {k: _jsonable(v) for k, v in outputs.items()}}

        def do_GET(self):  # noqa: N802
            self._answer(self._status_or_metadata)

        do_HEAD = do_GET  # the same headers, no body (see _send)

        def do_POST(self):  # noqa: N802
            self._answer(self._predict)

        def _method_not_allowed(self):
            def refuse():
                raise ServingError("METHOD_NOT_ALLOWED",
                                   f"method {self.command} is not allowed on {self.path}: this "
                                   f"server answers {_ALLOWED_METHODS}")

            self._answer(refuse, headers=(("Allow", _ALLOWED_METHODS),))

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _method_not_allowed

    return Handler


class _Connection:
    """An accepted REST connection and its handler (which owns the buffered reader)."""

    __slots__ = ("sock", "handler", "idle_since")

    def __init__(self, sock, address, server: "_RestServer") -> None:
        self.sock = sock
        handler = server.handler_class.__new__(server.handler_class)
        handler.request, handler.client_address, handler.server = sock, address, server
        handler.setup()  # StreamRequestHandler: timeout, TCP_NODELAY, rfile and wfile
        self.handler = handler
        self.idle_since = time.monotonic()

    def has_buffered_input(self) -> bool:
        """Whether the next request's bytes already arrived (a pipelining client)."""
        self.sock.setblocking(False)
        try:
            return bool(self.handler.rfile.peek(1))
        except OSError:
            return False
        finally:
            self.sock.settimeout(self.handler.timeout)

    def close(self, linger_s: float = 2.0, linger_bytes: int = 64 * 1024 * 1024) -> None:
        handler = self.handler
        try:
            handler.finish()  # flushes and closes rfile and wfile
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_WR)
            if handler.linger:
                # The client may still be sending the body the reply refused; closing now
                # would reset the connection and could lose the reply. Read and drop what
                # comes, for a bounded time, until the client closes its end.
                deadline = time.monotonic() + linger_s
                while linger_bytes > 0:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self.sock.settimeout(remaining)
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        break
                    linger_bytes -= len(chunk)
        except OSError:
            pass
        self.sock.close()


class _RestServer:
    """The REST front end: a listening socket with a real backlog, one thread that
    accepts connections and watches idle keep-alive ones, and a bounded pool of
    workers that serve requests.

    A connection holds a worker only while one of its requests is read, run and
    answered; between requests it waits in the selector. So hundreds of keep-alive
    clients share ``workers`` threads, a burst of new connections waits in the listen
    backlog (``socketserver``'s is 5: a burst beyond it is reset), and a client that
    goes quiet costs a file descriptor, not a thread, until ``idle_timeout_s``.
    """

    def __init__(self, host: str, port: int, handler_class, workers: int,
                 backlog: int = 1024, idle_timeout_s: float = 60.0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            # SO_REUSEADDR lets a restart bind while old connections linger in TIME_WAIT;
            # on Linux it does not let a second server listen on the port (SO_REUSEPORT
            # would, and is not set).
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(backlog)
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self.handler_class = handler_class
        self.idle_timeout_s = idle_timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(1, workers), thread_name_prefix="tfrs-logq-rest")
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._returned: collections.deque = collections.deque()
        self._idle: dict = {}  # _Connection -> None, the ones the selector watches
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tfrs-logq-rest-accept",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        selector = self._selector
        selector.register(self.socket, selectors.EVENT_READ, "accept")
        selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        next_sweep = time.monotonic() + 1.0
        while not self._stopping.is_set():
            for key, _ in selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    self._take_back()
                else:  # a request (or EOF) arrived on an idle connection
                    connection = key.data
                    selector.unregister(connection.sock)
                    self._idle.pop(connection, None)
                    self._pool.submit(self._serve, connection)
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + 1.0
                for connection in [c for c in self._idle
                                   if now - c.idle_since > self.idle_timeout_s]:
                    self._drop(connection)
        for connection in list(self._idle):
            self._drop(connection)
        selector.close()
        self.socket.close()
        self._wake_r.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.socket.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # EMFILE and the like: let the backlog hold them a while
                log.warning("REST: cannot accept a connection: %s", exc)
                time.sleep(0.05)
                return
            try:
                sock.setblocking(True)
                self._watch(_Connection(sock, address, self))
            except OSError:
                sock.close()

    def _watch(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self._idle[connection] = None
        self._selector.register(connection.sock, selectors.EVENT_READ, connection)

    def _drop(self, connection: _Connection) -> None:
        self._idle.pop(connection, None)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.close()

    def _take_back(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._returned:
            connection = self._returned.popleft()
            try:
                self._watch(connection)
            except (OSError, ValueError):
                connection.close()

    def _serve(self, connection: _Connection) -> None:
        """Runs on a worker: the requests that have arrived on ``connection``."""
        keep = False
        try:
            while not self._stopping.is_set():
                handler = connection.handler
                handler.close_connection = True
                handler.command = handler.headers = None  # nothing of the last request
                handler.body_read = handler.linger = False
                handler.handle_one_request()  # answers timeouts and bad requests itself
                if handler.close_connection:
                    break
                if not connection.has_buffered_input():
                    keep = True
                    break
        except Exception as exc:  # a failed connection must not take the worker's loop down
            log.debug("REST connection from %s failed: %s", connection.handler.client_address,
                      exc)
        if keep and not self._stopping.is_set():
            self._returned.append(connection)
            try:
                self._wake_w.send(b"\0")
            except BlockingIOError:
                pass  # the loop is being woken anyway
        else:
            connection.close()

    def close(self) -> None:
        """Stops accepting and closes idle connections; requests being served finish."""
        self._stopping.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._selector.close()
            self.socket.close()
            self._wake_r.close()
        self._wake_w.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        while self._returned:
            self._returned.popleft().close()


def _rest_inputs(servable: Servable, signature: str, request: dict, row_format: bool) -> dict:
    name = signature or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
    if name not in servable.signatures:
        raise ServingError("INVALID_ARGUMENT", f"Serving signature name: \"{name}\" not found")
    input_names = sorted(servable.signatures[name].structured_input_signature[1])
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
                if key == "k":  # a scalar input: one value for the whole request
                    if len(set(map(str, values))) != 1:
                        raise ServingError("INVALID_ARGUMENT", "all instances must share 'k'")
                    inputs[key] = values[0]
                else:
                    inputs[key] = _rectangular(values, key)
            return inputs
        if len(input_names) != 1:
            raise ServingError("INVALID_ARGUMENT", f"instances must be objects naming the inputs "
                                                   f"{input_names}")
        return {input_names[0]: _rectangular(instances, input_names[0])}
    value = request["inputs"]
    if isinstance(value, dict):
        return {k: (_rectangular(v, k) if isinstance(v, list) else v) for k, v in value.items()}
    if len(input_names) != 1:
        raise ServingError("INVALID_ARGUMENT", f"'inputs' must be an object naming {input_names}")
    return {input_names[0]: _rectangular(value, input_names[0])}


def _rectangular(rows, key: str) -> np.ndarray:
    try:
        return np.array(rows) if _is_rectangular(rows) else _raise(key)
    except ValueError:
        _raise(key)


def _is_rectangular(rows) -> bool:
    if not isinstance(rows, list):
        return False
    if rows and isinstance(rows[0], list):
        return len({len(r) if isinstance(r, list) else -1 for r in rows}) == 1
    return True


def _raise(key: str):
    raise ServingError("INVALID_ARGUMENT", f"input {key!r} must be a rectangular list of lists")


# ------------------------------------------------------------------------------- server


class ModelServer:
    """Starts the gRPC and REST front ends over one `ModelManager`.

    Both ports are bound before the model loads, so a port in use fails at once. gRPC
    binds without SO_REUSEPORT (grpc sets it by default): otherwise a second server on
    the same port would start and take half of the new connections.
    """

    def __init__(self, options: ServerOptions) -> None:
        import grpc

        self.options = options
        for name in ("num_threads", "rest_api_num_threads", "rest_api_timeout_in_ms"):
            if getattr(options, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(options, name)}")
        limit = options.max_request_bytes
        self.grpc_server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=options.num_threads),
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", 64 * 1024 * 1024),
                     ("grpc.so_reuseport", 0)])
        self.manager = None
        self.http = None
        self._grpc_bound = False
        try:
            # REST first: a plain socket closes cleanly if the gRPC port is taken, while
            # grpc only lets go of a bound port once its server has started.
            try:
                self.http = _RestServer(options.host, options.rest_api_port, None,
                                        workers=options.rest_api_num_threads)
            except OSError as exc:
                raise _bind_error("REST", "rest_api_port", options.host, options.rest_api_port,
                                  exc) from None
            self.rest_port = self.http.server_address[1]
            self.port = _bind_grpc(self.grpc_server, options.host, options.port)
            self._grpc_bound = True
            self.manager = ModelManager(options)
            prediction, model_service, pred_grpc, model_grpc = _grpc_services(self.manager)
            pred_grpc.add_PredictionServiceServicer_to_server(prediction, self.grpc_server)
            model_grpc.add_ModelServiceServicer_to_server(model_service, self.grpc_server)
            self.http.handler_class = _rest_handler(self.manager, options)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        """Frees what a failed ``__init__`` took: the watcher, both ports."""
        if self.manager is not None:
            self.manager.stop()
        if self.http is not None:
            self.http.close()
        if self._grpc_bound:
            self.grpc_server.start()
        self.grpc_server.stop(None).wait(5)

    def start(self) -> "ModelServer":
        self.grpc_server.start()
        self.http.start()
        return self

    def stop(self) -> None:
        self.manager.stop()
        self.http.close()
        self.grpc_server.stop(grace=1.0)

    def wait(self) -> None:
        self.grpc_server.wait_for_termination()


def _bind_grpc(server, host: str, port: int) -> int:
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else \
        f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc >= 1.5x raises "Failed to bind to address ..."
        bound, reason = 0, exc
    else:
        reason = None
    if not bound:
        raise _bind_error("gRPC", "port", host, port, reason)
    return bound


def _bind_error(what: str, option: str, host: str, port: int, reason) -> OSError:
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


__all__ = ["ModelServer", "ServerOptions", "ServingError"]
