"""A servable with text item ids: a request's memory follows its bytes whatever its ids'
widths, rows of text ids are checked as such, and an id is found at serving time if and
only if the training log's reader found it (`tfrs_logq.pipelines.ids`)."""

import csv
import json
import resource
import threading
import tracemalloc

import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _http, _tiny_export

from tfrs_logq.serving.client import make_request, predict_stub

MAX_LENGTH = 50
ITEMS = np.array([f"SKU-{i:06d}" for i in range(1, 301)])


@pytest.fixture(scope="module")
def string_export(tmp_path_factory):
    """A brute-force export of an untrained SASRec encoder over 300 text ids."""
    base = tmp_path_factory.mktemp("string_ids") / "text"
    _tiny_export(base, ITEMS, max_length=MAX_LENGTH, default_k=5)
    return base


@pytest.fixture(scope="module")
def string_server(string_export):
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    options = ServerOptions(model_name="text", port=0, rest_api_port=0,
                            model_base_path=str(string_export),
                            file_system_poll_wait_seconds=0.2)
    server = ModelServer(options).start()
    yield server
    server.stop(0)


def _wide_history_body(long_id: int = 5000) -> bytes:
    """1,024 x 50 short ids and one of ``long_id`` characters (263 kB): numpy's
    fixed-width strings would make all 51,200 cells that wide (1 GB)."""
    rows = [[f"{(r + c) % 100:02d}" for c in range(MAX_LENGTH)] for r in range(1024)]
    rows[0][0] = "x" * long_id
    return json.dumps({"signature_name": "top_k", "inputs": {"history": rows, "k": 1}},
                      separators=(",", ":")).encode()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def test_decoding_a_request_of_wide_ids_takes_memory_in_proportion_to_its_bytes(
        string_server):
    """The JSON decoding and input checks of a 263 kB body (one 5,000-character id among
    51,200 short ones): numpy's fixed-width string array took 1 GB (2.8 GB peak)."""
    from tfrs_logq.serving.rest_api import _decode_json, json_inputs

    servable = string_server.manager.get("text", None)
    body = _wide_history_body()
    assert len(body) < 270_000
    tracemalloc.start()
    try:
        request = _decode_json(body)
        checked = servable.validate("top_k", json_inputs(servable, "top_k", request, False))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert checked["inputs"]["history"].shape == (1024, MAX_LENGTH)
    assert peak < 40 * len(body), f"{peak:,} bytes traced for a {len(body):,}-byte body"


@pytest.mark.parametrize("clients", [1, 3])
def test_a_request_of_wide_ids_is_answered_within_200_mb(string_server, clients):
    """The whole request on the in-process server, alone and three at once: the peak
    RSS grows less than 200 MB (it grew 2 GB; a 9 MB id made a 500 MemoryError)."""
    body = _wide_history_body()
    before = _peak_rss_bytes()
    results = []

    def call():
        results.append(_http(string_server, "POST", "/v1/models/text:predict", body))

    threads = [threading.Thread(target=call) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [code for code, _ in results] == [200] * clients, results[:1]
    assert len(results[0][1]["outputs"]["item_ids"]) == 1024
    assert _peak_rss_bytes() - before < 200 * 2**20


def test_an_id_of_9_mb_is_answered_not_a_memory_error(string_server):
    """A 500 MemoryError: 51,200 cells of 9 million characters each."""
    before = _peak_rss_bytes()
    code, reply = _http(string_server, "POST", "/v1/models/text:predict",
                        _wide_history_body(long_id=9_000_000))
    assert code == 200, reply
    assert len(reply["outputs"]["item_ids"]) == 1024
    assert _peak_rss_bytes() - before < 200 * 2**20


def test_rows_of_ids_are_described_as_such(string_server):
    """An empty row was refused as "expected strings, got float64"; a row of numbers
    for text ids now says the rows must be lists of strings."""
    code, reply = _http(string_server, "POST", "/v1/models/text:predict",
                        {"instances": [[]]})
    padding = _http(string_server, "POST", "/v1/models/text:predict", {"instances": [[""]]})
    assert code == 200 and reply == padding[1], reply  # no items: the padding's answer
    code, reply = _http(string_server, "POST", "/v1/models/text:predict",
                        {"instances": [[1, 2]]})
    assert code == 400
    assert reply["error"] == ("input 'history' must be string: its rows must be lists of "
                              "strings, got int64"), reply
    code, reply = _http(string_server, "POST", "/v1/models/text:predict",
                        {"instances": [["SKU-000001"], ["SKU-000001", "SKU-000002"]]})
    assert code == 400 and 'pad shorter rows with ""' in reply["error"], reply


def _loader_finds(tmp_path, raw_id: str) -> bool:
    """Whether the training log's reader keeps ``raw_id`` as an item of ITEMS."""
    from tfrs_logq.pipelines.user_log import UserLogSource, read_user_log

    path = tmp_path / "log.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["user", "item"]] + [[f"u{i}", raw_id] for i in range(3)])
    raw = read_user_log(UserLogSource(str(path), "user", "item"))
    return set(raw.items.values().tolist()) <= set(ITEMS.tolist())


@pytest.mark.parametrize("raw_id", [
    "SKU-000280", " SKU-000280 ", "SKU-000280\t", "\u00a0SKU-000280\u3000", "\r\nSKU-000280",
    "SKU-000280\u200b",  # a zero-width space is not white space: another id
    "sku-000280", "SKU- 000280", "SKU-0000280",
])
def test_a_padded_id_is_served_if_and_only_if_training_read_it(string_server, tmp_path,
                                                                raw_id):
    """" SKU-000280 " was the training log's SKU-000280 and unknown at serving time."""
    known = _loader_finds(tmp_path, raw_id)
    assert known == (raw_id.strip(" \t\r\n\u00a0\u3000") == "SKU-000280")

    def served(history) -> list:
        code, reply = _http(string_server, "POST", "/v1/models/text:predict",
                            {"signature_name": "top_k", "inputs": {
                                "history": history, "k": 299, "exclude_history": True}})
        assert code == 200, reply
        return reply["outputs"]["item_ids"][0]

    # An id in the history is left out of the answer (299 of the 300) iff the model knows it.
    assert ("SKU-000280" not in served([[raw_id]])) == known
    stub, channel = predict_stub(f"127.0.0.1:{string_server.port}")
    try:
        request = make_request("text", np.array([[raw_id.encode()]], object), k=299)
        answer = tf.make_ndarray(stub.Predict(request, timeout=30).outputs["item_ids"])
    finally:
        channel.close()
    assert (b"SKU-000280" not in answer[0].tolist()) == known


def test_the_id_rule_is_one_in_python_arrow_and_the_graph():
    import pyarrow as pa

    from tfrs_logq.pipelines.ids import (
        ID_WHITESPACE,
        normalize_id,
        normalize_id_column,
        normalize_id_tensor,
    )

    samples = [c + "a b" + c for c in ID_WHITESPACE] + [
        ID_WHITESPACE + "x" + ID_WHITESPACE, "", " ", "\u200bx", "x\x1f", "é ", "a\u00a0b"]
    python = [normalize_id(x) for x in samples]
    assert python[:len(ID_WHITESPACE)] == ["a b"] * len(ID_WHITESPACE)
    assert python[-5:] == ["", "\u200bx", "x\x1f", "é", "a\u00a0b"]
    assert normalize_id_column(pa.array(samples)).to_pylist() == python
    graph = normalize_id_tensor(tf.constant(samples)).numpy().tolist()
    assert [x.decode() for x in graph] == python
    assert [normalize_id(x.encode()) for x in samples] == [x.encode() for x in python]
    assert normalize_id(b"\xff ") == b"\xff "  # not UTF-8: no text id equals it


def test_the_vocabulary_looks_ids_up_by_the_same_rule():
    from tfrs_logq.pipelines.vocabulary import Vocabulary

    items = Vocabulary("items", np.array(["tt01", "tt07"]))
    assert items.to_internal([" tt07\t", "\u3000tt01"]).tolist() == [2, 1]
    assert items.to_internal(["tt 07", "TT07"], missing=0).tolist() == [0, 0]


@pytest.mark.parametrize("ids,fragment", [
    (["a", " a", "b"], "'a' and ' a' are one id"),
    (["a", "\t", "b"], "only white space"),
])
def test_an_export_refuses_ids_that_normalise_to_one_or_to_padding(ids, fragment):
    from tfrs_logq.sasrec.models import SASRecEncoder
    from tfrs_logq.serving.export import RetrievalModule

    encoder = SASRecEncoder(len(ids) + 1, 4, 8, 1, 1, 0.0)
    encoder(tf.zeros([1, 4], tf.int32))
    with pytest.raises(ValueError, match=fragment):
        RetrievalModule(encoder, np.array(ids), "brute-force", default_k=2)
