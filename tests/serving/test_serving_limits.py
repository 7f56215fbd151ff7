"""Bounds at the door: declared shapes checked before anything is built, the
dtype rule on a tensor's value fields (both on a `Servable`, without a server), rows x k
per request and per batch, reply sizes, versions within int64, and client strings cut
short in errors (through servers on an untrained export)."""

import os
import resource
import shutil

import grpc
import numpy as np
import pytest
from serving_helpers import _grpc_predict, _histories, _http, _wait_for
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from tfrs_logq.serving.batching import Batcher
from tfrs_logq.serving.client import make_request, predict_stub
from tfrs_logq.serving.server import ModelServer, ServerOptions


def _tensor(dtype, shape, **values):
    return tensor_pb2.TensorProto(
        dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=s) for s in shape]), **values)


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def test_a_39_byte_request_declaring_a_huge_history_is_refused_before_it_is_built(servable):
    """[1024, 200000] with one int64_val was filled in (1.6 GB) before its length was
    checked. Counted in bytes: what Python and numpy allocated while refusing it
    (tracemalloc), and the process's peak."""
    import tracemalloc

    request = make_request("ml", _histories())
    request.inputs["history"].CopyFrom(_tensor(types_pb2.DT_INT64, [1024, 200_000],
                                               int64_val=[101]))
    assert request.inputs["history"].ByteSize() < 40
    peak = _peak_rss_bytes()
    tracemalloc.start()
    try:
        status, details = _grpc_predict(servable, request)
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == "INVALID_ARGUMENT"
    assert "200000" in details and "at most 30" in details, details
    assert allocated < 64 * 2**20, allocated  # 1024 x 200000 int64 is 1.6 GB
    assert _peak_rss_bytes() - peak < 400 * 2**20


@pytest.mark.parametrize("shape,fragments", [
    ([100_000, 1], ["100000 rows", "max_request_rows"]),
    ([2, 3, 4], ["rank 2"]),
    ([2, -1], ["at least 0"]),
])
def test_grpc_declared_shapes_beyond_the_limits_are_refused(servable, shape, fragments):
    request = make_request("ml", _histories())
    request.inputs["history"].CopyFrom(_tensor(types_pb2.DT_INT64, shape, int64_val=[101]))
    status, details = _grpc_predict(servable, request)
    assert status == "INVALID_ARGUMENT" and "\n" not in details
    for fragment in fragments:
        assert fragment in details, details


@pytest.mark.parametrize("case,fragment", [
    ("float_val_on_int64", "carries float_val"),  # was read as zeros: a 200 for history 0
    ("int_val_on_int64", "carries int_val"),
    ("string_val_on_int64", "carries string_val"),
    ("content_too_short", "tensor_content must be 48 bytes"),
    ("content_and_values", "both tensor_content and int64_val"),
    ("more_values_than_declared", "carries 7 in int64_val"),
])
def test_grpc_values_must_sit_in_the_field_of_their_dtype(servable, case, fragment):
    values = {
        "float_val_on_int64": {"float_val": [101.0, 102.0]},
        "int_val_on_int64": {"int_val": [101, 102]},
        "string_val_on_int64": {"string_val": [b"101"]},
        "content_too_short": {"tensor_content": np.array([101], np.int64).tobytes()},
        "content_and_values": {"tensor_content": np.arange(6, dtype=np.int64).tobytes(),
                               "int64_val": [101]},
        "more_values_than_declared": {"int64_val": list(range(100, 107))},
    }[case]
    request = make_request("ml", _histories())
    request.inputs["history"].CopyFrom(_tensor(types_pb2.DT_INT64, [2, 3], **values))
    status, details = _grpc_predict(servable, request)
    assert status == "INVALID_ARGUMENT"
    assert fragment in details and "'history'" in details and "\n" not in details, details


def test_grpc_values_in_their_own_field_are_read_with_tensorflows_padding_rule(servable):
    """Fewer values than declared: the last one repeats (TensorFlow's rule)."""
    request = make_request("ml", _histories())
    request.inputs["history"].CopyFrom(_tensor(types_pb2.DT_INT64, [2, 3],
                                               int64_val=[101, 102, 103, 104]))
    padded = np.array([[101, 102, 103], [104, 104, 104]], np.int64)
    np.testing.assert_array_equal(
        servable.arrays_from_protos("", request.inputs)["history"], padded)
    got, expected = (_grpc_predict(servable, r) for r in (request, make_request("ml", padded)))
    assert got[0] == "OK" and got[1]["item_ids"].tolist() == expected[1]["item_ids"].tolist()


@pytest.fixture(scope="module")
def bounded_server(tiny_export):
    """max_rows_times_k 100 and replies of at most 3,000 bytes, on the 40-item catalog."""
    options = ServerOptions(model_name="b", port=0, rest_api_port=0,
                            model_base_path=os.path.dirname(tiny_export),
                            max_rows_times_k=100, max_response_bytes=3000)
    srv = ModelServer(options).start()
    yield srv
    srv.stop(0)


def test_rows_times_k_is_bounded_on_both_protocols(bounded_server):
    """1,024 rows x the whole catalog answered 200 with a 90 MB reply in 4.1 s, and
    stalled the requests beside it."""
    srv = bounded_server
    rows = np.array([[101, 102]] * 4, np.int64)
    body = {"signature_name": "top_k", "inputs": {"history": rows.tolist(), "k": 29}}
    code, reply = _http(srv, "POST", "/v1/models/b:predict", body)
    assert code == 400, reply
    assert reply["error"].startswith("4 rows x k=29 = 116 results; at most 100"), reply
    assert "max_rows_times_k" in reply["error"] and "\n" not in reply["error"]
    stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(make_request("b", rows, k=29), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_rows_times_k" in info.value.details()
    # serving_default counts the export's default_k (10): 11 rows x 10 > 100.
    code, reply = _http(srv, "POST", "/v1/models/b:predict",
                        {"instances": [[101]] * 11})
    assert code == 400 and "11 rows x k=10" in reply["error"], reply
    assert stub.Predict(make_request("b", rows[:3], k=29), timeout=30).outputs["item_ids"]
    channel.close()


def test_replies_are_bounded_on_both_protocols(bounded_server):
    srv = bounded_server
    rows = np.array([[101, 102]] * 100, np.int64)  # 100 x 16 floats: 6,400 bytes at least
    body = {"signature_name": "query_embedding", "inputs": {"history": rows.tolist()}}
    code, reply = _http(srv, "POST", "/v1/models/b:predict", body)
    assert code == 400 and "max_response_bytes" in reply["error"], reply
    stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
    request = make_request("b", rows, signature_name="query_embedding")
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_response_bytes" in info.value.details()
    channel.close()


def test_a_batch_stops_growing_before_rows_times_its_largest_k_passes_the_bound():
    """A batch runs with its largest k: one request for many results made every small
    request batched beside it compute as many."""
    calls = []

    def call(name, inputs):
        calls.append((inputs["history"].shape[0], int(inputs["k"])))
        n, k = inputs["history"].shape[0], int(inputs["k"])
        return {"item_ids": np.zeros((n, k), np.int64), "scores": np.zeros((n, k))}

    # No clock decides the batches: the window (60 s) outlasts the test, and a batch ends
    # when the next request does not fit (rows x k) or at max_batch_size rows (12: the
    # three small requests).
    batcher = Batcher(call, max_batch_size=12, batch_timeout_micros=60_000_000,
                      request_timeout_in_ms=60_000, max_batch_rows_times_k=100)
    import concurrent.futures

    big = {"history": np.zeros((2, 3), np.int64), "k": np.int32(40)}  # 80 results
    small = {"history": np.zeros((4, 3), np.int64), "k": np.int32(5)}  # 20; with big: 240
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(batcher.run, "top_k", big, 40)]
        _wait_for(lambda: batcher._queues != {}, what="the big request queued first")
        futures += [pool.submit(batcher.run, "top_k", small, 5) for _ in range(3)]
        shapes = [f.result(timeout=60)["item_ids"].shape for f in futures]
    batcher.close()
    assert shapes == [(2, 40), (4, 5), (4, 5), (4, 5)]
    # The big one alone (a small one beside it: 6 rows x 40 > 100), then the three small.
    assert calls == [(2, 40), (12, 5)], calls


def test_a_version_beyond_int64_is_refused_and_shown_in_the_status(tiny_export, tmp_path):
    """It was served: REST worked, every gRPC Predict and GetModelStatus failed with
    UNKNOWN 'Value out of range', nothing logged."""
    base = tmp_path / "base"
    shutil.copytree(tiny_export, base / "1")
    shutil.copytree(tiny_export, base / "99999999999999999999")
    (base / "²").mkdir()  # str.isdigit() is True, int() refuses it: the poll must not stop
    options = ServerOptions(model_name="v", port=0, rest_api_port=0, model_base_path=str(base))
    srv = ModelServer(options).start()
    try:
        code, body = _http(srv, "GET", "/v1/models/v")
        assert code == 200
        statuses = {s["version"]: s for s in body["model_version_status"]}
        assert statuses["1"]["state"] == "AVAILABLE"
        big = statuses["99999999999999999999"]
        assert big["state"] == "END" and big["status"]["error_code"] == "INVALID_ARGUMENT"
        assert "int64" in big["status"]["error_message"]
        stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
        assert stub.Predict(make_request("v", _histories()), timeout=30) \
            .model_spec.version.value == 1
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "v"}), timeout=30)
        assert [s.version for s in status.model_version_status] == [1]
        channel.close()
        code, reply = _http(srv, "GET", "/v1/models/v/versions/99999999999999999999")
        assert code == 400 and "Malformed version" in reply["error"], reply
    finally:
        srv.stop(0)


def test_export_refuses_a_version_beyond_int64_before_loading_the_model(tmp_path):
    from tfrs_logq.serving.export import export_version

    with pytest.raises(ValueError, match="at most 9223372036854775807"):
        export_version(str(tmp_path / "no-model-needed"), str(tmp_path / "base"),
                       version=99999999999999999999, index="brute-force")
    assert not (tmp_path / "base").exists()


def test_export_cli_refuses_a_version_beyond_int64_in_one_line(capsys, tmp_path):
    from tfrs_logq import cli

    (tmp_path / "no-model-needed").mkdir()  # a run directory as far as the flag's check goes
    (tmp_path / "no-model-needed" / "config.json").write_text("{}")
    code = cli.main(["export", "--model-dir", str(tmp_path / "no-model-needed"),
                     "--model_base_path",
                     str(tmp_path / "base"), "--model_name", "x", "--version",
                     "99999999999999999999", "--index", "brute-force"])
    err = capsys.readouterr().err
    assert code != 0 and "int64" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "base").exists(), err


def test_client_strings_are_cut_short_in_errors(tiny_server):
    """A 100 KB model name was echoed back in the error."""
    long_name = "m" * 100_000
    request = make_request(long_name, _histories())
    stub, channel = predict_stub(f"127.0.0.1:{tiny_server.port}")
    for field in ("model", "signature"):
        if field == "signature":
            request = make_request("ml", _histories())
            request.model_spec.signature_name = long_name
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=30)
        assert len(info.value.details()) < 400 and "100000 characters" in \
            info.value.details(), info.value.details()[:400]
    channel.close()
    for method, path, body in [
            ("POST", f"/v1/models/{'m' * 8000}:predict", {"instances": [[101]]}),
            ("GET", f"/v1/models/{'m' * 8000}/metadata", None),
            ("POST", "/v1/models/ml:predict",
             {"signature_name": "s" * 100_000, "instances": [[101]]}),
            ("POST", "/v1/models/ml:predict",
             {"inputs": {"history": [[101]], "x" * 100_000: 1}}),
            ("GET", f"/v1/{'p' * 8000}", None)]:
        code, reply = _http(tiny_server, method, path, body)
        assert code in (400, 404) and len(reply["error"]) < 400, (code, reply["error"][:400])
        assert "characters)" in reply["error"], reply["error"][:400]
