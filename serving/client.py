"""A TF Serving client: requests, and the rank of each test target through a server.

`tfrs_logq.serving.evaluation` (``tfrs-logq evaluate --server``) builds on it.

Requests go through the official ``PredictionServiceStub`` (so any TF Serving
server, ours or ``tensorflow_model_server``, can be measured), pipelined: up to
``max_in_flight`` batches are outstanding at once. For each test target the
server is asked for the top ``max(ks)`` items of the ``top_k`` signature for the
history a request sends (the user's last items, as many as the model reads), with
``exclude_history`` as the evaluation policy says, and the rank of the target read
off: what a user of the server gets. The exact figures come from the same model in
process, by brute force, under the same policy (`tfrs_logq.metrics.target_ranks`).
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
                         exclude_history: bool = True) -> np.ndarray:
    """0-based rank of each target among the server's ``top_k`` results for its history,
    as a user gets them (``exclude_history`` as sent: by default the items of the
    history are left out by the server, a repeat target among them); ``max_k`` (not
    found) when it is not in the top ``max_k``; an item the server scores ``-inf`` (left
    out, filling a list longer than the items left) is not returned. ``histories_raw``
    are sent as they are
    (each at most the model's length)."""
    ranks = np.full(len(targets_raw), max_k, np.int64)
    k = max_k if num_items is None else min(max_k, num_items)
    pending: collections.deque = collections.deque()

    def collect(entry):
        start, future = entry
        response = future.result(timeout=timeout)
        ids = tf.make_ndarray(response.outputs["item_ids"])
        scores = tf.make_ndarray(response.outputs["scores"])
        if ids.dtype.kind in ("S", "O"):
            ids = ids.astype(str)
        for row in range(ids.shape[0]):
            # A -inf score is a left-out item that fills a list longer than what is left.
            returned = scores[row] > -np.inf
            hits = np.flatnonzero((ids[row] == targets_raw[start + row]) & returned)
            if hits.size:
                ranks[start + row] = hits[0]

    for start in range(0, len(targets_raw), batch_size):
        batch = pad_histories(histories_raw[start:start + batch_size])
        request = make_request(model_name, batch, k=k, exclude_history=exclude_history)
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
