"""Recall/NDCG of a served model through TF Serving's gRPC API, beside the exact figures.

`evaluate_through_server` is what ``tfrs-logq evaluate --server`` runs: it loads the
run's test split, checks that the server serves that run (query embeddings on a few
users), ranks every test target through the server (`client.ranks_through_server`)
and in process by brute force (`tfrs_logq.metrics.target_ranks`), and reports both
with `tfrs_logq.metrics.recall_ndcg_from_ranks`. A brute-force export loses nothing:
its served figures equal the exact ones; a ScaNN or faiss export shows what the index
costs. Beside them it states the index served, as the server says (`served_index`: its
kind, settings and the recall@k against exact search its export recorded, the figure
``tfrs-logq export`` printed).

Example:

    from tfrs_logq.serving.evaluation import evaluate_through_server

    result = evaluate_through_server("127.0.0.1:8500", "ml1m", "runs/ml1m")
    result["served"]["recall@10"], result["exact"]["recall@10"], result["index"]["recall"]
"""

from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import numpy as np

RECALL_KS = (10, 100, 1000)
NDCG_KS = (20,)


def connect(address: str, model_name: str, timeout: float):
    """A gRPC channel to a TF Serving endpoint that answers and serves ``model_name``;
    ConnectionError (none answers in ``timeout``) or ValueError (no such model)."""
    import grpc
    from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise ConnectionError(
            f"no TF Serving endpoint answers at {address} (--server) within {timeout:g} s: "
            "start one (`tfrs-logq serve --model_name NAME --model_base_path DIR`) or fix "
            "the address.") from None
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = model_name
    try:
        model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request,
                                                                        timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            channel.close()
            raise ValueError(f"the server at {address} serves no model named {model_name!r} "
                             f"(--model_name): {exc.details()}") from None
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            channel.close()
            raise
    return channel


def _integral(value):
    """JSON read from a protobuf ``Struct`` (every number a float) with whole numbers as
    ints again (``nlist``, ``tuned``, query counts)."""
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def served_index(channel, model_name: str, timeout: float) -> dict:
    """The index the server serves as ``model_name``, as its metadata says: `tfrs-logq
    serve` answers GetModelMetadata's ``index`` field with what the version's
    ``assets/export.json`` records, read here by `indexes.index_record`::

        {"kind", "parameters", "recall": {k: recall@k against exact search, as the export
         measured it}, "target_recall", "held_out_queries", "description", "version"}

    A server that does not say (stock TF Serving answers ``signature_def`` only) gives
    ``kind`` None and a ``description`` saying so."""
    import grpc
    from google.protobuf import json_format, struct_pb2
    from tensorflow_serving.apis import get_model_metadata_pb2, prediction_service_pb2_grpc

    from tfrs_logq.serving.indexes import index_record

    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = model_name
    request.metadata_field.append("index")
    try:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(
            request, timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() not in (grpc.StatusCode.INVALID_ARGUMENT,
                              grpc.StatusCode.UNIMPLEMENTED):
            raise
        reply = None
    struct = struct_pb2.Struct()
    if reply is None or "index" not in reply.metadata or \
            not reply.metadata["index"].Unpack(struct):
        return {"kind": None, "parameters": None, "recall": {}, "target_recall": None,
                "held_out_queries": None, "version": None,
                "description": "index: not stated by the server (its GetModelMetadata has no "
                               "'index' field, as stock TF Serving's): the recall its export "
                               "measured is in the version's assets/export.json"}
    record = index_record(_integral(json_format.MessageToDict(struct)))
    return {**record, "version": int(reply.model_spec.version.value)}


def _log_test_split(model_dir: str, config: dict, dataset, split_name, data_dir, data_format,
                    load_options: dict):
    """The split of a run trained on a user's log: read as the run read it (its recorded
    weight column and skipped lines, `load_run_split`), ``--split`` another split of it;
    the built-in datasets' flags and the load options refused."""
    from tfrs_logq.serving.export import load_run_split

    log = config["interactions"]
    for flag, value in (("--dataset", dataset), ("--data-dir", data_dir),
                        ("--data-format", data_format)):
        if value:
            raise ValueError(f"{flag} is a built-in dataset's flag; the model at --model-dir "
                             f"was trained on {log}: leave {flag} out to evaluate on it.")
    for flag, given in (("--skip-bad-lines", load_options.get("skip_bad_lines")),
                        ("--no-cache", load_options.get("use_cache") is False),
                        ("--no-download", load_options.get("download_ok") is False)):
        if given:
            raise ValueError(f"{flag} is for a built-in dataset; the model at --model-dir "
                             f"was trained on {log}, which is read as it was in training "
                             f"(skipping the malformed rows it skipped): leave {flag} out.")
    if split_name == "temporal" and not config.get("time_column"):
        raise ValueError(f"the temporal split needs times and the run read {log} without a "
                         "time column: evaluate it with --split loo or --split gsasrec.")
    if split_name and split_name != config.get("split"):
        return load_run_split(model_dir, split_name=split_name)
    return load_run_split(model_dir)


def _load_test_split(model_dir: str, config: dict, dataset, split_name, data_dir, data_format,
                     load_options: dict):
    from tfrs_logq.pipelines.datasets import load_split

    if config.get("interactions"):  # a user's log (`train --interactions`)
        split = _log_test_split(model_dir, config, dataset, split_name, data_dir,
                                data_format, load_options)
        advice = f"{config['interactions']} has changed since the run was trained"
    elif config.get("examples") and not (dataset or split_name or data_dir):
        # a pipeline's ExampleGen artifact (`train --examples`): the run's own split
        from tfrs_logq.serving.export import load_run_split

        split = load_run_split(model_dir)
        advice = ("the ExampleGen artifact has changed since the run was trained: evaluate "
                  "with its dataset (--dataset, --data-dir, --data-format)")
    else:
        dataset = dataset or config["dataset"]
        split_name = split_name or config["split"]
        fmt = data_format or config.get("data_format")
        if split_name == "temporal" and fmt == "sasrec":
            raise ValueError(
                "the temporal split needs timestamps; this model was trained on SASRec's "
                f"ml-1m.txt (data_format sasrec, --split {config['split']}), which has none: "
                "evaluate it with --split loo or --split gsasrec.")
        split = load_split(dataset, split_name, data_dir or config.get("data_dir"),
                           data_format=fmt, temporal_fraction=config.get("temporal_fraction"),
                           **load_options)
        advice = "evaluate with its data (--data-dir, --data-format)"
    with open(os.path.join(model_dir, "vocabulary.json")) as f:
        vocabulary = json.load(f)["raw_items"]
    if vocabulary != [str(x) for x in split.interactions.raw_items]:
        raise ValueError(
            f"{split.interactions.source} ({split.num_items:,} items) is not the data the "
            f"model at --model-dir was trained on ({len(vocabulary):,} items): {advice}.")
    return split


def evaluate_through_server(server: str, model_name: str, model_dir: str, *,
                            dataset: Optional[str] = None, split: Optional[str] = None,
                            data_dir: Optional[str] = None, data_format: Optional[str] = None,
                            max_targets: Optional[int] = None, timeout: float = 10.0,
                            recall_ks: Sequence[int] = RECALL_KS,
                            ndcg_ks: Sequence[int] = NDCG_KS,
                            load_options: Optional[dict] = None) -> dict:
    """Recall@k and NDCG@k of the model served at ``server`` on the run's test split.

    Args:
        server: str. The gRPC endpoint, ``HOST:PORT``.
        model_name: str. The servable's name.
        model_dir: str. The training output of the served model (its config, vocabulary
            and best weights: the data and the exact figures come from it).
        dataset, split, data_dir, data_format: override the run's data. Default: the
            run's own.
        max_targets: int. A seeded sample of this many test targets. Defaults to all.
        timeout: float. Seconds to wait for the server to answer at start.
        recall_ks, ndcg_ks: the cutoffs. Default ``(10, 100, 1000)`` and ``(20,)``.
        load_options: dict. ``skip_bad_lines``, ``use_cache``, ``download_ok`` for
            `load_split`.

    Returns:
        ``{"server", "model_name", "num_targets", "served": {"recall@10": ...},
        "exact": {...}, "index": {"kind", "recall", ...} (`served_index`: the served
        index and the recall@k against exact search its export recorded), "data":
        {"source", "data_format", "rows", "skipped_lines"}}``.
    """
    from tfrs_logq.metrics import target_ranks
    from tfrs_logq.pipelines.sequential import evaluation_arrays
    from tfrs_logq.serving.client import (
        predict_stub,
        ranks_through_server,
        recall_ndcg,
        served_query_embeddings,
    )
    from tfrs_logq.serving.export import load_trained

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    data = _load_test_split(model_dir, config, dataset, split, data_dir, data_format,
                            load_options or {})
    connect(server, model_name, timeout).close()
    encoder, config, raw_ids = load_trained(model_dir)
    part = data.test
    idx = np.arange(len(part))
    if max_targets and len(idx) > max_targets:
        idx = np.sort(np.random.default_rng(0).choice(len(idx), max_targets, replace=False))
    max_k = max(tuple(recall_ks) + tuple(ndcg_ks))
    arrays = evaluation_arrays(data, part, config["max_length"])
    arrays = {k: (None if v is None else v[idx]) for k, v in arrays.items()}
    full = [data.sequences[u][:n] for u, n in zip(part.users[idx], part.history_lengths[idx])]
    sent_raw = [raw_ids[h[-config["max_length"]:] - 1] for h in full]
    targets_raw = raw_ids[arrays["targets"] - 1]
    stub, channel = predict_stub(server)
    try:
        # The served model must be this run's: compare query embeddings on a few users.
        local = encoder.last_query(arrays["history"][:8], training=False).numpy()
        remote = served_query_embeddings(stub, model_name, sent_raw[:8], timeout=timeout)
        gap = float(np.max(np.abs(remote - local)) / max(np.max(np.abs(local)), 1e-12)) \
            if remote.shape == local.shape else float("inf")
        if gap > 1e-3:
            raise ValueError(
                f"the model the server at {server} serves as {model_name!r} is not the run "
                f"at --model-dir {model_dir} (its query embeddings differ by {gap:.2g} "
                "relative): serve that run's export, or give its --model-dir.")
        index = served_index(channel, model_name, timeout)
        served = ranks_through_server(stub, model_name, sent_raw, targets_raw, max_k,
                                      num_items=len(raw_ids), exclude_history=True)
    finally:
        channel.close()
    queries = encoder.last_query(arrays["history"], training=False)
    exact = target_ranks(queries, encoder.item_embeddings(), arrays["targets"],
                         exclude=arrays["exclude"])
    interactions = data.interactions
    return {"server": server, "model_name": model_name, "num_targets": len(idx),
            "served": recall_ndcg(served, recall_ks, ndcg_ks),
            "exact": recall_ndcg(np.minimum(exact, max_k), recall_ks, ndcg_ks),
            "index": index,
            "data": {"source": interactions.source, "data_format": interactions.data_format,
                     "rows": interactions.num_rows,
                     "skipped_lines": interactions.skipped_lines}}


__all__ = ["NDCG_KS", "RECALL_KS", "connect", "evaluate_through_server", "served_index"]
