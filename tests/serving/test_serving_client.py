"""serving/client.py: ranks through a server equal the exact ones (brute force), and
the client's recall/NDCG is the metrics implementation."""


import numpy as np
import pytest

from tfrs_logq.metrics import target_ranks
from tfrs_logq.serving.client import predict_stub, ranks_through_server
from tfrs_logq.serving.export import load_trained
from tfrs_logq.serving.server import ModelServer, ServerOptions


def test_ranks_through_server_equal_exact_under_each_policy(trained, exports):
    """The served top_k and the offline ranking give the same hits, target by target,
    with the history left out (a repeat target is then a miss) and with it kept."""
    options = ServerOptions(model_name="bf", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"))
    srv = ModelServer(options).start()
    encoder, config, raw_ids = load_trained(trained["model_dir"])
    rng = np.random.default_rng(1)
    internal = [rng.choice(np.arange(1, len(raw_ids) + 1), size=int(n), replace=False)
                for n in rng.integers(1, 8, size=40)]
    targets = rng.integers(1, len(raw_ids) + 1, size=40)
    targets[:15] = [h[-1] for h in internal[:15]]  # repeats: the target is in the history
    histories_raw = [raw_ids[h - 1] for h in internal]
    padded = np.zeros((40, config["max_length"]), np.int32)
    for row, h in enumerate(internal):
        padded[row, -len(h):] = h
    queries = encoder.last_query(padded)
    stub, channel = predict_stub(f"127.0.0.1:{srv.port}")
    try:
        for exclude_history in (True, False):
            served = ranks_through_server(stub, "bf", histories_raw, raw_ids[targets - 1],
                                          max_k=20, batch_size=7, num_items=len(raw_ids),
                                          exclude_history=exclude_history)
            exact = target_ranks(queries, encoder.item_embeddings(), targets,
                                 exclude=padded if exclude_history else None)
            np.testing.assert_array_equal(served, np.minimum(exact, 20))
            if exclude_history:
                assert (served[:15] == 20).all()  # the served top_k never returns them
    finally:
        channel.close()
        srv.stop()


def test_client_recall_ndcg_is_the_metrics_implementation():
    from tfrs_logq.metrics import recall_ndcg_from_ranks
    from tfrs_logq.serving.client import recall_ndcg

    ranks = np.random.default_rng(3).integers(0, 1500, size=500)
    got = recall_ndcg(ranks, (10, 100, 1000), (20,))
    assert list(got) == ["recall@10", "recall@100", "recall@1000", "ndcg@20"]
    reference = {f"recall@{k}": np.mean(ranks < k) for k in (10, 100, 1000)}
    reference["ndcg@20"] = np.mean([1 / np.log2(r + 2) if r < 20 else 0.0 for r in ranks])
    for key, value in reference.items():
        assert got[key] == pytest.approx(value, rel=1e-12)
    library = recall_ndcg_from_ranks(ranks, (10, 20, 100, 1000))
    assert all(got[key] == library[key] for key in got)
