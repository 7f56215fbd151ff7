"""`tfrs-logq serve`: a model server that speaks TensorFlow Serving's protocols.

gRPC: ``tensorflow.serving.PredictionService/Predict``, ``/GetModelMetadata`` and
``tensorflow.serving.ModelService/GetModelStatus``, with the official
``tensorflow-serving-api`` messages, so existing TF Serving clients work unchanged.
REST: ``POST /v1/models/NAME[/versions/V]:predict`` ("instances" and "inputs"
forms), ``GET /v1/models/NAME[/versions/V]`` and ``.../metadata``, with TF
Serving's JSON shapes and ``{"error": "..."}`` bodies.

It serves the newest integer version under ``--model_base_path``, polls for new
ones every ``--file_system_poll_wait_seconds`` and swaps them in: requests in
flight finish on the version they started with. Concurrent requests to the same
version and signature are batched (up to ``max_batch_size`` rows, waiting at most
``batch_timeout_micros``). Request sizes are bounded. Bad input is answered with
INVALID_ARGUMENT / NOT_FOUND (gRPC) or 400 / 404 (REST) and the server keeps going.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
                "FAILED_PRECONDITION": 400}.get(self.code, 500)


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
    num_threads: int = 16


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
                    if value.dtype.kind not in ("U", "S", "O"):
                        raise TypeError("expected strings")
                    value = value.astype(object).astype(bytes)
                elif spec.dtype.is_integer:
                    if value.size and value.dtype.kind not in ("i", "u"):
                        if value.dtype.kind == "f" and np.all(np.mod(value, 1) == 0):
                            value = value.astype(np.int64)
                        else:
                            raise TypeError(f"expected integers, got {value.dtype}")
                    value = value.astype(spec.dtype.as_numpy_dtype)
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
        if "k" in out:
            k = int(out["k"])
            if not 1 <= k <= self.meta.get("num_items", k):
                raise ServingError("INVALID_ARGUMENT",
                                   f"k must be in [1, {self.meta.get('num_items')}], got {k}")
        return {"signature": name, "inputs": out}

    # -- batched execution -------------------------------------------------------

    def run(self, request: dict) -> dict:
        """Runs a validated request, batched with concurrent ones of the same kind."""
        name, inputs = request["signature"], request["inputs"]
        history = inputs.get("history")
        if history is None or self.options.max_batch_size <= 1:
            return self._call(name, inputs)
        key = (name, history.dtype.kind)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if key not in self._queues:
                q: queue.Queue = queue.Queue()
                self._queues[key] = q
                threading.Thread(target=self._batch_loop, args=(name, q), daemon=True).start()
        self._queues[key].put((inputs, future))
        return future.result()

    def _call(self, name: str, inputs: dict) -> dict:
        tensors = {k: tf.constant(v) for k, v in inputs.items()}
        try:
            outputs = self.signatures[name](**tensors)
        except tf.errors.InvalidArgumentError as exc:
            raise ServingError("INVALID_ARGUMENT", exc.message.split("\n")[0]) from None
        return {k: v.numpy() for k, v in outputs.items()}

    def _batch_loop(self, name: str, q: queue.Queue) -> None:
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
             "FAILED_PRECONDITION": grpc.StatusCode.FAILED_PRECONDITION}

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


def _rest_handler(manager: ModelManager, options: ServerOptions):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet
            log.debug(fmt, *args)

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

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

        def do_GET(self):  # noqa: N802
            try:
                name, version, extra, action = self._route()
                servable = manager.get(name, version)
                if extra == ["metadata"] and action is None:
                    from google.protobuf import json_format

                    sigs = {k: json_format.MessageToDict(v)
                            for k, v in servable.signature_defs.items()}
                    self._send(200, {"model_spec": {"name": name, "signature_name": "",
                                                    "version": str(servable.version)},
                                     "metadata": {"signature_def": {"signature_def": sigs}}})
                elif not extra and action is None:
                    self._send(200, {"model_version_status": [{
                        "version": str(servable.version), "state": "AVAILABLE",
                        "status": {"error_code": "OK", "error_message": ""}}]})
                else:
                    raise ServingError("NOT_FOUND", f"Malformed request: GET {self.path}")
            except ServingError as exc:
                self._send(exc.http_status, {"error": str(exc)})

        def do_POST(self):  # noqa: N802
            try:
                length = int(self.headers.get("Content-Length") or 0)
                if length > options.max_request_bytes:
                    self.close_connection = True
                    raise ServingError("INVALID_ARGUMENT",
                                       f"request body of {length} bytes exceeds the limit of "
                                       f"{options.max_request_bytes}")
                body = self.rfile.read(length)
                name, version, extra, action = self._route()
                if action != "predict" or extra:
                    raise ServingError("NOT_FOUND", f"Malformed request: POST {self.path}")
                servable = manager.get(name, version)
                try:
                    request = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise ServingError("INVALID_ARGUMENT", f"JSON Parse error: {exc}") from None
                if not isinstance(request, dict):
                    raise ServingError("INVALID_ARGUMENT", "JSON body must be an object")
                signature = request.get("signature_name", "")
                if ("instances" in request) == ("inputs" in request):
                    raise ServingError("INVALID_ARGUMENT", "JSON Value must have exactly one of "
                                                           "'instances' or 'inputs'")
                row_format = "instances" in request
                inputs = _rest_inputs(servable, signature, request, row_format)
                checked = servable.validate(signature, inputs)
                outputs = servable.run(checked)
                if row_format:
                    n = next(iter(outputs.values())).shape[0]
                    predictions = [{k: _jsonable(v[i]) for k, v in outputs.items()}
                                   for i in range(n)]
                    self._send(200, {"predictions": predictions})
                else:
                    self._send(200, {"outputs": {k: _jsonable(v) for k, v in outputs.items()}})
            except ServingError as exc:
                self._send(exc.http_status, {"error": str(exc)})

    return Handler


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
    """Starts the gRPC and REST front ends over one `ModelManager`."""

    def __init__(self, options: ServerOptions) -> None:
        import grpc

        self.options = options
        self.manager = ModelManager(options)
        prediction, model_service, pred_grpc, model_grpc = _grpc_services(self.manager)
        limit = options.max_request_bytes
        self.grpc_server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=options.num_threads),
            options=[("grpc.max_receive_message_length", limit),
                     ("grpc.max_send_message_length", 64 * 1024 * 1024)])
        pred_grpc.add_PredictionServiceServicer_to_server(prediction, self.grpc_server)
        model_grpc.add_ModelServiceServicer_to_server(model_service, self.grpc_server)
        self.port = self.grpc_server.add_insecure_port(f"{options.host}:{options.port}")
        if self.port == 0:
            raise OSError(f"could not bind gRPC to {options.host}:{options.port}")
        self.http = ThreadingHTTPServer((options.host, options.rest_api_port),
                                        _rest_handler(self.manager, options))
        self.http.daemon_threads = True
        self.rest_port = self.http.server_address[1]
        self._http_thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def start(self) -> "ModelServer":
        self.grpc_server.start()
        self._http_thread.start()
        return self

    def stop(self) -> None:
        self.manager.stop()
        self.http.shutdown()
        self.http.server_close()
        self.grpc_server.stop(grace=1.0)

    def wait(self) -> None:
        self.grpc_server.wait_for_termination()


__all__ = ["ModelServer", "ServerOptions", "ServingError"]
