"""The gRPC front end: TF Serving's ``PredictionService`` and ``ModelService``.

``Predict``, ``GetModelMetadata`` and ``GetModelStatus`` with the official
``tensorflow-serving-api`` messages, so existing TF Serving clients work unchanged
(TF Serving's ``prediction_service_impl`` and ``model_service_impl``). Failures are
`ServingError` statuses (see ``errors``); inputs are checked as REST's are (``inputs``),
each tensor's declared shape before it is built. A reply over ``max_response_bytes`` is
refused (INVALID_ARGUMENT), not sent.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import time
from typing import Optional

import tensorflow as tf

from tfrs_logq.serving.drain import InFlight
from tfrs_logq.serving.errors import ServingError, shorten
from tfrs_logq.serving.health import GrpcHealth
from tfrs_logq.serving.manager import INT64_MAX, INT64_MIN, ModelManager
from tfrs_logq.serving.metrics import ServerMetrics
from tfrs_logq.serving.options import ServerOptions

# GetModelMetadata's fields: TF Serving's, and the export's index (kind, ScaNN's
# settings, the recall measured at export) as a google.protobuf.Struct.
METADATA_FIELDS = ("signature_def", "index")


def _version_of(spec) -> Optional[int]:
    if spec.HasField("version"):
        return int(spec.version.value)
    if spec.version_label:
        raise ServingError("INVALID_ARGUMENT", f"version labels are not supported (got "
                                               f"{shorten(spec.version_label)})")
    return None


_METHODS = {"Predict": "predict", "GetModelMetadata": "metadata",
            "GetModelStatus": "status"}  # the ``method`` label of each RPC


def _guarded(fn):
    """Counts the call in flight and in the metrics, and answers a `ServingError` with its
    status."""
    method = _METHODS[fn.__name__]

    @functools.wraps(fn)
    def wrapper(self, request, context):
        start, status = time.perf_counter(), "OK"
        signature = self.metrics.signature_label(
            request.model_spec.signature_name) if method == "predict" else ""
        try:
            with self.in_flight.track() as tracked:
                try:
                    response = fn(self, request, context)
                except ServingError as exc:
                    status = exc.code
                    context.abort(exc.grpc_status, str(exc))  # answered, with its error
                except Exception:
                    status = "INTERNAL"
                    raise
                tracked.cut = not context.is_active()  # cancelled, or cut by the drain
                if tracked.cut:
                    status = "CANCELLED"
                return response
        finally:
            self.metrics.observe_request("grpc", method, signature, status,
                                         time.perf_counter() - start)

    return wrapper


def _bounded(response, options: ServerOptions):
    size = response.ByteSize()
    if size > options.max_response_bytes:
        raise ServingError("INVALID_ARGUMENT",
                           f"the reply would be {size} bytes, over {options.max_response_bytes} "
                           "(max_response_bytes): send fewer rows or a smaller k")
    return response


def _services(manager: ModelManager, in_flight: InFlight, metrics: ServerMetrics):
    from google.protobuf import struct_pb2
    from tensorflow_serving.apis import (
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def __init__(self) -> None:
            self.in_flight, self.metrics = in_flight, metrics

        @_guarded
        def Predict(self, request, context):  # noqa: N802 (gRPC method name)
            servable = manager.get(request.model_spec.name, _version_of(request.model_spec))
            signature = request.model_spec.signature_name
            inputs = servable.arrays_from_protos(signature, request.inputs)
            checked = servable.validate(signature, inputs)
            outputs = servable.run(checked)
            response = predict_pb2.PredictResponse()
            response.model_spec.name = request.model_spec.name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = checked["signature"]
            wanted = set(request.output_filter) or set(outputs)
            for key, value in outputs.items():
                if key in wanted:
                    response.outputs[key].CopyFrom(tf.make_tensor_proto(value))
            return _bounded(response, manager.options)

        @_guarded
        def GetModelMetadata(self, request, context):  # noqa: N802
            # TF Serving's one field, "signature_def" (a SignatureDefMap), and ours,
            # "index" (a Struct: what REST's metadata.index holds, `index_summary`).
            servable = manager.get(request.model_spec.name, _version_of(request.model_spec))
            fields = set(request.metadata_field)
            if not fields or not fields <= set(METADATA_FIELDS):
                raise ServingError("INVALID_ARGUMENT",
                                   "Metadata field(s) must be among ['signature_def', 'index'], "
                                   "got [" + ", ".join(shorten(f) for f in sorted(fields)[:4])
                                   + "]")
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = request.model_spec.name
            response.model_spec.version.value = servable.version
            if "signature_def" in fields:
                signature_map = get_model_metadata_pb2.SignatureDefMap()
                for key, value in servable.signature_defs.items():
                    signature_map.signature_def[key].CopyFrom(value)
                response.metadata["signature_def"].Pack(signature_map)
            if "index" in fields:
                index = struct_pb2.Struct()
                index.update(json.loads(json.dumps(servable.index_summary())))
                response.metadata["index"].Pack(index)
            return response

    class ModelService(model_service_pb2_grpc.ModelServiceServicer):
        def __init__(self) -> None:
            self.in_flight, self.metrics = in_flight, metrics

        @_guarded
        def GetModelStatus(self, request, context):  # noqa: N802
            from tensorflow.core.protobuf import error_codes_pb2

            response = get_model_status_pb2.GetModelStatusResponse()
            states = get_model_status_pb2.ModelVersionStatus.State
            for version in manager.status(request.model_spec.name,
                                          _version_of(request.model_spec)):
                if not INT64_MIN <= version.version <= INT64_MAX:
                    continue  # a directory beyond int64 (REST's status lists it)
                status = response.model_version_status.add()
                status.version = version.version
                status.state = states.Value(version.state)
                status.status.error_code = error_codes_pb2.Code.Value(version.error_code)
                status.status.error_message = version.error_message
            return response

    return PredictionService(), ModelService(), prediction_service_pb2_grpc, model_service_pb2_grpc


def build_grpc_server(options: ServerOptions):
    """A ``grpc.server`` on ``options.num_threads`` workers, not yet bound.

    ``grpc.so_reuseport`` is off (grpc sets it by default): otherwise a second server
    on the same port would start and take half of the new connections.
    """
    import grpc

    return grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=options.num_threads,
                                              thread_name_prefix="tfrs-logq-grpc"),
        options=[("grpc.max_receive_message_length", options.max_request_bytes),
                 ("grpc.max_send_message_length", options.max_response_bytes),
                 ("grpc.so_reuseport", 0)])


def add_services(server, manager: ModelManager, in_flight: InFlight,
                 metrics: ServerMetrics) -> GrpcHealth:
    """Adds TF Serving's two services and the gRPC health service (`health.GrpcHealth`,
    returned) to ``server``."""
    prediction, model_service, pred_grpc, model_grpc = _services(manager, in_flight, metrics)
    pred_grpc.add_PredictionServiceServicer_to_server(prediction, server)
    model_grpc.add_ModelServiceServicer_to_server(model_service, server)
    health = GrpcHealth(manager)
    health.add_to(server)
    return health


def bind_grpc(server, host: str, port: int) -> int:
    """Binds ``server`` to ``host:port``; the bound port, or an OSError that says why not."""
    from tfrs_logq.serving.http_server import bind_error

    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else \
        f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpc >= 1.5x raises "Failed to bind to address ..."
        bound, reason = 0, exc
    else:
        reason = None
    if not bound:
        raise bind_error("gRPC", "port", host, port, reason)
    return bound


__all__ = ["METADATA_FIELDS", "add_services", "bind_grpc", "build_grpc_server"]
