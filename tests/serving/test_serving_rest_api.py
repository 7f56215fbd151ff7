"""serving/rest_api.py: TF Serving's /v1/models routes refuse bad JSON inputs in one line
(checked on a `Servable`, then once through a running server), other methods (a JSON
405), and take exclude_history only as a JSON boolean."""


import pytest
import tensorflow as tf
from serving_helpers import _histories, _http, _predict_body, _raw, _rest_predict


@pytest.mark.parametrize("body,fragment", [
    (b'{"instances": [[1, 2', "JSON"),
    (b"[[101]]", "must be an object"),
    ({"instances": [[1.5, 2]]}, "int64"),
    ({"instances": [[1, 2], [3]]}, "pad shorter rows with 0"),
    ({"instances": [[101, [102]], [103, 104]]}, "rectangular"),
    ({"instances": [[True, 101]]}, "one type"),  # was taken as [[1, 101]]
    ({"instances": [[101, None]]}, "null"),
    ({"instances": [[1]], "inputs": [[1]]}, "exactly one"),
    ({"instances": []}, "non-empty list"),
    ({"instances": [list(range(31))]}, "at most 30"),
    ({"instances": [[101]], "signature_name": 3}, "'signature_name' must be a string"),
    ({"instances": [[101]], "signature_name": "nope"}, "'nope' not found"),
    ({"inputs": {"history": [[101]], "extra": 1}}, "unknown input(s) ['extra']"),
])
def test_rest_bad_input_is_refused_in_one_line(servable, body, fragment):
    code, reply = _rest_predict(servable, body)
    assert code == 400 and fragment in reply["error"], (code, reply)
    assert "\n" not in reply["error"]


@pytest.mark.parametrize("body,fragments", [
    (b'{"instances": ' + b"[" * 100_000, ["nest"]),
    (_predict_body(k=2**32 + 5), ["k must be in [1, 40]", str(2**32 + 5)]),
    (_predict_body(k=2**70), ["k must be in [1, 40]", str(2**70)]),
    (_predict_body(k=0), ["k must be in [1, 40]"]),
    (_predict_body(k=True), ["'k'", "integers"]),
    (b'{"instances": [[1, %d]]}' % 2**64, ["history", "int64"]),
    (b'{"instances": [[101]], "signature_name": "\xff\xfe"}', ["UTF-8", "0xff"]),
    (b'{"instances": [[101]], "signature_name": "\xed\xa0\x80"}', ["UTF-8"]),
    (b'{"instances": [[1%s]]}' % (b"1" * 5000), ["JSON"]),
], ids=["deep_json", "k_beyond_int32", "k_beyond_int64", "k_zero", "k_bool",
        "history_beyond_int64", "invalid_utf8", "utf8_surrogate", "integer_of_5000_digits"])
def test_rest_bodies_the_json_rules_refuse(servable, body, fragments):
    code, reply = _rest_predict(servable, body)
    assert code == 400 and "\n" not in reply["error"], (code, reply)
    for fragment in fragments:
        assert fragment in reply["error"], (fragment, reply)


def test_rest_bad_input_through_the_server(tiny_server):
    """The wiring: a refused input is a 400 with its one-line error, an unknown model or
    version a 404, and the server answers the next request."""
    code, reply = _http(tiny_server, "POST", "/v1/models/ml:predict",
                        {"instances": [[1.5, 2]]})
    assert code == 400 and "'history'" in reply["error"] and "int64" in reply["error"], reply
    assert "\n" not in reply["error"]
    assert _http(tiny_server, "POST", "/v1/models/nope:predict", {"instances": [[1]]})[0] == 404
    assert _http(tiny_server, "GET", "/v1/models/ml/versions/7")[0] == 404
    code, reply = _http(tiny_server, "POST", "/v1/models/ml:predict", {"instances": [[101]]})
    assert code == 200 and len(reply["predictions"][0]["item_ids"]) == 10, reply


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_rest_other_methods_get_a_json_405(tiny_server, method):
    code, headers, reply = _raw(
        tiny_server, f"{method} /v1/models/ml HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}"
        .encode(), method=method)
    assert code == 405 and method in reply["error"], reply
    assert headers["Allow"] == "GET, HEAD"  # the status route's methods


@pytest.mark.parametrize("path", ["/v1/models/ml:predict", "/v1/models/ml/versions/1:predict"])
def test_rest_get_on_predict_is_a_405_naming_post(tiny_server, path):
    """``GET NAME:predict`` was the status of a model named "NAME:predict": 404
    "Servable not found"."""
    code, headers, reply = _raw(tiny_server, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
                                method="GET")
    assert code == 405 and headers["Allow"] == "POST", (code, reply)
    assert "GET" in reply["error"] and "answers POST" in reply["error"], reply


@pytest.mark.parametrize("value", ["false", "true", None, 0, 1, [False]])
def test_rest_exclude_history_takes_only_a_json_boolean(servable, value):
    """``"false"`` (a string) was taken as true, null as false."""
    body = {"signature_name": "top_k",
            "inputs": {"history": _histories().tolist(), "k": 5, "exclude_history": value}}
    code, reply = _rest_predict(servable, body)
    assert code == 400 and "'exclude_history'" in reply["error"], reply


@pytest.mark.parametrize("value", [True, False])
def test_rest_exclude_history_booleans_equal_the_in_process_savedmodel(servable, value):
    """Over the whole catalog (k 40), so the two values rank the histories' items apart."""
    def top_k(exclude):
        return servable.model.signatures["top_k"](
            history=tf.constant(_histories()), k=tf.constant(40),
            exclude_history=tf.constant(exclude))["item_ids"].numpy().tolist()

    expected = top_k(value)
    assert expected != top_k(not value)
    for body in ({"signature_name": "top_k", "inputs": {
                      "history": _histories().tolist(), "k": 40, "exclude_history": value}},
                 {"signature_name": "top_k", "instances": [
                     {"history": h, "k": 40, "exclude_history": value}
                     for h in _histories().tolist()]}):
        code, reply = _rest_predict(servable, body)
        assert code == 200, reply
        ids = reply["outputs"]["item_ids"] if "outputs" in reply else \
            [p["item_ids"] for p in reply["predictions"]]
        assert ids == expected
