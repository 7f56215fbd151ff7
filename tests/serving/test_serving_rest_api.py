"""serving/rest_api.py: TF Serving's /v1/models routes refuse bad JSON inputs, other
methods (a JSON 405), and take exclude_history only as a JSON boolean."""


import pytest
import tensorflow as tf
from serving_helpers import _histories, _http, _raw


@pytest.mark.parametrize("body,status,fragment", [
    (b'{"instances": [[1, 2', 400, "JSON"),
    ({"instances": [[1.5, 2]]}, 400, "int64"),
    ({"instances": [[1, 2], [3]]}, 400, "pad shorter rows with 0"),
    ({"instances": [[101, [102]], [103, 104]]}, 400, "rectangular"),
    ({"instances": [[True, 101]]}, 400, "one type"),  # was taken as [[1, 101]]
    ({"instances": [[101, None]]}, 400, "null"),
    ({"instances": [[1]], "inputs": [[1]]}, 400, "exactly one"),
    ({"instances": [list(range(31))]}, 400, "at most 30"),
    ({"instances": [[1] * 30] * 3000}, 413, "exceeds the limit"),
])
def test_rest_bad_input(server, body, status, fragment):
    code, reply = _http(server, "POST", "/v1/models/ml:predict", body)
    assert code == status and fragment in reply["error"]
    assert _http(server, "POST", "/v1/models/nope:predict", {"instances": [[1]]})[0] == 404
    assert _http(server, "GET", "/v1/models/ml/versions/7")[0] == 404
    assert _http(server, "POST", "/v1/models/ml:predict", {"instances": [[101]]})[0] == 200


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_rest_other_methods_get_a_json_405(server, method):
    code, headers, reply = _raw(
        server, f"{method} /v1/models/ml HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}"
        .encode(), method=method)
    assert code == 405 and method in reply["error"], reply
    assert headers["Allow"] == "GET, HEAD"  # the status route's methods


@pytest.mark.parametrize("path", ["/v1/models/ml:predict", "/v1/models/ml/versions/1:predict"])
def test_rest_get_on_predict_is_a_405_naming_post(server, path):
    """``GET NAME:predict`` was the status of a model named "NAME:predict": 404
    "Servable not found"."""
    code, headers, reply = _raw(server, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
                                method="GET")
    assert code == 405 and headers["Allow"] == "POST", (code, reply)
    assert "GET" in reply["error"] and "answers POST" in reply["error"], reply


@pytest.mark.parametrize("value", ["false", "true", None, 0, 1, [False]])
def test_rest_exclude_history_takes_only_a_json_boolean(server, value):
    """``"false"`` (a string) was taken as true, null as false."""
    body = {"signature_name": "top_k",
            "inputs": {"history": _histories().tolist(), "k": 5, "exclude_history": value}}
    code, reply = _http(server, "POST", "/v1/models/ml:predict", body)
    assert code == 400 and "'exclude_history'" in reply["error"], reply


@pytest.mark.parametrize("value", [True, False])
def test_rest_exclude_history_booleans_equal_the_in_process_savedmodel(server, exports, value):
    local = tf.saved_model.load(exports["paths"]["scann"])
    expected = local.signatures["top_k"](history=tf.constant(_histories()), k=tf.constant(5),
                                         exclude_history=tf.constant(value))
    for body in ({"signature_name": "top_k", "inputs": {
                      "history": _histories().tolist(), "k": 5, "exclude_history": value}},
                 {"signature_name": "top_k", "instances": [
                     {"history": h, "k": 5, "exclude_history": value}
                     for h in _histories().tolist()]}):
        code, reply = _http(server, "POST", "/v1/models/ml:predict", body)
        assert code == 200, reply
        ids = reply["outputs"]["item_ids"] if "outputs" in reply else \
            [p["item_ids"] for p in reply["predictions"]]
        assert ids == expected["item_ids"].numpy().tolist()
