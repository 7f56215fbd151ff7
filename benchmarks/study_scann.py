"""Recall@k of the study's trained models through a ScaNN index, beside brute force.

Trains runs of a `tfrs_logq.study` preset (by default the headline's `corrected` and
`logq-paper` with the mixture proposal, seed 0) with `study.train`, then scores the
same held-out examples twice: the exact top-k over the catalog (`study.model_top_k`)
and a ScaNN searcher built with the settings of a default export (`tfrs-logq export`,
--k 100: `serving.export.scann_parameters` / `build_scann_searcher`, a tree of
2 sqrt(V) leaves, 1/20 searched, asymmetric hashing), searched for the top 1,000 as the
exported module does (exact reordering of max(n, 1,000) candidates).
For each it prints exact expected Recall@k (the true mass of the top-k), observed
Recall@k of the held-out targets, and ScaNN's overlap with the exact top-k; the
paired difference corrected minus standard is printed for both, so a reader sees
whether the approximate index keeps it. Observed recall here is "the target is in the
top-k list" for both indexes (ties broken by id, where `tfrs_logq.metrics` counts ties
against the target), and the runs are retrained, so the brute-force figures need not
equal results.csv's. ScaNN 1.4.2 loads only with TensorFlow 2.20.

    python benchmarks/study_scann.py --output-dir results/synthetic-study-scann
    python benchmarks/study_scann.py --quick     # a tiny world, seconds (tests run it)
"""

import argparse
import dataclasses
import json
import os
import sys
import time

from common import machine  # first: sets TF_USE_LEGACY_KERAS before TFRS

# isort: split
import numpy as np  # noqa: E402
from tfrs_logq.serving.export import build_scann_searcher, scann_parameters  # noqa: E402

from tfrs_logq import study  # noqa: E402
from tfrs_logq.atomic import write_text  # noqa: E402
from tfrs_logq.metrics import recall_ndcg_from_ranks  # noqa: E402

KS = study.KS
EXPORT_DEFAULT_K = 100  # tfrs-logq export's --k default (tfrs_logq/cli/export.py)


def scann_top_k(queries: np.ndarray, items: np.ndarray, k: int) -> tuple[np.ndarray, dict]:
    """`[n, k]` ids (row 0 of ``items`` is padding, never returned) and the settings."""
    # A default export (`tfrs-logq export`, --k 100) builds with k = 100 and, asked for
    # more, reorders max(n, its reorder) candidates (serving/export.py _search).
    params = scann_parameters(items.shape[0] - 1, EXPORT_DEFAULT_K)
    searcher = build_scann_searcher(items[1:].astype(np.float32), params)
    idx, _ = searcher.search_batched(queries.astype(np.float32), final_num_neighbors=k,
                                     pre_reorder_num_neighbors=max(k, params["reorder"]))
    return np.asarray(idx, np.int64) + 1, params


def score(world: "study.World", top: np.ndarray) -> dict:
    users = world.eval_batch["user_id"].numpy()
    targets = world.eval_batch["target"].numpy()
    exact = study.exact_expected_recall(world.stream, users, top)
    # The target's 0-based position in the list, or the list's length when absent.
    found = top == targets[:, None]
    ranks = np.where(found.any(axis=1), found.argmax(axis=1), top.shape[1])
    observed = {k: recall_ndcg_from_ranks(ranks, (k,))[f"recall@{k}"] for k in KS}
    return {**{f"exact_recall@{k}": v for k, v in exact.items()},
            **{f"observed_recall@{k}": v for k, v in observed.items()}}


def evaluate_run(run: "study.Run", world: "study.World") -> dict:
    start = time.perf_counter()
    model, _ = study.train(run, world.stream, study.proposal_log_q_table(run, world.log_q))
    train_s = time.perf_counter() - start
    queries = model.query_tower(world.eval_batch["history"]).numpy()
    items = model.item_tower.embeddings.numpy()
    k = max(KS)
    start = time.perf_counter()
    exact_top, _, _ = study.model_top_k(queries, items, k)
    brute_s = time.perf_counter() - start
    start = time.perf_counter()
    scann_top, params = scann_top_k(queries, items, k)
    scann_s = time.perf_counter() - start
    overlap = {f"overlap@{j}": float(np.mean([len(set(a[:j]) & set(b[:j])) / j
                                             for a, b in zip(exact_top, scann_top)]))
               for j in KS}
    return {"run": dataclasses.asdict(run), "train_seconds": round(train_s, 1),
            "brute_force": {**score(world, exact_top), "seconds": round(brute_s, 1)},
            "scann": {**score(world, scann_top), **overlap, "seconds": round(scann_s, 1),
                      "params": params}}


def report(results: list[dict], host: str) -> str:
    first = results[0]["run"]
    lines = [f"machine: {host}", "",
             f"# ScaNN vs brute force on the study's models (V={first['num_items']:,}, "
             f"C={first['num_topics']}, sigma={first['topic_sharpness']}, "
             f"{first['steps']} steps x {first['batch_size']}, seed {first['seed']}, "
             f"{len(results)} runs)", "",
             "| correction (proposal) | index | " + " | ".join(
                 f"exact R@{k}" for k in KS) + " | " + " | ".join(
                 f"obs. R@{k}" for k in KS) + " | overlap@10/100/1000 | seconds |",
             "|---|---|" + "---|" * (2 * len(KS) + 2)]
    for r in results:
        name = f"{r['run']['correction']} ({r['run']['proposal']})"
        for index in ("brute_force", "scann"):
            m = r[index]
            overlap = (" / ".join(f"{m[f'overlap@{k}']:.3f}" for k in KS)
                       if index == "scann" else "1")
            lines.append(f"| {name} | {index.replace('_', ' ')} | "
                         + " | ".join(f"{m[f'exact_recall@{k}']:.4f}" for k in KS) + " | "
                         + " | ".join(f"{m[f'observed_recall@{k}']:.4f}" for k in KS)
                         + f" | {overlap} | {m['seconds']} |")
    by_name = {r["run"]["correction"]: r for r in results}
    if "corrected" in by_name:
        for other, r in by_name.items():
            if other == "corrected":
                continue
            for index in ("brute_force", "scann"):
                diff = [by_name["corrected"][index][f"exact_recall@{k}"]
                        - r[index][f"exact_recall@{k}"] for k in KS]
                lines.append("")
                lines.append(f"corrected − {other}, {index.replace('_', ' ')}: Δ exact "
                             "R@10/100/1000 " + " / ".join(f"{d:+.4f}" for d in diff)
                             + " (one seed: no interval)")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=tuple(study.PRESETS), default="headline")
    p.add_argument("--corrections", nargs="+", default=["corrected", "logq-paper"],
                   choices=study.CORRECTIONS)
    p.add_argument("--proposal", default="mixture", choices=study.PROPOSALS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="override the preset's steps")
    p.add_argument("--output-dir", default=None, help="write scann.md and scann.json here")
    p.add_argument("--quick", action="store_true", help="a tiny world (tests)")
    args = p.parse_args()
    overrides = {} if args.steps is None else {"steps": args.steps}
    if args.quick:
        overrides = dict(num_items=25_000, num_users=500, num_topics=30, steps=20,
                         batch_size=64, num_in_batch=64, num_uniform=64, num_eval_users=128)
    runs = [r for r in study.preset_runs(args.preset, [args.seed], **overrides)
            if r.correction in args.corrections and r.proposal == args.proposal]
    if not runs:
        p.error(f"no run of preset {args.preset!r} has proposal {args.proposal!r} and a "
                f"correction in {args.corrections}")
    world = study.World(runs[0])
    results = [evaluate_run(run, world) for run in runs]
    text = report(results, machine())
    print(text, end="")
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)  # write_text does not create it
        write_text(os.path.join(args.output_dir, "scann.md"), text)
        write_text(os.path.join(args.output_dir, "scann.json"),
                   json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
