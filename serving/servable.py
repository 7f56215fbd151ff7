"""`Servable`: one loaded version of a model (TF Serving's servable).

The SavedModel, its signatures and their ``SignatureDef`` protos (for metadata), the
export's ``assets/export.json`` (input defaults, ``max_length``, ``num_items``) and a
`Batcher` over its signatures.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf
from tfrs_logq.serving.batching import Batcher
from tfrs_logq.serving.errors import ServingError
from tfrs_logq.serving.inputs import check_inputs
from tfrs_logq.serving.options import ServerOptions


class Servable:
    """One loaded version: the SavedModel, its signatures' metadata and a batcher.

    Args:
        path: str. The version's directory (``BASE/VERSION``).
        version: int. Its version number.
        options: `ServerOptions`. Batching and request limits.
    """

    def __init__(self, path: str, version: int, options: ServerOptions) -> None:
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
        self.options = options
        self.batcher = Batcher(self._call, options.max_batch_size, options.batch_timeout_micros,
                               options.request_timeout_in_ms)

    def signature(self, signature_name: str):
        """``(name, concrete function)``; the default signature for ``""``."""
        name = signature_name or tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
        if name not in self.signatures:
            raise ServingError("INVALID_ARGUMENT",
                               f"Serving signature name: \"{name}\" not found in signature def "
                               f"(available: {sorted(self.signatures)})")
        return name, self.signatures[name]

    def validate(self, signature_name: str, inputs: dict) -> dict:
        """The request checked (`check_inputs`) and bounded: ``{"signature", "inputs"}``."""
        name, fn = self.signature(signature_name)
        out = check_inputs(fn, name, inputs,
                           defaults=self.meta.get("input_defaults", {}).get(name, {}),
                           k_range=self._k_range(fn))
        history = out.get("history")
        if history is not None:
            max_length = self.meta.get("max_length")
            if max_length and history.shape[1] > max_length:
                raise ServingError("INVALID_ARGUMENT",
                                   f"history has {history.shape[1]} items; the model takes at "
                                   f"most {max_length}")
            if history.shape[0] > self.options.max_request_rows:
                raise ServingError("INVALID_ARGUMENT",
                                   f"{history.shape[0]} rows in one request; at most "
                                   f"{self.options.max_request_rows}")
            if history.shape[0] == 0:
                raise ServingError("INVALID_ARGUMENT", "history has no rows")
        return {"signature": name, "inputs": out}

    def _k_range(self, fn) -> tuple:
        """The values ``k`` may take: 1 to the catalog size (and what its dtype holds)."""
        spec = fn.structured_input_signature[1].get("k")
        dtype = spec.dtype if spec is not None and spec.dtype.is_integer else tf.int32
        most = int(np.iinfo(dtype.as_numpy_dtype).max)
        return 1, min(int(self.meta.get("num_items") or most), most)

    def run(self, request: dict) -> dict:
        """Runs a validated request, batched with concurrent ones of the same kind."""
        return self.batcher.run(request["signature"], request["inputs"])

    def _call(self, name: str, inputs: dict) -> dict:
        tensors = {k: tf.constant(v) for k, v in inputs.items()}
        try:
            outputs = self.signatures[name](**tensors)
        except tf.errors.InvalidArgumentError as exc:
            raise ServingError("INVALID_ARGUMENT", exc.message.split("\n")[0]) from None
        return {k: v.numpy() for k, v in outputs.items()}

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
