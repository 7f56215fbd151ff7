"""`tfrs-logq demo`: none vs TFRS's logQ (`logq-tfrs`) vs corrected on the synthetic stream.

Trains one two-tower model per correction with in-batch negatives on the same
stream (same seed, same batches), then measures Recall@10/100/1000 of the
held-out targets against the full catalog, beside the oracle that ranks by the
true ``P(d | u)``. Writes ``results.csv`` and ``recall.png``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq._util.atomic import save_figure, write_csv
from tfrs_logq.frequency import CountMinSketch, ExactFrequency
from tfrs_logq.metrics import recall_ndcg_from_ranks, target_ranks
from tfrs_logq.pipelines.synthetic import SyntheticConfig, SyntheticStream
from tfrs_logq.proposal import standard_positive_share
from tfrs_logq.studies.demo_config import DemoConfig
from tfrs_logq.tasks import CorrectedRetrieval
from tfrs_logq.towers.training import positive_share
from tfrs_logq.two_tower import TwoTowerModel

KS = (10, 100, 1000)
EVAL_START_BATCH = 10**9  # evaluation batches come from a disjoint index range


class StepLines(tf.keras.callbacks.Callback):
    """Prints a line every ``every`` training steps: the step, the loss, the seconds
    spent and an estimate of those left (for logs and pipes, where Keras' progress bar
    is one line for the whole run)."""

    def __init__(self, steps: int, every: int) -> None:
        super().__init__()
        self.steps, self.every = int(steps), max(1, int(every))

    def on_train_begin(self, logs=None) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        done = batch + 1
        if done % self.every and done != self.steps:
            return
        spent = time.perf_counter() - self._start
        loss = float((logs or {}).get("loss", float("nan")))
        print(f"  step {done:,}/{self.steps:,}: loss {loss:.3f}, {spent:.0f} s, about "
              f"{spent / done * (self.steps - done):.0f} s left", flush=True)


def _frequency(kind: str, stream: SyntheticStream) -> Optional[tf.Module]:
    if kind == "count-min":
        return CountMinSketch(depth=4, width=1 << 16, seed=1)
    if kind == "true":
        # The generator's exact unigram Q(d), as counts out of 1e12.
        q = np.exp(stream.item_log_marginal())
        q[0] = 0.0
        return ExactFrequency.from_counts(q * 1e12, min_count=1e-6)
    raise ValueError(f"`frequency` must be 'count-min' or 'true', received {kind!r}.")


def train_and_evaluate(config: DemoConfig, correction: str, stream: SyntheticStream,
                       eval_batch: dict, verbose="auto") -> dict:
    """Trains and scores one correction. ``verbose``: Keras' (``"auto"``, 0, 1), or 2 for
    a `StepLines` line every tenth of the steps."""
    tf.keras.utils.set_random_seed(config.seed)
    task = CorrectedRetrieval(correction=correction, remove_accidental_hits=True)
    model = TwoTowerModel(
        stream.config.num_items + 1, config.embedding_dim, task,
        frequency=_frequency(config.frequency, stream),
    )
    model.compile(optimizer=tf.keras.optimizers.Adam(config.learning_rate))
    train = stream.dataset(config.batch_size, num_batches=config.steps)
    callbacks = []
    if verbose == 2:
        callbacks, verbose = [StepLines(config.steps, -(-config.steps // 10))], 0
    model.fit(train, epochs=1, verbose=verbose, callbacks=callbacks)
    ranks = target_ranks(
        model.query_tower(eval_batch["history"]), model.item_embeddings(), eval_batch["target"]
    )
    metrics = recall_ndcg_from_ranks(ranks, KS)
    log_q = stream.item_log_marginal()
    share = positive_share(model, {"history": eval_batch["history"].numpy(),
                                   "targets": eval_batch["target"].numpy()},
                           log_q, config.batch_size - 1)
    # No seconds per run: one run each on a shared machine is no comparison of speeds.
    return {"method": f"in-batch, {correction}", **{f"recall@{k}": metrics[f"recall@{k}"]
                                                    for k in KS},
            "model_positive_share": round(share["positive_share_q50"], 4)}


def oracle_row(stream: SyntheticStream, eval_batch: dict) -> dict:
    """Recall@k of ranking by the true P(d|u): target in the user's true top-k."""
    users, targets = eval_batch["user_id"].numpy(), eval_batch["target"].numpy()
    hits = {k: [] for k in KS}
    for start in range(0, len(users), 512):
        top, _ = stream.true_top_k(users[start:start + 512], max(KS))
        top = top.numpy()
        t = targets[start:start + 512, None]
        for k in KS:
            hits[k].append((top[:, :k] == t).any(axis=1))
    return {"method": "oracle (true P(d|u))",
            **{f"recall@{k}": float(np.concatenate(hits[k]).mean()) for k in KS},
            "model_positive_share": ""}


SMALL_SHARE = 0.1  # below it the demo's regime line says how to move the world


def regime_line(stream: SyntheticStream, eval_batch: dict, batch_size: int) -> str:
    """Where this world puts the losses: the truth's P(p|u)/Q(p) at the held-out pairs
    against the in-batch negatives, as the positive's share of the standard denominator."""
    targets = eval_batch["target"].numpy()
    log_p = stream.true_log_prob(eval_batch["user_id"], targets).numpy()
    ratio = float(np.median(np.exp(log_p - stream.item_log_marginal()[targets])))
    share = float(standard_positive_share(ratio, batch_size - 1))
    line = (f"regime: at the truth P(p|u)/Q(p) has median {ratio:,.1f} against about "
            f"{batch_size - 1:,} in-batch negatives, so the positive's median share of the "
            f"standard loss's denominator is {share:.3f}; standard and corrected logQ can "
            "differ only where it is large (research/study.md)")
    if share < SMALL_SHARE:
        line += ("; more and sharper topics raise it (e.g. --num-topics 10000 "
                 "--topic-sharpness 8 --synthetic-users 20000)")
    return line


def write_outputs(rows: list[dict], output_dir: str, title: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    write_csv(os.path.join(output_dir, "results.csv"), rows, list(rows[0].keys()))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(rows)
    x = np.arange(len(KS))
    for i, row in enumerate(rows):
        values = [row[f"recall@{k}"] for k in KS]
        bars = ax.bar(x + i * width, values, width, label=row["method"])
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set_xticks(x + width * (len(rows) - 1) / 2, [f"Recall@{k}" for k in KS])
    ax.set_ylabel("recall of held-out targets")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, os.path.join(output_dir, "recall.png"), format="png", dpi=120)
    plt.close(fig)


def format_table(rows: list[dict]) -> str:
    header = f"| {'method':<24} | " + " | ".join(f"Recall@{k:<4}" for k in KS) + " |"
    lines = [header, "|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|"]
    for row in rows:
        lines.append(f"| {row['method']:<24} | "
                     + " | ".join(f"{row[f'recall@{k}']:<11.4f}" for k in KS) + " |")
    return "\n".join(lines)


def difference_lines(rows: list[dict]) -> list[str]:
    """What the table says about standard against corrected logQ, in words: the
    differences at each k, the trained model's regime, and what one seed cannot tell."""
    by = {row["method"]: row for row in rows}
    standard, corrected = by.get("in-batch, logq-tfrs"), by.get("in-batch, corrected")
    if not standard or not corrected:
        return []
    diffs = ", ".join(f"{corrected[f'recall@{k}'] - standard[f'recall@{k}']:+.4f} at {k}"
                      for k in KS)
    share = corrected.get("model_positive_share")
    return [f"corrected minus standard logQ, Recall@k: {diffs}.",
            f"The trained model's median positive share of the standard denominator is "
            f"{share}: where it is large the two losses differ, and which wins depends on k "
            "(and on the standard form and sampler: research/study.md).",
            "One seed on one synthetic world: a single run's difference includes the "
            "seed-to-seed noise, which this demo does not measure. For a paired verdict with "
            "intervals on your own log: tfrs-logq compare (docs/compare.md)."]


def run_demo(config: DemoConfig, output_dir: str, verbose="auto", as_json: bool = False) -> list:
    """Trains each correction and writes the outputs; unless ``as_json``, says what it is
    doing at each step with the seconds spent so far (``verbose`` as `train_and_evaluate`)."""
    start = time.perf_counter()

    def say(message: str) -> None:
        if not as_json:
            print(f"[{time.perf_counter() - start:4.0f} s] {message}", flush=True)

    say(f"synthetic stream: {config.num_items:,} items, {config.num_users:,} users, "
        f"{config.num_topics:,} topics (sharpness {config.topic_sharpness:g}); "
        f"{config.num_eval:,} held-out targets and the oracle's top {max(KS):,}")
    stream = SyntheticStream(SyntheticConfig(
        num_items=config.num_items, num_users=config.num_users, num_topics=config.num_topics,
        topic_sharpness=config.topic_sharpness, seed=config.seed))
    eval_batch = next(iter(stream.dataset(config.num_eval, num_batches=1,
                                          start_batch=EVAL_START_BATCH)))
    rows = [oracle_row(stream, eval_batch)]
    say(regime_line(stream, eval_batch, config.batch_size))
    for number, correction in enumerate(config.corrections, 1):
        say(f"{number}/{len(config.corrections)}: training with correction={correction!r} "
            f"({config.steps:,} steps x batch {config.batch_size:,}), then Recall@k over "
            "the full catalog")
        rows.append(train_and_evaluate(config, correction, stream, eval_batch, verbose))
        say(f"{number}/{len(config.corrections)}: {correction}: Recall@10 "
            f"{rows[-1]['recall@10']:.4f}")
    title = (f"Synthetic stream: V={config.num_items:,} items, in-batch negatives, "
             f"{config.steps} steps x {config.batch_size}, log Q from {config.frequency}")
    write_outputs(rows, output_dir, title)
    if as_json:
        print(json.dumps({"config": dataclasses.asdict(config), "results": rows}))
    else:
        print("\n" + title + "\n" + format_table(rows) + "\n")
        for line in difference_lines(rows):
            print(line)
        say(f"wrote {os.path.join(output_dir, 'results.csv')} and "
            f"{os.path.join(output_dir, 'recall.png')}")
    return rows
