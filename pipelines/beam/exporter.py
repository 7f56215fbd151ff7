"""Exporter: the Trainer's model as a TF Serving SavedModel (`tfrs_logq.serving.export`).

::

    Exporter/
      manifest.json
      serving/1/            `export_version(ROOT/Trainer, Exporter/serving, version=1)`:
                            saved_model.pb, variables/, assets/export.json

``serving`` is a TF Serving base path holding version 1, the SavedModel that
BulkInferrer runs and Pusher copies; its signatures are ``serving_default``,
``top_k(history, k, exclude_history)`` and ``query_embedding``. ``index`` is
``scann`` (loads after ``import scann``), ``faiss`` (an IVF index in
``assets/index.faiss`` that ``tfrs-logq serve`` searches, beside signatures that search
by brute force, so BulkInferrer's lists are exact) or ``brute-force`` (stock TensorFlow
ops); ``auto`` is `tfrs_logq.serving.export.resolve_index`'s choice, as ``tfrs-logq
export --index auto``. The manifest's counts name the index built (``index``), its settings
(``index_parameters``), the recall@k its export measured against exact search
(``index_recall``; ``{}`` for brute force) and the line ``tfrs-logq export`` prints
on it (``index_description``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from tfrs_logq.pipelines.beam.artifacts import artifact_input
from tfrs_logq.serving.indexes import INDEXES  # export's choices (no TensorFlow imported)

NAME = "Exporter"
VERSION = 2  # 2: faiss, and the index's settings and measured recall in the counts
BASE_DIR = "serving"
EXPORT_VERSION = 1


def saved_model_dir(exporter_dir: str) -> str:
    """The SavedModel of an Exporter artifact: ``EXPORTER/serving/1``."""
    return os.path.join(exporter_dir, BASE_DIR, str(EXPORT_VERSION))


@dataclasses.dataclass
class Exporter:
    """Exports the Trainer artifact's model.

    Args:
      trainer_dir: str. The Trainer artifact (``PIPELINE_ROOT/Trainer``).
      index: str. ``"auto"`` (ScaNN where it loads, else faiss where it imports, else
        brute force: `tfrs_logq.serving.export.resolve_index`), ``"scann"``, ``"faiss"``
        or ``"brute-force"``. Defaults to ``"auto"`` (as ``tfrs-logq export``).
      default_k: int. Results of ``serving_default`` (at most the catalog). Defaults
        to 100.
    """

    trainer_dir: str
    index: str = "auto"
    default_k: int = 100

    name = NAME
    version = VERSION
    USES_BEAM = False  # runs in the pipeline's process

    def __post_init__(self) -> None:
        if self.index not in INDEXES:
            raise ValueError(f"`index` must be one of {INDEXES}, received {self.index!r}.")
        if int(self.default_k) < 1:
            raise ValueError(f"`default_k` must be positive, received {self.default_k}.")

    def inputs(self, root: str) -> dict:
        return {"model": artifact_input(self.trainer_dir, "Trainer")}

    def parameters(self) -> dict:
        return {"index": self.index, "default_k": int(self.default_k)}

    def stale_reason(self, manifest: dict) -> Optional[str]:
        """Why an ``auto`` export that is otherwise current must be redone: it holds a
        ScaNN index, which no longer loads here (BulkInferrer could not run it), so
        ``auto`` now chooses another."""
        if self.index != "auto" or (manifest.get("counts") or {}).get("index") != "scann":
            return None
        from tfrs_logq.serving.export import scann_ops_or_error

        try:
            scann_ops_or_error()
        except ImportError:
            return "its ScaNN index does not load here; --index auto now chooses another"
        return None

    def build(self, root: str, staging: str, run) -> dict:
        """Writes ``staging/serving/1`` (no Beam job)."""
        import json

        from tfrs_logq.serving.export import export_version
        from tfrs_logq.serving.indexes import index_record

        with open(os.path.join(self.trainer_dir, "config.json")) as f:
            num_items = int(json.load(f)["num_items"])
        path = export_version(os.path.abspath(self.trainer_dir), os.path.join(staging, BASE_DIR),
                              version=EXPORT_VERSION, index=self.index,
                              default_k=min(int(self.default_k), num_items))
        with open(os.path.join(path, "assets", "export.json")) as f:
            meta = json.load(f)
        record = index_record(meta)
        return {"saved_model": os.path.relpath(path, staging), "index": meta["index"],
                "index_parameters": record["parameters"], "index_recall": record["recall"],
                "index_description": record["description"],
                "num_items": meta["num_items"], "max_length": meta["max_length"],
                "default_k": meta["default_k"]}
