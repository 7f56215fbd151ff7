"""`Servable`: one loaded version of a model (TF Serving's servable).

The SavedModel, its signatures and their ``SignatureDef`` protos (for metadata), the
export's ``assets/export.json`` (input defaults, ``max_length``, ``num_items``), the
index a faiss export searches outside the graph (`faiss_index.FaissIndex`, checked
against ``export.json`` at load) and a `Batcher` over its signatures. Its limits
(`inputs.ShapeLimits`: ``max_request_rows`` and the history's ``max_length``;
``max_rows_times_k``) are checked on every request
before the model runs, on both protocols.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.serving.batching import Batcher
from tfrs_logq.serving.errors import ServingError, shorten
from tfrs_logq.serving.inputs import (
    DEFAULT_MAX_WIDTH,
    ShapeLimits,
    array_from_tensor_proto,
    check_inputs,
)
from tfrs_logq.serving.metrics import ServerMetrics
from tfrs_logq.serving.options import ServerOptions


class Servable:
    """One loaded version: the SavedModel, its signatures' metadata and a batcher.

    Args:
        path: str. The version's directory (``BASE/VERSION``).
        version: int. Its version number.
        options: `ServerOptions`. Batching and request limits.
        metrics: `ServerMetrics` or None. Where batch sizes and queue waits are counted.
    """

    def __init__(self, path: str, version: int, options: ServerOptions,
                 metrics: Optional[ServerMetrics] = None) -> None:
        try:
            import scann  # noqa: F401  (registers the ScaNN ops a ScaNN export needs)
        except Exception:  # noqa: BLE001  not installed, or its ops fail to load (TF 2.21)
            pass
        self.path, self.version = path, version
        self.model = tf.saved_model.load(path)
        self.signatures = dict(self.model.signatures)
        meta_path = os.path.join(path, "assets", "export.json")
        self.meta = {}
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                self.meta = json.load(f)
        self.signature_defs = read_signature_defs(path)
        # An index outside the graph (faiss): checked against export.json here, so a
        # version whose index is missing or altered fails to load and is never swapped in.
        self.ann = None
        if self.meta.get("index") == "faiss":
            from tfrs_logq.serving.faiss_index import FaissIndex

            self.ann = FaissIndex.load(path, self.meta)
        self.metrics = metrics
        self.options = options
        self.limits = ShapeLimits(rows=options.max_request_rows,
                                  width=int(self.meta.get("max_length") or DEFAULT_MAX_WIDTH))
        self.batcher = Batcher(self._call, options.max_batch_size, options.batch_timeout_micros,
                               options.request_timeout_in_ms,
                               max_batch_rows_times_k=options.max_rows_times_k,
                               observe=None if metrics is None else metrics.observe_batch)

    def index_summary(self) -> dict:
        """What the export says of its index (``assets/export.json``): its kind, ScaNN's
        settings and the recall the export measured against brute force (None where the
        export predates them, or for brute force)."""
        return {"kind": self.meta.get("index"), "scann": self.meta.get("scann"),
                "scann_tuning": self.meta.get("scann_tuning"),
                "faiss": self.meta.get("faiss"), "faiss_tuning": self.meta.get("faiss_tuning")}

    def measured_recall(self) -> dict:
        """``{k: recall@k}`` the export measured for its index against exact search (held-out
        queries); empty for brute force (exact) and exports that predate the measure."""
        kind = self.meta.get("index")
        tuning = self.meta.get(f"{kind}_tuning") if kind in ("scann", "faiss") else None
        return {str(k): float(r) for k, r in ((tuning or {}).get("recall") or {}).items()}

    def signature(self, signature_name: str):
        """``(name, concrete function)``; the default signature for ``""``."""
        name = signature_name or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
        if name not in self.signatures:
            raise ServingError("INVALID_ARGUMENT",
                               f"Serving signature name: {shorten(name)} not found in signature "
                               f"def (available: {sorted(self.signatures)})")
        return name, self.signatures[name]

    def input_specs(self, signature_name: str) -> dict:
        """The ``tf.TensorSpec`` of each input of a signature, by name."""
        return self.signature(signature_name)[1].structured_input_signature[1]

    def arrays_from_protos(self, signature_name: str, protos) -> dict:
        """gRPC ``TensorProto`` inputs as arrays, each shape checked before it is built
        (`inputs.array_from_tensor_proto`); an unknown input is left for `validate`."""
        specs = self.input_specs(signature_name)
        return {key: array_from_tensor_proto(key, proto, specs[key], self.limits)
                if key in specs else None for key, proto in protos.items()}

    def validate(self, signature_name: str, inputs: dict) -> dict:
        """The request checked (`check_inputs`, shapes within `limits`) and bounded
        (rows x k within ``max_rows_times_k``): ``{"signature", "inputs"}``."""
        name, fn = self.signature(signature_name)
        out = check_inputs(fn, name, inputs,
                           defaults=self.meta.get("input_defaults", {}).get(name, {}),
                           k_range=self._k_range(fn), limits=self.limits)
        history = out.get("history")
        if history is not None:
            rows, k = history.shape[0], self.results_per_row(fn, out)
            if rows * k > self.options.max_rows_times_k:
                raise ServingError("INVALID_ARGUMENT",
                                   f"{rows} rows x k={k} = {rows * k} results; at most "
                                   f"{self.options.max_rows_times_k} in one request "
                                   "(max_rows_times_k): send fewer rows or a smaller k")
        return {"signature": name, "inputs": out}

    def results_per_row(self, fn, inputs: dict) -> int:
        """``k`` of a request: its ``k`` input, else the export's ``default_k`` for a
        signature that returns items (``serving_default``), else 1."""
        if "k" in inputs:
            return int(inputs["k"])
        if "item_ids" in (fn.structured_outputs or {}):
            return int(self.meta.get("default_k") or 1)
        return 1

    def _k_range(self, fn) -> tuple:
        """The values ``k`` may take: 1 to the catalog size (and what its dtype holds)."""
        spec = fn.structured_input_signature[1].get("k")
        dtype = spec.dtype if spec is not None and spec.dtype.is_integer else tf.int32
        most = int(np.iinfo(dtype.as_numpy_dtype).max)
        return 1, min(int(self.meta.get("num_items") or most), most)

    def run(self, request: dict) -> dict:
        """Runs a validated request, batched with concurrent ones of the same kind."""
        name = request["signature"]
        inputs = request["inputs"]
        return self.batcher.run(name, inputs, k=self.results_per_row(self.signatures[name],
                                                                      inputs))

    def _call(self, name: str, inputs: dict) -> dict:
        tensors = {k: tf.constant(v) for k, v in inputs.items()}
        try:
            if self.ann is not None and "item_ids" in self.signatures[name].structured_outputs:
                outputs = self._search_index(tensors)
            else:
                outputs = self.signatures[name](**tensors)
        except tf.errors.InvalidArgumentError as exc:
            raise ServingError("INVALID_ARGUMENT", exc.message.split("\n")[0]) from None
        return {k: v.numpy() for k, v in outputs.items()}

    def _search_index(self, tensors: dict) -> dict:
        """``serving_default`` / ``top_k`` through the index outside the graph: the
        SavedModel's query embedding, the index's candidates (k plus the history's width
        when its items are left out), the SavedModel's ``finish_search`` (the history's
        items dropped, the best k as raw ids), as the in-graph search does."""
        history = tensors["history"]
        k = int(tensors["k"]) if "k" in tensors else int(self.meta["default_k"])
        exclude = bool(tensors["exclude_history"]) if "exclude_history" in tensors else True
        query = self.signatures["query_embedding"](history=history)["query_embedding"]
        n = min(k + (int(history.shape[1]) if exclude else 0), self.ann.num_items)
        ids, scores = self.ann.search(query.numpy(), n)
        return self.model.finish_search(history, tf.constant(ids), tf.constant(scores),
                                        tf.constant(k, tf.int32), tf.constant(exclude))

    def close(self) -> None:
        self.batcher.close()


def read_signature_defs(path: str):
    """The ``SignatureDef`` protos of the SavedModel at ``path`` (for metadata replies)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto.meta_graphs[0].signature_def


__all__ = ["Servable", "read_signature_defs"]
