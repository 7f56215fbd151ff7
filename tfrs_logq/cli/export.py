"""``tfrs-logq export``: a trained model as a TF Serving version (`tfrs_logq.serving.export`)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Annotated, Literal, Optional

from tyro.conf import arg

from tfrs_logq.cli._common import read_model_config
from tfrs_logq.cli._flags import Verbose, check, shown

# `tfrs_logq.serving.export`'s (which imports TensorFlow; a test checks they agree).
INDEXES = ("auto", "scann", "faiss", "brute-force")
DEFAULT_TARGET_RECALL = 0.95
DEFAULT_MAX_K = 1000


@dataclasses.dataclass
class Flags(Verbose):
    """export a trained model as a TF Serving SavedModel"""

    model_dir: Annotated[str, arg(metavar="DIR")]
    """the output of `tfrs-logq train`"""
    model_base_path: Annotated[str, arg(metavar="DIR", aliases=("--model_base_path",))]
    """TF Serving's base path: the directory of integer versions this export adds to"""
    model_name: Annotated[str, arg(metavar="NAME", aliases=("--model_name",))]
    """the servable's name"""
    version: Annotated[Optional[int], shown("the next free one")] = None
    """integer version"""
    index: Literal[INDEXES] = INDEXES[0]
    """scann: ScaNN index (needs the ScaNN ops to serve: the scann extra, TensorFlow 2.20);
    faiss: a faiss index searched by tfrs-logq serve (the serving extra; stock TF Serving
    serves the same version by brute force); brute-force: exact, stock TensorFlow ops only;
    auto: scann where ScaNN loads, else faiss where it imports, else brute-force"""
    k: int = 100
    """results of serving_default (top_k takes k per request)"""
    target_recall: Annotated[float, arg(metavar="R")] = DEFAULT_TARGET_RECALL
    """ScaNN, faiss: search the fewest tree leaves (faiss: lists) that keep this share of
    the exact top-k (at --k and --max-k), measured at export against brute force on
    validation users' queries (docs/export.md); faiss refuses to export below it"""
    max_k: int = DEFAULT_MAX_K
    """ScaNN, faiss: the largest k the recall is tuned for (top_k serves larger k at the
    same leaves)"""
    scann_search_fraction: Annotated[Optional[float], arg(metavar="F")] = None
    """fix the share of the ScaNN tree's leaves a query searches instead of tuning it to
    --target-recall (the recall is still measured)"""

    def __post_init__(self) -> None:
        check(self, at_least={"version": 1, "k": 1, "max_k": 1},
              above={"target_recall": 0, "scann_search_fraction": 0},
              at_most={"target_recall": 1, "scann_search_fraction": 1})


def run(args) -> int:
    base = args.model_base_path
    if os.path.exists(base) and not os.path.isdir(base):
        raise NotADirectoryError(
            f"--model_base_path {base} is a file, not a directory: give the directory that "
            "holds (or will hold) the model's integer versions.")
    read_model_config(args.model_dir)
    from tfrs_logq.serving.export import check_model_name, describe_index, export_version

    check_model_name(args.model_name)
    path = export_version(args.model_dir, base, version=args.version, index=args.index,
                          default_k=args.k, search_fraction=args.scann_search_fraction,
                          target_recall=args.target_recall, max_k=args.max_k)
    print(path)  # stdout: the path alone, for scripts; the index's line for people
    meta = os.path.join(path, "assets", "export.json")
    if os.path.exists(meta):  # every export writes it; a stand-in in tests may not
        with open(meta) as f:
            print(describe_index(json.load(f)), file=sys.stderr)
    return 0


