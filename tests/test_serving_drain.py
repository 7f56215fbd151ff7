"""serving/drain.py: the drain of requests in flight is bounded by its timeout and counts
what it cut."""

import time

from serving_helpers import _predict_in_threads
from tfrs_logq.serving.server import ModelServer, ServerOptions


def test_the_drain_is_bounded_by_its_timeout_and_counts_what_it_cut(exports):
    """Requests that wait in a 5 s batch window outlive a 0.5 s drain: they are cut,
    counted as cut, and stop() returns in about the drain timeout."""
    options = ServerOptions(model_name="cut", port=0, rest_api_port=0,
                            model_base_path=str(exports["base"] / "brute_force"),
                            batch_timeout_micros=5_000_000, max_batch_size=1000,
                            drain_timeout_in_ms=500)
    srv = ModelServer(options).start()
    results: list = []
    threads = _predict_in_threads(srv.rest_port, srv.port, "cut", 2, results)
    time.sleep(0.8)
    start = time.monotonic()
    summary = srv.stop()
    assert time.monotonic() - start < 4.0
    for t in threads:
        t.join(timeout=30)
    assert summary["cut"] == 4 and summary["drained"] == {"rest": 0, "grpc": 0}, summary
    assert not any(outcome in (200, "OK") for _, outcome, _ in results), results
