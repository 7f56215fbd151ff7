"""A TF Serving client: requests, and the rank of each test target through a server.

`tfrs_logq.serving.evaluation` (``tfrs-logq evaluate --server``) builds on it.

Requests go through the official ``PredictionServiceStub`` (so any TF Serving
server, ours or ``tensorflow_model_server``, can be measured), pipelined: up to
``max_in_flight`` batches are outstanding at once. For each test target the
server is asked for the top ``max(ks) + len(history)`` items of the ``top_k``
signature; the user's already-seen items are then dropped client-side (the
gSASRec protocol the in-process evaluation uses too) and the rank of the target
read off. The exact figures come from the same model in process, by brute force.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf


def predict_stub(address: str):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    return prediction_service_pb2_grpc.PredictionServiceStub(channel), channel


def make_request(model_name: str, history: np.ndarray, k: Optional[int] = None,
                 signature_name: str = "", exclude_history: Optional[bool] = None):
    """A `PredictRequest`: ``serving_default``, or ``top_k`` when ``k`` is given
    (``exclude_history`` None leaves it to the server's default, True)."""
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name or ("top_k" if k else "serving_default")
    request.inputs["history"].CopyFrom(tf.make_tensor_proto(history))
    if k is not None:
        request.inputs["k"].CopyFrom(tf.make_tensor_proto(np.int32(k)))
    if exclude_history is not None:
        request.inputs["exclude_history"].CopyFrom(tf.make_tensor_proto(bool(exclude_history)))
    return request


def pad_histories(rows: list) -> np.ndarray:
    """Left-pads raw-id histories into one `[batch, width]` array (0, or "" for strings)."""
    width = max(1, max(len(r) for r in rows))
    pad = "" if rows[0].dtype.kind in ("U", "S", "O") else 0
    return np.array([np.concatenate([np.full(width - len(r), pad, dtype=r.dtype), r])
                     for r in rows])


def served_query_embeddings(stub, model_name: str, histories_raw: list,
                            timeout: float = 60.0) -> np.ndarray:
    """The served model's ``query_embedding`` signature on ``histories_raw``."""
    request = make_request(model_name, pad_histories(histories_raw),
                           signature_name="query_embedding")
    response = stub.Predict(request, timeout=timeout)
    return tf.make_ndarray(response.outputs["query_embedding"])


def ranks_through_server(stub, model_name: str, histories_raw: list, targets_raw: np.ndarray,
                         max_k: int, batch_size: int = 64, max_in_flight: int = 8,
                         timeout: float = 60.0, num_items: Optional[int] = None,
                         seen_raw: Optional[list] = None) -> np.ndarray:
    """0-based rank of each target among the server's results, seen items removed;
    ``max_k`` (not found) when it is not in the top ``max_k``.

    ``histories_raw`` are sent (each at most the model's length); ``seen_raw`` (the
    whole history, default the sent one) are removed from the results."""
    seen_raw = histories_raw if seen_raw is None else seen_raw
    ranks = np.full(len(targets_raw), max_k, np.int64)
    pending: collections.deque = collections.deque()

    def collect(entry):
        start, future = entry
        response = future.result(timeout=timeout)
        ids = tf.make_ndarray(response.outputs["item_ids"])
        if ids.dtype.kind in ("S", "O"):
            ids = ids.astype(str)
        for row in range(ids.shape[0]):
            j = start + row
            seen = set(seen_raw[j].tolist())
            kept = [x for x in ids[row] if x not in seen or x == targets_raw[j]][:max_k]
            hits = np.flatnonzero(np.asarray(kept) == targets_raw[j])
            if hits.size:
                ranks[j] = hits[0]

    for start in range(0, len(targets_raw), batch_size):
        rows = histories_raw[start:start + batch_size]
        batch = pad_histories(rows)
        most_seen = max(len(set(seen_raw[j].tolist())) for j in range(start, start + len(rows)))
        k = max_k + most_seen if num_items is None else min(max_k + most_seen, num_items)
        # The server's results keep the history; seen items are removed here, all but
        # the target (which the exact ranking never leaves out).
        request = make_request(model_name, batch, k=k, exclude_history=False)
        pending.append((start, stub.Predict.future(request, timeout=timeout)))
        if len(pending) >= max_in_flight:
            collect(pending.popleft())
    while pending:
        collect(pending.popleft())
    return ranks


def recall_ndcg(ranks: np.ndarray, recall_ks: Sequence[int], ndcg_ks: Sequence[int]) -> dict:
    """Recall@k for ``recall_ks`` and NDCG@k for ``ndcg_ks`` from 0-based ranks: the
    figures of `tfrs_logq.metrics.recall_ndcg_from_ranks` (the one implementation),
    keeping the cutoffs asked for."""
    from tfrs_logq.metrics import recall_ndcg_from_ranks

    every = recall_ndcg_from_ranks(ranks, sorted(set(recall_ks) | set(ndcg_ks)))
    return {**{f"recall@{k}": every[f"recall@{k}"] for k in recall_ks},
            **{f"ndcg@{k}": every[f"ndcg@{k}"] for k in ndcg_ks}}


__all__ = ["make_request", "predict_stub", "ranks_through_server", "recall_ndcg"]
