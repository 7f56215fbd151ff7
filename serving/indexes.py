"""The export's index kinds and what an export records of its index, without TensorFlow.

`INDEXES` is what ``tfrs-logq export --index`` and the pipeline's Exporter take
(`tfrs_logq.serving.export.resolve_index` makes ``auto`` one of the others);
`describe_index` and `index_record` read an export's ``assets/export.json`` (or what the
server's metadata says of it) into the line ``export`` prints and the record the
pipeline's Exporter and ``evaluate`` keep. The command line imports this module for its
flags, so it loads nothing heavy.
"""

from __future__ import annotations

from typing import Optional

# "auto": ScaNN where its ops load (TensorFlow 2.20 with the scann extra), else faiss where
# it imports (the serving extra), else brute force.
INDEXES = ("auto", "scann", "faiss", "brute-force")


def check_index_loads(index: str) -> None:
    """ImportError (one line) where ``index`` ``"scann"`` or ``"faiss"`` cannot load here
    (``auto`` falls back at export; ``brute-force`` always loads): what ``export`` and
    ``pipeline run`` check before they read or train anything."""
    if index == "faiss":
        from tfrs_logq.serving.faiss_index import faiss_or_error

        faiss_or_error()
    elif index == "scann":
        from tfrs_logq.serving.export import scann_ops_or_error

        scann_ops_or_error()


def _by_k(recall) -> dict:
    """``{k: recall@k}`` by ascending k (a protobuf ``Struct`` keeps no order)."""
    return dict(sorted((recall or {}).items(), key=lambda kv: int(kv[0])))


def _tuning(meta: dict) -> dict:
    kind = meta.get("index")
    return (meta.get(f"{kind}_tuning") or {}) if kind in ("scann", "faiss") else {}


def describe_index(meta: dict) -> str:
    """One line on an export's index (its ``assets/export.json``): the kind, its settings
    and the recall@k measured against exact search; `tfrs-logq export` prints it."""
    kind = meta.get("index")
    if kind == "brute-force":
        return "index: brute-force (exact: every item scored)"
    tuning = _tuning(meta)
    if kind == "faiss":
        p = meta.get("faiss") or {}
        where = (f"faiss {p.get('type')} ({p.get('metric')}), {p.get('nlist')} lists, "
                 "lists searched by k: " + ", ".join(f"k={k}: {n}" for k, n in
                                                    p.get("tuned") or [[p.get('k'),
                                                                        p.get('nprobe')]]))
    elif kind == "scann":
        p = meta.get("scann") or {}
        where = f"scann, {p.get('num_leaves')} leaves" if p.get("tree") else "scann, no tree"
        where += ", tuned [k, leaves, reorder factor]: " + str(p.get("tuned"))
    else:
        return f"index: {kind or 'not recorded'} (the export does not say what it holds)"
    if not tuning.get("recall"):
        return f"index: {where}; recall not measured"
    recall = ", ".join(f"recall@{k} {r:.3f}" for k, r in _by_k(tuning["recall"]).items())
    held_out = (tuning.get("num_queries") or {}).get("held_out")
    return (f"index: {where}; {recall} against exact search ({held_out} held-out queries, "
            f"target {tuning.get('target_recall')})")


def index_record(meta: dict) -> dict:
    """What an export says of its index, from its ``assets/export.json`` (or the server's
    ``index`` metadata, whose ``kind`` stands for ``index``)::

        {"kind": "faiss", "parameters": {...}, "recall": {"10": 0.97, ...},
         "target_recall": 0.95, "held_out_queries": 500, "description": "index: ..."}

    ``parameters``: the index's settings (``scann`` or ``faiss``; None for brute force);
    ``recall``: recall@k against exact search on held-out queries, by k (``{}`` for brute
    force, which is exact, and where the export measured nothing).
    """
    meta = dict(meta)
    if "index" not in meta and "kind" in meta:
        meta["index"] = meta["kind"]
    kind: Optional[str] = meta.get("index")
    tuning = _tuning(meta)
    return {"kind": kind,
            "parameters": meta.get(kind) if kind in ("scann", "faiss") else None,
            "recall": {str(k): float(r) for k, r in _by_k(tuning.get("recall")).items()},
            "target_recall": None if tuning.get("target_recall") is None
            else float(tuning["target_recall"]),
            "held_out_queries": (tuning.get("num_queries") or {}).get("held_out"),
            "description": describe_index(meta)}


__all__ = ["INDEXES", "describe_index", "index_record"]
