"""serving/faiss_index.py and the faiss export: built as an exact search it returns brute
force's top-k, tuned it records the recall it measured (recomputed here from the written
index), a target it cannot reach and a missing faiss are refused in one line, and the
server checks the index of each version and swaps versions without failing a request."""

import json
import os
import shutil
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from serving_helpers import _wait_for

from tfrs_logq import cli
from tfrs_logq.serving import export as export_lib
from tfrs_logq.serving.export import RetrievalModule, describe_index, export_version
from tfrs_logq.serving.faiss_index import FaissIndex, faiss_parameters
from tfrs_logq.serving.scann_tuning import exact_top_k, recall_at_k

RAW_IDS = np.arange(100, 400)  # 300 items
MAX_LENGTH = 5


def _encoder(num_items, seed=0):
    from tfrs_logq.sasrec.models import SASRecEncoder

    tf.keras.utils.set_random_seed(seed)
    encoder = SASRecEncoder(num_items + 1, MAX_LENGTH, 8, 1, 1, 0.0)
    encoder(tf.zeros([1, MAX_LENGTH], tf.int32))
    return encoder


def _queries(encoder, count, seed=0):
    """Query embeddings of random histories of the catalog's items (internal ids)."""
    rng = np.random.default_rng(seed)
    histories = rng.integers(1, len(RAW_IDS) + 1, (count, MAX_LENGTH)).astype(np.int32)
    return encoder.last_query(histories, training=False).numpy().astype(np.float32)


def _faiss_export(base, seed=0, **kwargs) -> str:
    encoder = _encoder(len(RAW_IDS), seed)
    module = RetrievalModule(encoder, RAW_IDS, "faiss", default_k=10, **kwargs)
    return export_version("", str(base), index="faiss", module=module)


def _servable(path):
    from tfrs_logq.serving.options import ServerOptions
    from tfrs_logq.serving.servable import Servable

    return Servable(path, int(os.path.basename(path)),
                    ServerOptions(model_name="ml", model_base_path=os.path.dirname(path)))


def _brute_force_top_k(loaded, histories, k, exclude):
    """The reference: numpy scores of the export's own query embeddings (``loaded``: the
    SavedModel) against every item embedding, the history's items dropped, the best k as
    raw ids."""
    query = loaded.signatures["query_embedding"](history=tf.constant(histories))
    scores = query["query_embedding"].numpy() @ loaded.item_table.numpy().T
    if exclude:
        for row, history in enumerate(histories):
            seen = [np.flatnonzero(RAW_IDS == x)[0] for x in history if x in RAW_IDS]
            scores[row, seen] = -np.inf
    best = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return RAW_IDS[best], np.take_along_axis(scores, best, 1)


def test_faiss_built_as_exact_search_returns_brute_forces_top_k(tmp_path):
    # Every list searched: an exact search (the lists hold the embeddings themselves).
    params = faiss_parameters(len(RAW_IDS), 10, max_k=50, nlist=12)
    path = _faiss_export(tmp_path / "m", faiss_params=params)
    servable = _servable(path)
    loaded = tf.saved_model.load(path)
    try:
        assert servable.ann is not None and servable.ann.nprobe_for(10) == 12
        histories = np.array([[101, 102, 250, 0, 0], [0, 0, 0, 0, 399], [105, 106, 107, 108,
                                                                         109]], np.int64)
        for k, exclude in ((10, True), (50, False), (7, True)):
            checked = servable.validate("top_k", {"history": histories, "k": np.int32(k),
                                                  "exclude_history": np.bool_(exclude)})
            got = servable.run(checked)
            ids, scores = _brute_force_top_k(loaded, histories, k, exclude)
            np.testing.assert_allclose(got["scores"], scores, rtol=1e-5, atol=1e-6)
            assert (got["item_ids"] == ids).mean() > 0.97  # equal up to ties of equal score
            if exclude:
                assert not any(set(r) & set(h) for r, h in zip(got["item_ids"], histories))
        # serving_default: the export's default k, history excluded, as the SavedModel's own
        got = servable.run(servable.validate("", {"history": histories}))
        ids, _ = _brute_force_top_k(loaded, histories, 10, True)
        assert got["item_ids"].shape == (3, 10) and (got["item_ids"] == ids).mean() > 0.97
    finally:
        servable.close()


def test_faiss_export_records_the_recall_it_measured(tmp_path):
    encoder = _encoder(len(RAW_IDS))
    queries = _queries(encoder, 200, seed=1)
    module = RetrievalModule(encoder, RAW_IDS, "faiss", default_k=10, max_k=50,
                             target_recall=0.9, tuning_queries=queries,
                             queries_source="random histories")
    path = export_version("", str(tmp_path / "m"), index="faiss", module=module)
    meta = json.loads(open(os.path.join(path, "assets", "export.json")).read())
    params, tuning = meta["faiss"], meta["faiss_tuning"]
    assert meta["index"] == "faiss" and params["type"] == "IVF-Flat"
    assert params["metric"] == "inner_product" and params["nlist"] == round(300 ** 0.5)
    assert tuning["reached"] and tuning["queries"] == "random histories"
    assert set(tuning["recall"]) == {"10", "50"}
    assert [k for k, _ in params["tuned"]] == [10, 50]
    # The figure is what the written index finds on the held-out half, recomputed here.
    index = FaissIndex.load(path, meta)
    items = tf.saved_model.load(path).item_table.numpy()
    held_out = queries[100:]
    for k, nprobe in params["tuned"]:
        found = index.search(held_out, k, nprobe, every_list_when_short=False)[0]
        expected = recall_at_k(found, exact_top_k(held_out, items, k))
        assert tuning["recall"][str(k)] == round(expected, 4)
        assert tuning["tuning_recall"][str(k)] >= 0.9
    line = describe_index(meta)
    assert "faiss IVF-Flat" in line and f"recall@10 {tuning['recall']['10']:.3f}" in line


def test_a_recall_target_out_of_reach_is_refused_in_one_line_and_nothing_is_written(
        smoke_runs, tmp_path):
    encoder, _, raw_ids = export_lib.load_trained(smoke_runs[0])
    # At most 1 of 5 lists searched: the exact top-20 of 30 items is not in one list.
    params = faiss_parameters(len(raw_ids), 5, max_k=20, nlist=5, max_search_fraction=0.2)
    base = tmp_path / "m"
    with pytest.raises(ValueError) as refused:
        export_version(smoke_runs[0], str(base), index="faiss", default_k=5, max_k=20,
                       target_recall=1.0, faiss_params=params)
    message = str(refused.value)
    assert "\n" not in message and "cannot keep --target-recall 1" in message
    assert "1 of 5 lists" in message and "nothing was exported" in message
    assert not base.exists() or not [d for d in os.listdir(base) if d.isdigit()]


def test_export_cli_faiss_prints_its_index_and_a_missing_faiss_names_the_extra(
        smoke_runs, tmp_path, capsys, monkeypatch, caplog):
    base = tmp_path / "m"
    args = ["export", "--model-dir", smoke_runs[0], "--model_base_path", str(base),
            "--model_name", "m", "--k", "5", "--max-k", "10", "--target-recall", "0.8"]
    assert cli.main(args + ["--index", "faiss"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(base / "1")
    meta = json.loads((base / "1" / "assets" / "export.json").read_text())
    assert describe_index(meta) in err and "recall@5" in err and "recall@10" in err
    assert meta["faiss_tuning"]["queries"].endswith("seed 0")  # validation users' queries

    monkeypatch.setitem(sys.modules, "scann", None)  # as where ScaNN cannot load
    assert export_lib.resolve_index("auto") == "faiss"
    monkeypatch.setitem(sys.modules, "faiss", None)  # as without the serving extra
    code = cli.main(args + ["--index", "faiss"])
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.startswith("tfrs-logq: error")]
    assert code == 2 and len(lines) == 1, err
    assert 'pip install -e ".[serving]"' in lines[0] and "faiss-cpu" in lines[0]
    assert sorted(os.listdir(base)) == ["1"]
    assert export_lib.resolve_index("auto") == "brute-force"  # neither loads: said in a line


def test_the_server_checks_each_versions_index_and_swaps_without_failing_requests(tmp_path):
    from tfrs_logq.serving.client import make_request, predict_stub
    from tfrs_logq.serving.server import ModelServer, ServerOptions

    base = tmp_path / "ml"
    _faiss_export(base, seed=0)
    options = ServerOptions(model_name="ml", model_base_path=str(base), port=0,
                            rest_api_port=0, file_system_poll_wait_seconds=3600)
    server = ModelServer(options).start()
    try:
        # A version whose index is not the one it was exported with is not served.
        shutil.copytree(base / "1", base / "2")
        with open(base / "2" / "assets" / "index.faiss", "ab") as f:
            f.write(b"\0")
        server.manager.poll()
        status = {s.version: s for s in server.manager.statuses()}
        assert status[1].state == "AVAILABLE" and status[2].state == "END"
        assert "sha256" in status[2].error_message
        shutil.rmtree(base / "2")

        stub, channel = predict_stub(f"127.0.0.1:{server.port}")
        request = make_request("ml", np.array([[101, 102, 103]], np.int64))
        versions, failures, stop = [], [], threading.Event()

        def client():
            while not stop.is_set():
                try:
                    versions.append(stub.Predict(request, timeout=60).model_spec.version.value)
                except Exception as exc:  # the assertion reports it
                    failures.append(repr(exc))

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        _wait_for(lambda: len(versions) >= 8, what="requests on version 1")
        _faiss_export(base, seed=1)  # version 2 again (the broken one was removed)
        server.manager.poll()
        assert server.manager.current().version == 2
        answered = len(versions)
        _wait_for(lambda: len(versions) >= answered + 8, what="requests on version 2")
        stop.set()
        for t in threads:
            t.join()
        channel.close()
        assert not failures, failures[:3]
        assert versions[0] == 1 and versions[-1] == 2 and set(versions) == {1, 2}
    finally:
        server.stop(0)
