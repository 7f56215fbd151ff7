"""Recall@k of the study's trained models through ScaNN indexes, beside brute force.

Trains runs of a `lab.study` preset (by default the headline's `corrected` and
`logq-tfrs` with the mixture proposal) for each seed with `study.train`, then scores the
same held-out examples by brute force (`study.model_top_k`) and through ScaNN searchers
built as `tfrs-logq export --index scann` built them before it tuned its search (issue 37;
`pre_tuning_parameters`, searched through `serving.export.search_scann`: a tree of
2 sqrt(V) leaves, asymmetric hashing, exact reordering of max(n, reorder) candidates),
searched for the top 1,000, so that results/synthetic-study-scann stays reproducible:

- `export --k 100`: that export's default (1/20 of the leaves, reorder 1,000);
- `export --k 1000`: what a user asking for 1,000 candidates got (reorder 10,000);
- `k 1000, 1/5 leaves`: the same with four times the leaves searched.

- `export, tuned to 0.95` (``--tuned``): today's export, a tree of sqrt(V) leaves with the
  leaves searched and the reordering tuned to keep 0.95 of the exact top-k at k = 100 and
  1,000 (`serving.export.tune_scann`, as ``export --index scann`` runs it), on the query
  embeddings of 1,000 other users of the world (another batch of the stream), never on
  the users scored.

For each it prints exact expected Recall@k (the true mass of the top-k), observed
Recall@k of the held-out targets and the index's overlap with the exact top-k, and the
difference corrected minus each other correction per index, seed by seed and, with two or
more seeds, its 95 % t interval (`tfrs_logq.stats.paired_difference`), so a reader sees
whether an approximate index keeps the difference. Observed recall here is "the target is
in the top-k list" for every index (ties broken by id, where `tfrs_logq.metrics` counts
ties against the target), and the runs are retrained, so the brute-force figures need not
equal results.csv's. With --output-dir, scann.json is rewritten after every seed and seeds
already in it are not rerun. ScaNN 1.4.2 loads only with TensorFlow 2.20.

    python benchmarks/study_scann.py --seeds 0 1 2 --output-dir results/synthetic-study-scann
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

from lab import study  # noqa: E402
from tfrs_logq._util.atomic import write_text  # noqa: E402
from tfrs_logq.metrics import recall_ndcg_from_ranks  # noqa: E402
from tfrs_logq.serving.export import (  # noqa: E402
    DEFAULT_MAX_K,
    DEFAULT_TARGET_RECALL,
    build_scann_searcher,
    scann_parameters,
    search_scann,
    tune_scann,
)
from tfrs_logq.stats import paired_difference  # noqa: E402

KS = study.KS


def pre_tuning_parameters(num_items: int, k: int, search_fraction: float = 0.05) -> dict:
    """The export's ScaNN settings before issue 37 (commit 5b480cf's `scann_parameters`):
    2 sqrt(n) leaves, ``search_fraction`` of them searched, ``max(n, max(10 k, 500))``
    reordered (``reorder_factor`` 1), exhaustive under 20,000 items."""
    reorder = min(num_items, max(10 * k, 500))
    common = {"dims_per_block": 2, "anisotropic_threshold": 0.2, "reorder": reorder,
              "reorder_factor": 1, "k": k, "max_k": k}
    if num_items < 20_000:
        return {"tree": False, **common}
    leaves = int(round(2 * num_items ** 0.5))
    return {"tree": True, "num_leaves": leaves,
            "num_leaves_to_search": max(1, int(leaves * search_fraction + 1e-9)),
            "training_sample_size": min(num_items, 250_000), **common}


def index_settings(num_items: int) -> dict:
    """Name -> ScaNN settings of the indexes compared (see the module docstring)."""
    return {"export --k 100": pre_tuning_parameters(num_items, 100),
            "export --k 1000": pre_tuning_parameters(num_items, 1000),
            "k 1000, 1/5 leaves": pre_tuning_parameters(num_items, 1000, search_fraction=0.2)}


def scann_top_k(queries: np.ndarray, items: np.ndarray, k: int, params: dict) -> np.ndarray:
    """`[n, k]` ids (row 0 of ``items`` is padding, never returned)."""
    searcher = build_scann_searcher(items[1:].astype(np.float32), params)
    idx, _ = search_scann(searcher, queries.astype(np.float32), k, params)  # as served
    return idx.numpy() + 1


TUNED = "export, tuned to 0.95"
TUNING_USERS = 1000


def tuned_top_k(queries: np.ndarray, items: np.ndarray, k: int, tuning: np.ndarray):
    """`[n, k]` ids through today's export's index (`scann_parameters` at ``--k 100``,
    ``--max-k 1000``, tuned on ``tuning`` queries to `DEFAULT_TARGET_RECALL`), its
    settings and the tuning's report."""
    table = items[1:].astype(np.float32)
    params = scann_parameters(len(table), 100, max_k=DEFAULT_MAX_K)
    searcher = build_scann_searcher(table, params)
    params, tuning_report = tune_scann(searcher, table, tuning.astype(np.float32), params,
                                       DEFAULT_TARGET_RECALL,
                                       queries_source=f"{len(tuning)} other users")
    idx, _ = search_scann(searcher, queries.astype(np.float32), k, params)
    return idx.numpy() + 1, params, tuning_report


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


def evaluate_run(run: "study.Run", world: "study.World", tuned: bool = False) -> dict:
    start = time.perf_counter()
    model, _ = study.train(run, world.stream, study.proposal_log_q_table(run, world.log_q))
    train_s = time.perf_counter() - start
    queries = model.query_tower(world.eval_batch["history"]).numpy()
    items = model.item_tower.embeddings.numpy()
    k = max(KS)
    start = time.perf_counter()
    exact_top, _, _ = study.model_top_k(queries, items, k)
    indexes = {"brute force": {**score(world, exact_top),
                               "seconds": round(time.perf_counter() - start, 1)}}
    settings = dict(index_settings(run.num_items))
    if tuned:
        settings[TUNED] = None
    for name, params in settings.items():
        start = time.perf_counter()
        extra = {}
        if name == TUNED:
            other = next(iter(world.stream.dataset(TUNING_USERS, num_batches=1,
                                                   start_batch=study.EVAL_BATCH_INDEX + 1)))
            top, params, report_ = tuned_top_k(
                queries, items, k, model.query_tower(other["history"]).numpy())
            extra = {"tuning": report_}
        else:
            top = scann_top_k(queries, items, k, params)
        overlap = {f"overlap@{j}": float(np.mean([len(set(a[:j]) & set(b[:j])) / j
                                                 for a, b in zip(exact_top, top)]))
                   for j in KS}
        indexes[name] = {**score(world, top), **overlap,
                         "seconds": round(time.perf_counter() - start, 1), "params": params,
                         **extra}
    return {"run": dataclasses.asdict(run), "train_seconds": round(train_s, 1),
            "indexes": indexes}


def differences(results: list[dict]) -> list[str]:
    """Corrected minus each other correction, per index: seed by seed, and the interval."""
    by = {(r["run"]["correction"], r["run"]["seed"]): r for r in results}
    seeds = sorted({seed for _, seed in by})
    others = sorted({c for c, _ in by if c != "corrected"})
    lines = ["| corrected minus | index | seeds | " + " | ".join(
        f"Δ exact R@{k}" for k in KS) + " | per seed, Δ R@10 / 100 / 1000 |",
        "|---|---|---|" + "---|" * (len(KS) + 1)]
    for other in others:
        pairs = [s for s in seeds if ("corrected", s) in by and (other, s) in by]
        if not pairs:
            continue
        for index in by[("corrected", pairs[0])]["indexes"]:
            cells, per_seed = [], []
            for k in KS:
                metric = f"exact_recall@{k}"
                a = [by[(other, s)]["indexes"][index][metric] for s in pairs]
                b = [by[("corrected", s)]["indexes"][index][metric] for s in pairs]
                d = paired_difference(a, b)
                cells.append(f"{d['mean']:+.4f}" if d["half_width"] is None else
                             f"{d['mean']:+.4f} ± {d['half_width']:.4f}"
                             + (" (within noise)" if d["within_noise"] else ""))
            for s in pairs:
                mine = by[("corrected", s)]["indexes"][index]
                theirs = by[(other, s)]["indexes"][index]
                per_seed.append(" / ".join(
                    f"{mine[f'exact_recall@{k}'] - theirs[f'exact_recall@{k}']:+.4f}" for k in KS))
            lines.append(f"| {other} | {index} | {len(pairs)} | " + " | ".join(cells)
                         + " | " + "; ".join(per_seed) + " |")
    return lines


def report(results: list[dict], host: str) -> str:
    first = results[0]["run"]
    seeds = sorted({r["run"]["seed"] for r in results})
    lines = [f"machine: {host}", "",
             f"# ScaNN vs brute force on the study's models (V={first['num_items']:,}, "
             f"C={first['num_topics']}, sigma={first['topic_sharpness']}, "
             f"{first['steps']} steps x {first['batch_size']}, seeds "
             f"{', '.join(map(str, seeds))}, {len(results)} runs)", "",
             "| seed | correction (proposal) | index | " + " | ".join(
                 f"exact R@{k}" for k in KS) + " | " + " | ".join(
                 f"obs. R@{k}" for k in KS) + " | overlap@10/100/1000 | seconds |",
             "|---|---|---|" + "---|" * (2 * len(KS) + 2)]
    for r in results:
        name = f"{r['run']['correction']} ({r['run']['proposal']})"
        for index, m in r["indexes"].items():
            overlap = (" / ".join(f"{m[f'overlap@{k}']:.3f}" for k in KS)
                       if "overlap@10" in m else "1")
            lines.append(f"| {r['run']['seed']} | {name} | {index} | "
                         + " | ".join(f"{m[f'exact_recall@{k}']:.4f}" for k in KS) + " | "
                         + " | ".join(f"{m[f'observed_recall@{k}']:.4f}" for k in KS)
                         + f" | {overlap} | {m['seconds']} |")
    lines += ["", "Corrected minus each other correction, exact Recall@k, the mean over seeds "
              "± the half-width of its 95 % t interval (none with one seed):", ""]
    lines += differences(results)
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=tuple(study.PRESETS), default="headline")
    p.add_argument("--corrections", nargs="+", default=["corrected", "logq-tfrs"],
                   choices=study.CORRECTIONS)
    p.add_argument("--proposal", default="mixture", choices=study.PROPOSALS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=None, help="override the preset's steps")
    p.add_argument("--output-dir", default=None,
                   help="write scann.md and scann.json here after every seed; seeds "
                        "already in scann.json are not rerun")
    p.add_argument("--quick", action="store_true", help="a tiny world (tests)")
    p.add_argument("--tuned", action="store_true",
                   help="add today's export, tuned to 0.95 on other users' queries")
    args = p.parse_args()
    overrides = {} if args.steps is None else {"steps": args.steps}
    if args.quick:
        overrides = dict(num_items=25_000, num_users=500, num_topics=30, steps=20,
                         batch_size=64, num_in_batch=64, num_uniform=64, num_eval_users=128)
    runs = [r for r in study.preset_runs(args.preset, args.seeds, **overrides)
            if r.correction in args.corrections and r.proposal == args.proposal]
    if not runs:
        p.error(f"no run of preset {args.preset!r} has proposal {args.proposal!r} and a "
                f"correction in {args.corrections}")
    results, json_path = [], None
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)  # write_text does not create it
        json_path = os.path.join(args.output_dir, "scann.json")
        if os.path.exists(json_path):
            with open(json_path, encoding="utf-8") as f:
                results = json.load(f)
            if not isinstance(results, list) or any("indexes" not in r for r in results):
                p.error(f"{json_path} is not this script's output (a list of runs with "
                        "'indexes'); move it away")
    done = {json.dumps(r["run"], sort_keys=True) for r in results}
    world, host = None, machine()
    for run in runs:
        if json.dumps(dataclasses.asdict(run), sort_keys=True) in done:
            continue
        world = world or study.World(run)  # one world: the runs differ in seed and loss only
        results.append(evaluate_run(run, world, tuned=args.tuned))
        if json_path:  # after every run, so a killed job keeps what it finished
            write_text(json_path, json.dumps(results, indent=1) + "\n")
            write_text(os.path.join(args.output_dir, "scann.md"), report(results, host))
    text = report(results, host)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
