"""serving/grpc_service.py: a bad gRPC request gets a clear status in one line (the input
checks on a `Servable`, then once through a running server, with the model lookup) and
the server keeps serving."""


import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _grpc_predict, _histories

from tfrs_logq.serving.client import make_request, predict_stub


@pytest.mark.parametrize("case,fragment", [
    ("float_history", "'history' must be int64"),
    ("rank_one", "rank 2"),
    ("too_long", "at most 30"),
    ("missing_input", "missing"),
    ("bad_k", "k must be in [1, 40]"),
    ("k_beyond_int32", f"k must be in [1, 40], got {2**32 + 5}"),  # wrapped to int32: k=5
    ("unknown_signature", "'nope' not found"),
])
def test_grpc_bad_input_gets_invalid_argument_in_one_line(servable, case, fragment):
    from tensorflow_serving.apis import predict_pb2

    request = make_request("ml", _histories())
    if case == "float_history":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([[1.5, 2.0]])))
    elif case == "rank_one":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([101, 102])))
    elif case == "too_long":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.ones((1, 31), np.int64)))
    elif case == "missing_input":
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "ml"
    elif case == "bad_k":
        request = make_request("ml", _histories(), k=10_000)
    elif case == "k_beyond_int32":
        request = make_request("ml", _histories(), k=3)
        request.inputs["k"].CopyFrom(tf.make_tensor_proto(np.int64(2**32 + 5)))
    elif case == "unknown_signature":
        request.model_spec.signature_name = "nope"
    status, details = _grpc_predict(servable, request)
    assert status == "INVALID_ARGUMENT" and fragment in details, (status, details)
    assert "\n" not in details


def test_grpc_bad_requests_through_the_server(tiny_server):
    """The wiring: a refused input is INVALID_ARGUMENT with its one-line details, an
    unknown model or version NOT_FOUND, and the server answers the next request."""
    stub, channel = predict_stub(f"127.0.0.1:{tiny_server.port}")
    try:
        bad = make_request("ml", _histories())
        bad.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([[1.5, 2.0]])))
        unknown_model = make_request("other", _histories())
        unknown_version = make_request("ml", _histories())
        unknown_version.model_spec.version.value = 99
        for request, code, fragment in [
                (bad, grpc.StatusCode.INVALID_ARGUMENT, "'history' must be int64"),
                (unknown_model, grpc.StatusCode.NOT_FOUND, "Latest(other)"),
                (unknown_version, grpc.StatusCode.NOT_FOUND, "99")]:
            with pytest.raises(grpc.RpcError) as info:
                stub.Predict(request, timeout=30)
            details = info.value.details()
            assert info.value.code() == code and fragment in details, (code, details)
            assert "\n" not in details
        ok = stub.Predict(make_request("ml", _histories()), timeout=30)
        assert ok.outputs["item_ids"].tensor_shape.dim[0].size == 3
    finally:
        channel.close()

