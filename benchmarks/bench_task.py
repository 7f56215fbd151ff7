"""Step time of CorrectedRetrieval vs stock tfrs.tasks.Retrieval with logQ.

Forward + backward (gradients w.r.t. both embedding matrices) of the task at
batch B queries + N extra negatives, dimension d, in a tf.function. Variants are
interleaved round-robin so that machine noise hits all of them alike.

    python benchmarks/bench_task.py [--batch 4096 --extra 4096 --dim 64 --rounds 5 --xla]
        [--against COMMIT]

``--against COMMIT`` adds the task of that commit (its tasks.py, losses.py and
proposal.py, loaded as a separate package) as "pinned ..." variants beside the
working tree's, in the same interleaved rounds: before/after from one run.
"""

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile

from common import machine, time_fn  # first: sets TF_USE_LEGACY_KERAS before TFRS

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402

from tfrs_logq import CorrectedRetrieval  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PINNED_MODULES = ("tasks", "losses", "proposal")


def load_pinned(commit: str):
    """``CorrectedRetrieval`` of ``commit``: its three loss modules copied into a
    temporary package ``tfrs_logq_pinned`` (imports rewritten to it)."""
    root = tempfile.mkdtemp(prefix="bench-task-pinned-")
    package = os.path.join(root, "tfrs_logq_pinned")
    os.makedirs(package)
    open(os.path.join(package, "__init__.py"), "w").close()
    for name in PINNED_MODULES:
        source = subprocess.run(["git", "show", f"{commit}:tfrs_logq/{name}.py"], cwd=ROOT,
                                check=True, capture_output=True, text=True).stdout
        for other in PINNED_MODULES:
            source = source.replace(f"tfrs_logq.{other}", f"tfrs_logq_pinned.{other}")
        with open(os.path.join(package, f"{name}.py"), "w") as f:
            f.write(source)
    sys.path.insert(0, root)
    return importlib.import_module("tfrs_logq_pinned.tasks").CorrectedRetrieval


def git_commit(ref: str = "HEAD") -> str:
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True,
                         text=True)
    return out.stdout.strip() or "?"


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--extra", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--xla", action="store_true")
    parser.add_argument("--against", metavar="COMMIT", default=None,
                        help="also time that commit's CorrectedRetrieval, interleaved")
    parser.add_argument("--only", nargs="+", default=None, metavar="VARIANT",
                        help="time only these variants (default: all)")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    n = args.batch + args.extra
    q = tf.constant(rng.normal(size=(args.batch, args.dim)).astype(np.float32))
    c = tf.constant(rng.normal(size=(n, args.dim)).astype(np.float32))
    ids = tf.constant(rng.zipf(1.2, size=n) % 200_000, tf.int64)
    prob = tf.constant(rng.uniform(1e-5, 1e-2, size=n).astype(np.float32))

    def make(task):
        @tf.function(jit_compile=args.xla)
        def step(q, c):
            with tf.GradientTape() as tape:
                tape.watch([q, c])
                loss = task(q, c, candidate_ids=ids, candidate_sampling_probability=prob,
                            compute_metrics=False, compute_batch_metrics=False)
            gq, gc = tape.gradient(loss, [q, c])
            return loss, gq, gc

        return lambda: [t.numpy() for t in step(q, c)]

    def ours(cls, prefix):
        return {
            f"{prefix} logq-tfrs": lambda: make(cls(correction="logq-tfrs")),
            f"{prefix} logq-tfrs + hit removal": lambda: make(
                cls(correction="logq-tfrs", remove_accidental_hits=True)),
            f"{prefix} corrected": lambda: make(cls(correction="corrected")),
            f"{prefix} corrected + dedup": lambda: make(
                cls(correction="corrected", deduplicate_candidates=True)),
        }

    builders = {
        "stock TFRS logQ": lambda: make(tfrs.tasks.Retrieval()),
        "stock TFRS logQ + hit removal": lambda: make(
            tfrs.tasks.Retrieval(remove_accidental_hits=True)),
        **ours(CorrectedRetrieval, "ours"),
    }
    if args.against:
        builders.update(ours(load_pinned(args.against), f"pinned {args.against[:9]}"))
    keep = set(args.only or builders) | {"stock TFRS logQ", "stock TFRS logQ + hit removal"}
    variants = {name: build() for name, build in builders.items() if name in keep}
    load_before = load_average()
    times = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            times[name].append(time_fn(fn, warmup=1, repeats=args.repeats)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"machine: {machine()}")
    print(f"load average (1/5/15 min) before {load_before}, after {load_average()}; "
          f"working tree at {git_commit()}" + (" (+ uncommitted changes)" if subprocess.run(
              ["git", "diff", "--quiet", "HEAD", "--", "tfrs_logq/tasks.py",
               "tfrs_logq/losses.py", "tfrs_logq/proposal.py"], cwd=ROOT).returncode else ""))
    print(f"task forward+backward, batch {args.batch} + {args.extra} extra negatives, "
          f"d={args.dim}, {'XLA' if args.xla else 'graph'}; median of {args.rounds} rounds "
          f"(each the median of {args.repeats} steps), variants interleaved")
    base = med["stock TFRS logQ"]
    base_hits = med["stock TFRS logQ + hit removal"]
    width = max(32, max(len(k) for k in med))
    print(f"| {'variant':<{width}} | ms/step | vs stock logQ | vs stock logQ + hits |")
    print(f"|{'-' * (width + 2)}|---------|---------------|----------------------|")
    for name, t in med.items():
        print(f"| {name:<{width}} | {t * 1e3:7.1f} | {t / base:13.3f} | {t / base_hits:20.3f} |")


if __name__ == "__main__":
    main()
