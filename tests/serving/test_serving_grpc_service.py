"""serving/grpc_service.py: a bad gRPC request gets a clear status and the server
keeps serving."""


import grpc
import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _histories

from tfrs_logq.serving.client import make_request, predict_stub


@pytest.mark.parametrize("case", [
    "float_history", "rank_one", "unknown_model", "unknown_version", "too_long",
    "missing_input", "bad_k", "k_beyond_int32", "unknown_signature"])
def test_grpc_bad_input_gets_a_clear_status_and_server_keeps_serving(server, case):
    from tensorflow_serving.apis import predict_pb2

    stub, channel = predict_stub(f"127.0.0.1:{server.port}")
    request = make_request("ml", _histories())
    expected = grpc.StatusCode.INVALID_ARGUMENT
    if case == "float_history":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([[1.5, 2.0]])))
    elif case == "rank_one":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.array([101, 102])))
    elif case == "unknown_model":
        request.model_spec.name, expected = "other", grpc.StatusCode.NOT_FOUND
    elif case == "unknown_version":
        request.model_spec.version.value, expected = 99, grpc.StatusCode.NOT_FOUND
    elif case == "too_long":
        request.inputs["history"].CopyFrom(tf.make_tensor_proto(np.ones((1, 31), np.int64)))
    elif case == "missing_input":
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "ml"
    elif case == "bad_k":
        request = make_request("ml", _histories(), k=10_000)
    elif case == "k_beyond_int32":  # used to wrap to int32: k=5
        request = make_request("ml", _histories(), k=3)
        request.inputs["k"].CopyFrom(tf.make_tensor_proto(np.int64(2**32 + 5)))
    elif case == "unknown_signature":
        request.model_spec.signature_name = "nope"
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    assert info.value.code() == expected
    assert info.value.details()  # says what was wrong
    if case == "k_beyond_int32":
        assert "k must be in [1, " in info.value.details() and str(2**32 + 5) in \
            info.value.details()
    ok = stub.Predict(make_request("ml", _histories()), timeout=30)
    assert ok.outputs["item_ids"].tensor_shape.dim[0].size == 3
    channel.close()
