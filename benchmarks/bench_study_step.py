"""The training step of `lab.study` against stock TFRS, and against the catalog size.

Part 1, the task inside the step: the study's two-tower step (`study.TowerModel`,
mixed negatives from `study.draw_negatives`, `LazyAdam`, `CorrectedRetrieval`
"corrected" with the run's score mask) against the same step with stock
`tfrs.tasks.Retrieval` given the same query/candidate embeddings and the same
negatives: logQ through its ``candidate_sampling_probability`` (``exp`` of the
same ``log Q``), the extra negatives appended as candidates; once as is and
once with TFRS's accidental-hit removal and the same score mask (what the
corrected task always masks). One process, variants interleaved round by round,
medians.

Part 2, the catalog: time and peak memory of the study's step for catalogs of
100,000 / 1,000,000 / 10,000,000 items, each configuration in its own
subprocess (peak RSS = VmHWM of /proc/self/status, beside the RSS after set-up),
with `lazy-adam` and with tf-keras `adam`. A configuration whose tables would not
fit in the memory available now is skipped and says so.

Batches are drawn from a Zipf(1.05) unigram over the catalog (the study's
exponent) with numpy, not from the synthetic stream (whose world would
dominate memory at 10M items); ``log Q`` is that unigram's, per draw.

    python benchmarks/bench_study_step.py             # the headline preset's shapes, ~20 min loaded
    python benchmarks/bench_study_step.py --shape issue  # batch 4,096 + 4,096 + 4,096, d = 64
    python benchmarks/bench_study_step.py --quick     # small shapes, seconds (tests run it)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import machine  # first: sets TF_USE_LEGACY_KERAS before TFRS

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402

from lab import study  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("ours corrected", "stock TFRS logQ", "stock TFRS logQ + hits + mask")
_CATALOGS = [(100_000, "lazy-adam"), (1_000_000, "lazy-adam"), (10_000_000, "lazy-adam"),
             (100_000, "adam"), (1_000_000, "adam")]
_HEADLINE = study.PRESETS["headline"]["base"]
_HEADLINE_NEGATIVES = dict((s, (k_in, k_uni)) for s, k_in, k_uni
                           in study.PRESETS["headline"]["axes"]["negatives"])["mixed"]
SHAPES = {
    # The headline preset's shapes (lab/study.py), whatever they are now.
    "headline": dict(batch=_HEADLINE["batch_size"], in_batch=_HEADLINE_NEGATIVES[0],
                     uniform=_HEADLINE_NEGATIVES[1], dim=_HEADLINE["embedding_dim"],
                     ratio_items=_HEADLINE["num_items"], rounds=5, steps=2, catalog_steps=4,
                     catalog_rounds=2, catalogs=_CATALOGS),
    # The shapes issue 26 quoted (batch 4,096 + 4,096 extra negatives, d = 64).
    "issue": dict(batch=4096, uniform=4096, in_batch=4096, dim=64, ratio_items=1_000_000,
                  rounds=5, steps=2, catalog_steps=4, catalog_rounds=2, catalogs=_CATALOGS),
}
QUICK = dict(batch=128, uniform=128, in_batch=128, dim=16, ratio_items=5_000,
             rounds=2, steps=1, catalog_steps=2, catalog_rounds=1,
             catalogs=[(1_000, "lazy-adam"), (10_000, "adam")])


def proc_status(field: str) -> float:
    """``field`` of /proc/self/status in MiB (VmHWM: peak RSS, VmRSS: now)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def mem_available_mib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def estimated_mib(num_items: int, dim: int) -> float:
    """Two catalog-sized tables (query history + item tower), two moments each and
    one table's initial values in flight, float32, plus 1.5 GiB for TensorFlow and
    the step."""
    return 7 * (num_items + 1) * dim * 4 / 2**20 + 1536


def make_run(shape: dict, num_items: int, optimizer: str) -> study.Run:
    return study.Run(num_items=num_items, num_users=1, sampler="mixed",
                     num_in_batch=shape["in_batch"], num_uniform=shape["uniform"],
                     proposal="unigram", correction="corrected", batch_size=shape["batch"],
                     embedding_dim=shape["dim"], optimizer=optimizer, steps=1)


def zipf_table_and_batch(run: study.Run, seed: int = 0):
    """`[V + 1]` float32 log Q of a Zipf(1.05) unigram (row 0: padding), and one batch
    (history `[B, L]`, target `[B]`) drawn from it."""
    rank = np.arange(1, run.num_items + 1, dtype=np.float64)
    p = rank ** -run.zipf_exponent
    p /= p.sum()
    table = np.concatenate([[0.0], np.log(p)]).astype(np.float32)
    rng = np.random.default_rng(seed)
    draws = rng.choice(run.num_items, size=(run.batch_size, run.history_length + 1), p=p) + 1
    batch = {"history": tf.constant(draws[:, :-1], tf.int64),
             "target": tf.constant(draws[:, -1], tf.int64)}
    return tf.constant(table), batch


def make_step(run: study.Run, table: tf.Tensor, variant: str):
    """The study's training step (as `study.train` builds it) with ``variant``'s task."""
    model = study.TowerModel(run)
    optimizer = study.make_optimizer(run)
    optimizer.build(model.weights)
    if variant == "ours corrected":
        task = study.make_task(run)
    else:
        task = tfrs.tasks.Retrieval(remove_accidental_hits=variant.endswith("mask"))

    @tf.function
    def step(batch, index):
        positives = batch["target"]
        negatives = study.draw_negatives(run, positives, index, table)
        ids = tf.concat([positives, negatives.ids], 0)
        log_q = tf.concat([study.positive_log_q(run, table, positives), negatives.log_q], 0)
        score_mask = negatives.score_mask(tf.shape(positives)[0])
        with tf.GradientTape() as tape:
            queries = model.query_tower(batch["history"])
            candidates = model.item_tower(ids)
            if variant == "ours corrected":
                loss = task(queries, candidates, candidate_ids=ids,
                            candidate_log_sampling_probability=log_q, score_mask=score_mask,
                            compute_metrics=False, compute_batch_metrics=False)
            elif variant == "stock TFRS logQ":
                loss = task(queries, candidates, candidate_sampling_probability=tf.exp(log_q),
                            compute_metrics=False, compute_batch_metrics=False)
            else:
                loss = task(queries, candidates, candidate_sampling_probability=tf.exp(log_q),
                            candidate_ids=ids, score_mask=score_mask,
                            compute_metrics=False, compute_batch_metrics=False)
        grads = tape.gradient(loss, model.weights)
        optimizer.apply_gradients(zip(grads, model.weights))
        return loss

    return step


def timed_steps(step, batch, start: int, count: int) -> list[float]:
    times = []
    for i in range(start, start + count):
        t0 = time.perf_counter()
        step(batch, tf.constant(i, tf.int64)).numpy()
        times.append(time.perf_counter() - t0)
    return times


def compare(shape: dict) -> dict:
    """Part 1: median seconds per step of each variant, interleaved."""
    run = make_run(shape, shape["ratio_items"], "lazy-adam")
    table, batch = zipf_table_and_batch(run)
    steps = {v: make_step(run, table, v) for v in VARIANTS}
    for v, step in steps.items():
        timed_steps(step, batch, 0, 1)  # trace and warm up
    samples = {v: [] for v in VARIANTS}
    for r in range(shape["rounds"]):
        for v, step in steps.items():
            samples[v].append(statistics.median(
                timed_steps(step, batch, 1 + r * shape["steps"], shape["steps"])))
    return {v: statistics.median(s) for v, s in samples.items()}


def one_catalog(shape: dict, num_items: int, optimizer: str) -> dict:
    """Part 2, in a subprocess: the study step at one catalog size and optimizer."""
    run = make_run(shape, num_items, optimizer)
    table, batch = zipf_table_and_batch(run)
    step = make_step(run, table, "ours corrected")
    rss_setup = proc_status("VmRSS")
    timed_steps(step, batch, 0, 1)  # trace and warm up
    times = timed_steps(step, batch, 1, shape["catalog_steps"])
    return {"num_items": num_items, "optimizer": optimizer,
            "ms_per_step": 1e3 * statistics.median(times), "steps": len(times),
            "rss_setup_mib": rss_setup, "peak_rss_mib": proc_status("VmHWM")}


def one_subprocess(num_items: int, optimizer: str, dim: int, quick: bool,
                   shape_name: str = "headline") -> dict:
    need, avail = estimated_mib(num_items, dim), mem_available_mib()
    if need > 0.85 * avail:  # leave the machine's other jobs room
        return {"skipped": f"needs about {need:,.0f} MiB, {avail:,.0f} MiB available"}
    cmd = [sys.executable, os.path.abspath(__file__), "--one", str(num_items), optimizer]
    cmd += ["--quick"] if quick else ["--shape", shape_name]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"skipped": f"subprocess failed (rc {out.returncode}): "
                           f"{out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


def catalogs(shape: dict, quick: bool, shape_name: str = "headline") -> list[dict]:
    """Every configuration once per round, the order reversed every other round (so
    that a change of the machine's load hits both ends alike); per configuration the
    median of its rounds' ms/step and the largest peak RSS."""
    configs = list(shape["catalogs"])
    results = {c: [] for c in configs}
    for r in range(shape["catalog_rounds"]):
        for num_items, optimizer in (configs if r % 2 == 0 else configs[::-1]):
            results[(num_items, optimizer)].append(
                one_subprocess(num_items, optimizer, shape["dim"], quick, shape_name))
    rows = []
    for (num_items, optimizer), got in results.items():
        done = [g for g in got if "skipped" not in g]
        row = {"num_items": num_items, "optimizer": optimizer}
        if not done:
            row["skipped"] = got[-1]["skipped"]
        else:
            row.update(ms_per_step=statistics.median(g["ms_per_step"] for g in done),
                       rounds=len(done),
                       rss_setup_mib=max(g["rss_setup_mib"] for g in done),
                       peak_rss_mib=max(g["peak_rss_mib"] for g in done))
        rows.append(row)
    return rows


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small shapes, a few seconds")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="headline",
                        help="the study's headline preset (default) or the issue's shapes")
    parser.add_argument("--one", nargs=2, metavar=("NUM_ITEMS", "OPTIMIZER"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--skip-compare", action="store_true", help="part 2 only")
    args = parser.parse_args()
    shape = QUICK if args.quick else SHAPES[args.shape]
    if args.one:
        print(json.dumps(one_catalog(shape, int(args.one[0]), args.one[1])), flush=True)
        return

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                            capture_output=True, text=True).stdout.strip() or "?"
    print(f"machine: {machine()}")
    print(f"commit {commit}; load average (1/5/15 min) at start {load_average()}; "
          f"{'quick' if args.quick else args.shape + ' shapes'}")
    negatives = f"{shape['uniform']:,} uniform + {shape['in_batch']:,} in-batch negatives"
    started = time.perf_counter()
    if not args.skip_compare:
        med = compare(shape)
        print()
        print(f"## Study step vs stock TFRS (batch {shape['batch']:,}, {negatives}, "
              f"d = {shape['dim']}, V = {shape['ratio_items']:,}, lazy-adam; median of "
              f"{shape['rounds']} interleaved rounds x {shape['steps']} step(s))")
        print("| variant | ms/step | vs stock TFRS logQ | vs stock + hits + mask |")
        print("|---|---|---|---|")
        base, like = med["stock TFRS logQ"], med["stock TFRS logQ + hits + mask"]
        for v, t in med.items():
            print(f"| {v} | {t * 1e3:.1f} | {t / base:.3f} | {t / like:.3f} |")
        print(f"ratio corrected / stock TFRS logQ: {med['ours corrected'] / base:.3f}")
    rows = catalogs(shape, args.quick, args.shape)
    print()
    print(f"## Study step against catalog size (batch {shape['batch']:,}, {negatives}, "
          f"d = {shape['dim']}, corrected; one subprocess per row and round, each the median "
          f"of {shape['catalog_steps']} steps after one warm-up; median of "
          f"{shape['catalog_rounds']} round(s), the order reversed every other round)")
    print("| items | optimizer | ms/step | RSS after set-up (MiB) | peak RSS (MiB) |")
    print("|---|---|---|---|---|")
    for row in rows:
        if "skipped" in row:
            print(f"| {row['num_items']:,} | {row['optimizer']} | skipped: {row['skipped']} "
                  "| | |")
        else:
            print(f"| {row['num_items']:,} | {row['optimizer']} | {row['ms_per_step']:.1f} | "
                  f"{row['rss_setup_mib']:,.0f} | {row['peak_rss_mib']:,.0f} |")
    print()
    print(f"load average at end {load_average()}; wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
