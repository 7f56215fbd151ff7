"""serving/inputs.py: string inputs as UTF-8, and one dtype rule for REST and gRPC (both
protocols' checks on a `Servable`, without a server)."""


import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _grpc_predict, _histories, _rest_predict

from tfrs_logq.serving.client import make_request


def test_string_inputs_are_sent_to_the_model_as_utf8():
    """numpy's astype(bytes) is ASCII: non-ASCII raw ids were refused."""
    from tfrs_logq.serving.inputs import _utf8_strings

    encoded = _utf8_strings(np.array([["café", "b"]]))
    assert encoded.tolist() == [["café".encode(), b"b"]]
    assert _utf8_strings(np.array([b"x\xff"], dtype=object)).tolist() == [b"x\xff"]  # gRPC
    with pytest.raises(ValueError, match="surrogates"):
        _utf8_strings(np.array(["\ud800"]))  # JSON's "\ud800" escape: no UTF-8 for it
    with pytest.raises(TypeError, match="expected strings"):
        _utf8_strings(np.array([1, 2]))


# (history sent, whether the model's int64 input accepts it): one rule for both protocols
_DTYPE_CASES = [
    ("int64", np.array([[101, 102]], np.int64), True),
    ("int32", np.array([[101, 102]], np.int32), True),
    ("float_integral", np.array([[101.0, 102.0]], np.float32), False),
    ("float_fraction", np.array([[101.5, 102.0]], np.float64), False),
    ("bool", np.array([[True, False]]), False),
    ("string", np.array([["101", "102"]]), False),
]


@pytest.mark.parametrize("case,history,accepted", _DTYPE_CASES, ids=[c[0] for c in _DTYPE_CASES])
def test_rest_and_grpc_apply_the_same_dtype_rules(servable, case, history, accepted):
    """gRPC cast a float32 history to integers while REST refused floats."""
    request = make_request("ml", _histories())
    request.inputs["history"].CopyFrom(tf.make_tensor_proto(history))
    status, outputs = _grpc_predict(servable, request)
    grpc_outcome = ("accepted", outputs["item_ids"].tolist()) if status == "OK" else \
        (status, outputs)
    code, reply = _rest_predict(servable, {"instances": history.tolist()})
    rest_outcome = ("accepted", [p["item_ids"] for p in reply["predictions"]]) \
        if code == 200 else (code, reply["error"])
    if accepted:
        assert grpc_outcome == rest_outcome and grpc_outcome[0] == "accepted"
    else:
        assert grpc_outcome[0] == "INVALID_ARGUMENT" and rest_outcome[0] == 400
        for details in (grpc_outcome[1], rest_outcome[1]):
            assert "'history'" in details and "int64" in details, details
            assert "\n" not in details
