"""`python -m lab study`: the large-catalog study (the paper's Table 2 setting).

A two-tower model (`HistoryQueryTower` + an item embedding table) is trained on
the synthetic stream (`tfrs_logq.pipelines.synthetic`, whose true ``P(d|u)`` is
known) once per *run*: a cell of the grid

    world (catalog size, topics, sharpness, Zipf exponent, history length)
    x sampler (in-batch deduplicated / uniform / mixed = uniform + in-batch, with counts)
    x proposal (unigram per draw / mixture / inclusion)
    x correction (none / logq-tfrs / logq-official / corrected)
    x seed.

What each option means (``Q`` is the stream's *true* unigram ``Q(d) = E_u P(d|u)``,
so no frequency estimate enters the comparison):

- proposal ``unigram``: every negative, uniform ones too, is corrected with the
  per-draw unigram ``log Q(d)``: the paper's convention, what ``mns-*`` trains.
  ``mixture``: a negative slot's own proposal ``a / V + (1 - a) Q(d)`` with
  ``a = k_uniform / k`` (`proposal.mixture_probability`; pure in-batch has
  ``a = 0``, which is ``unigram``, so that pair is not run twice).
  ``inclusion``: ``1 - (1 - Q(d))^B``, the probability that the ``B`` draws of
  the batch include ``d`` (`proposal.inclusion_log_q`): the proposal of
  deduplicated in-batch negatives; in-batch sampler only.
- correction (`tfrs_logq.corrections`) ``none``: plain sampled softmax. ``logq-tfrs``:
  standard logQ as TFRS's ``Retrieval`` computes it (and the paper writes it),
  ``-s_p + log(e^{s_p - log Q(p)} + sum_i e^{s_i - log Q(d_i)})``, the positive corrected
  too. ``logq-official``: the paper's official code's form, the positive uncorrected
  (``log Q(p) = 0`` in the same formula). ``corrected``: the paper's corrected loss
  (`CorrectedRetrieval`).
  Every correction masks accidental hits, so the four differ only in the loss.

Common random numbers: the world (the users' topic preferences) is drawn from
``world_seed`` and is the same for every run of a preset; seed ``s`` trains on
stream batches ``s * 10^8 + i`` (deterministic in the index), starts from the
weights `tf.keras.utils.set_random_seed(s)` gives and draws its negatives with
stateless ops keyed by ``(s, step)``. Runs that differ only in proposal or
correction therefore see identical batches, initial weights and negatives.

Evaluation, on the same ``num_eval_users`` held-out examples for every run
(stream batch ``10^15``):

(a) exact expected Recall@k = ``sum_{d in model top-k} P(d|u)``, the recall a
    target drawn from ``P(.|u)`` would get on average (no target-sampling noise),
    beside the oracle's (the true top-k);
(b) observed Recall@k of the held-out targets (`metrics.ranks_from_scores`), overall
    and by the target's popularity band: items sorted by ``Q`` descending, *head*
    = the most popular items holding the first third of the interaction mass,
    *torso* the next third, *tail* the rest (each band gets about a third of the
    targets);
(c) quantiles (10/50/90 %) of ``P(p|u)`` and of ``P(p|u) / Q(p)`` for the held-out
    pairs, at the truth and at the trained model (its full-catalog softmax),
    the regime of the row: the positive's share of the standard loss's
    denominator is about ``(P/Q) / (P/Q + n)`` with ``n`` negatives.

Top-k and softmax run brute force over the catalog in chunks of queries
(``chunk x V`` scores at most 2^25 floats, 128 MB, at any ``V``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfrs_logq._util.atomic import write_text
from tfrs_logq._util.hostinfo import machine_description
from tfrs_logq.corrections import check_correction
from tfrs_logq.metrics import ranks_from_scores, recall_ndcg_from_ranks
from tfrs_logq.pipelines.synthetic import SyntheticConfig, SyntheticStream
from tfrs_logq.towers.loop import (  # noqa: F401  (the study's names for the shared step)
    CORRECTIONS,
    NEGATIVES_SALT,
    OPTIMIZERS,
    PROPOSALS,
    SAMPLERS,
    TowerModel,
    checkpoint_key,
    draw_negatives,
    make_optimizer,
    make_task,
    positive_log_q,
    proposal_log_q_table,
    train_loop,
)

KS = (10, 100, 1000)
BANDS = ("head", "torso", "tail")
QUANTILES = (10, 50, 90)
SEED_STRIDE = 10**8  # seed s trains on stream batches s * SEED_STRIDE + i
EVAL_BATCH_INDEX = 10**15  # the held-out examples: one stream batch, the same for every run
MAX_CHUNK_FLOATS = 1 << 25
TRUTH_VERSION = 1  # bump when truth_columns, popularity_bands or the stream's draws change


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the study (a cell of the grid and a seed)."""

    num_items: int = 20_000
    num_users: int = 50_000
    num_topics: int = 50
    topic_sharpness: float = 2.5
    zipf_exponent: float = 1.05
    history_length: int = 10
    sampler: str = "mixed"
    num_in_batch: int = 256
    num_uniform: int = 256
    proposal: str = "unigram"
    correction: str = "corrected"
    seed: int = 0
    steps: int = 200
    batch_size: int = 256
    embedding_dim: int = 32
    learning_rate: float = 3e-3
    optimizer: str = "lazy-adam"
    num_eval_users: int = 2048
    world_seed: int = 0
    eval_at: tuple = ()  # earlier steps also evaluated (the learning curve), one row each

    def __post_init__(self) -> None:
        check_correction(self.correction)
        for name, allowed in (("sampler", SAMPLERS), ("proposal", PROPOSALS),
                              ("optimizer", OPTIMIZERS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, "
                                 f"received {getattr(self, name)!r}.")
        if self.proposal == "inclusion" and self.sampler != "in-batch":
            raise ValueError("`proposal='inclusion'` is the proposal of deduplicated in-batch "
                             f"draws: it needs sampler='in-batch', received {self.sampler!r}.")
        if self.num_eval_users < 1 or self.steps < 0 or self.batch_size < 1:
            raise ValueError(f"bad budget: steps={self.steps}, batch_size={self.batch_size}, "
                             f"num_eval_users={self.num_eval_users}.")
        eval_at = tuple(sorted({int(s) for s in self.eval_at}))
        if any(not 0 < s < self.steps for s in eval_at):
            raise ValueError(f"`eval_at` steps must be in (0, steps={self.steps}), received "
                             f"{self.eval_at}.")
        object.__setattr__(self, "eval_at", eval_at)

    @property
    def num_in_batch_negatives(self) -> int:
        return self.num_in_batch if self.sampler in ("in-batch", "mixed") else 0

    @property
    def num_uniform_negatives(self) -> int:
        return self.num_uniform if self.sampler in ("uniform", "mixed") else 0

    @property
    def run_id(self) -> str:
        """A key of every field (results.csv's first column; resume skips it); an empty
        ``eval_at`` is left out, so rows of grids written before it keep their keys."""
        return "|".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if f.name != "eval_at" or self.eval_at)

    def at(self, steps: int) -> "Run":
        """The run trained for ``steps`` only: the row of an evaluation at ``steps`` is
        that run's (same batches, weights and negatives up to there; the learning rate
        is constant), so it is keyed and reported as it."""
        return dataclasses.replace(self, steps=steps, eval_at=())

    @property
    def evaluations(self) -> tuple:
        """The ``run_id`` of every row this run writes: one per `eval_at` step and the
        last step."""
        return tuple(self.at(s).run_id for s in (*self.eval_at, self.steps))

    def row_fields(self) -> dict:
        fields = dataclasses.asdict(self)
        fields.pop("eval_at")
        return fields

    def world(self) -> SyntheticConfig:
        return SyntheticConfig(
            num_items=self.num_items, num_users=self.num_users, num_topics=self.num_topics,
            zipf_exponent=self.zipf_exponent, topic_sharpness=self.topic_sharpness,
            history_length=self.history_length, seed=self.world_seed)


def grid(base: dict, axes: dict, seeds: Sequence[int]) -> list[Run]:
    """Runs of every combination of ``axes`` (field -> values; ``"negatives"`` takes
    ``(sampler, num_in_batch, num_uniform)`` triples) with ``base``'s other fields.

    Order: scenario, then seed, then proposal and correction, so an interrupted grid
    holds whole seeds. Skipped as duplicates: proposals for ``none`` (only the first
    proposal is run; ``none`` ignores ``Q``) and ``inclusion`` for the other samplers
    (undefined); ``mixture`` for pure in-batch is ``unigram`` (``a = 0``) and runs as it.
    """
    axes = dict(axes)
    proposals = axes.pop("proposal", [base.get("proposal", "unigram")])
    corrections = axes.pop("correction", [base.get("correction", "corrected")])
    negatives = axes.pop("negatives", [(base.get("sampler", "mixed"),
                                        base.get("num_in_batch", 256),
                                        base.get("num_uniform", 256))])
    names = list(axes)
    runs = []
    for values in itertools.product(*(axes[n] for n in names)):
        for sampler, k_in, k_uni in negatives:
            for seed in seeds:
                for correction in corrections:
                    valid = list(dict.fromkeys(
                        "unigram" if p == "mixture" and sampler == "in-batch" else p
                        for p in proposals if not (p == "inclusion" and sampler != "in-batch")))
                    for proposal in (valid[:1] if correction == "none" else valid):
                        runs.append(Run(**{**base, **dict(zip(names, values)),
                                           "sampler": sampler, "num_in_batch": k_in,
                                           "num_uniform": k_uni, "proposal": proposal,
                                           "correction": correction, "seed": seed}))
    return runs


# The world and budget of the `samplers` and `negatives` presets (the sweep's C = 10,000).
_SAMPLERS_BASE = dict(num_items=100_000, num_users=20_000, num_topics=10_000,
                      topic_sharpness=8.0, steps=4000, batch_size=1024, embedding_dim=32,
                      learning_rate=1e-2, num_eval_users=4096)

PRESETS = {
    # The SMALL pilot committed in results/synthetic-study-pilot/ (C = 100: the truth's
    # P/Q median is 37 against 512-1,024 negatives, so the losses nearly coincide).
    "pilot": dict(
        base=dict(num_items=50_000, num_users=50_000, num_topics=100, topic_sharpness=4.0,
                  steps=500, batch_size=512, embedding_dim=32, num_eval_users=4096),
        axes=dict(negatives=[("in-batch", 512, 0), ("mixed", 512, 512)],
                  proposal=["unigram", "mixture"], correction=["logq-tfrs", "corrected"]),
        seeds=[0, 1, 2]),
    # Table 2's analogue at a CPU budget: 1M items, thousands of uniform + in-batch
    # negatives, and a world (10,000 topics, sigma 8) whose truth has P/Q median about
    # 5,000, the order of the number of negatives, so that the positive's share of the
    # standard loss's denominator is large (the regime the paper's catalog is in).
    # 20,000 users: the stream holds two [users, C] float64 tables (3.2 GB here; about
    # 6.4 GB at its peak while they are built).
    "headline": dict(
        base=dict(num_items=1_000_000, num_users=20_000, num_topics=10_000,
                  topic_sharpness=8.0, steps=3000, batch_size=2048, embedding_dim=32,
                  learning_rate=1e-2, num_eval_users=8192),
        axes=dict(negatives=[("mixed", 2048, 2048)], proposal=["unigram", "mixture"],
                  correction=list(CORRECTIONS)),
        seeds=[0, 1, 2]),
    # Where does the correction matter: the number of topics moves the truth's P/Q
    # median from about 40 (C = 100) to about 5,000 (C = 10,000) at sigma 8, against
    # 1,024 in-batch or 1,024 + 1,024 mixed negatives; trained to near the oracle
    # (4,000 steps). Most informative first (C = 10,000).
    "sweep": dict(
        base=dict(num_items=100_000, num_users=20_000, topic_sharpness=8.0, steps=4000,
                  batch_size=1024, embedding_dim=32, learning_rate=1e-2,
                  num_eval_users=4096, proposal="mixture"),
        axes=dict(num_topics=[10_000, 1_000, 100],
                  negatives=[("mixed", 1024, 1024), ("in-batch", 1024, 0)],
                  proposal=["mixture"],
                  correction=["logq-tfrs", "logq-official", "corrected"]),
        seeds=[0, 1, 2]),
    # What the sampler and its proposal do where the correction can matter (the sweep's
    # C = 10,000 world): deduplicated in-batch with the unigram or the inclusion proposal,
    # uniform-only with the unigram convention or its own (constant) log Q, and fewer
    # mixed negatives (256 + 256, a larger share of the positive) with both proposals.
    # Last, the sweep's C = 1,000 in-batch cell (where corrected lost 0.03 Recall@10 to
    # logq-tfrs) with both proposals: is the per-draw unigram log Q of deduplicated
    # draws what costs it? (`parts`: further grids over the preset's base.)
    "samplers": dict(
        base=_SAMPLERS_BASE,
        axes=dict(negatives=[("in-batch", 1024, 0), ("uniform", 0, 1024), ("mixed", 256, 256)],
                  proposal=["unigram", "mixture", "inclusion"],
                  correction=["logq-tfrs", "corrected"]),
        seeds=[0, 1, 2],
        parts=[dict(base=dict(num_topics=1_000),
                    axes=dict(negatives=[("in-batch", 1024, 0)],
                              proposal=["unigram", "inclusion"],
                              correction=["logq-tfrs", "corrected"]))]),
    # The number of negatives, on the samplers' world and pin: mixed 256 + 256 (its cell)
    # against 1,024 + 1,024 with the mixture proposal, paired by seed within each count.
    "negatives": dict(
        base=_SAMPLERS_BASE,
        axes=dict(negatives=[("mixed", 256, 256), ("mixed", 1024, 1024)],
                  proposal=["mixture"], correction=["logq-tfrs", "corrected"]),
        seeds=[0, 1, 2]),
    # How the gap moves with the catalog and the sharpness, one knob at a time from the
    # sweep's C = 10,000 in-batch cell (its largest share, 0.81): the same budget at
    # 100,000 items (the reference, on this preset's pin) and at 1,000,000, then sigma 4
    # (a flatter preference, a smaller P/Q) at 100,000 items.
    "scale": dict(
        base=dict(num_users=20_000, num_topics=10_000, topic_sharpness=8.0, steps=4000,
                  batch_size=1024, embedding_dim=32, learning_rate=1e-2,
                  num_eval_users=4096),
        axes=dict(num_items=[100_000, 1_000_000], negatives=[("in-batch", 1024, 0)],
                  correction=["logq-tfrs", "logq-official", "corrected"]),
        seeds=[0, 1, 2],
        parts=[dict(base=dict(num_items=100_000, topic_sharpness=4.0),
                    axes=dict(negatives=[("in-batch", 1024, 0)],
                              correction=["logq-tfrs", "logq-official", "corrected"]))]),
    # Issue 38's budget map: where does the sign of corrected minus each standard form
    # settle as the model approaches the truth? The sweep's C = 10,000 world at 100,000
    # items, one run of 16,000 steps of 2,048 evaluated at 1,000 and 4,000 steps too
    # (20 / 82 / 328 training examples per item), by the number of negatives (mixed,
    # half in-batch, half uniform, the mixture proposal).
    "budget": dict(
        base=dict(num_items=100_000, num_users=20_000, num_topics=10_000,
                  topic_sharpness=8.0, steps=16_000, eval_at=(1000, 4000), batch_size=2048,
                  embedding_dim=32, learning_rate=1e-2, num_eval_users=4096,
                  proposal="mixture"),
        axes=dict(negatives=[("mixed", 128, 128), ("mixed", 512, 512), ("mixed", 2048, 2048)],
                  proposal=["mixture"],
                  correction=["logq-tfrs", "logq-official", "corrected"]),
        seeds=[0, 1, 2]),
    # Issue 38's learning curve at the headline's scale on CPU (the accelerator study's
    # 1M-item curve, in TensorFlow): 10,000 topics, sigma 8, mixed 4,096 + 4,096, batch
    # 4,096, evaluated at 3k, 10k, 30k and 100k steps; one seed of the three forms first.
    "curve": dict(
        base=dict(num_items=1_000_000, num_users=20_000, num_topics=10_000,
                  topic_sharpness=8.0, steps=100_000, eval_at=(3000, 10_000, 30_000),
                  batch_size=4096, embedding_dim=32, learning_rate=1e-2,
                  num_eval_users=8192, proposal="mixture"),
        axes=dict(negatives=[("mixed", 4096, 4096)], proposal=["mixture"],
                  correction=["logq-tfrs", "logq-official", "corrected"]),
        seeds=[0]),
}


def preset_runs(name: str, seeds: Optional[Sequence[int]] = None, **overrides) -> list[Run]:
    if name not in PRESETS:
        raise ValueError(f"`preset` must be one of {tuple(PRESETS)}, received {name!r}.")
    spec = PRESETS[name]
    seeds = spec["seeds"] if seeds is None else seeds
    runs = grid({**spec["base"], **overrides}, spec["axes"], seeds)
    for part in spec.get("parts", ()):
        runs += grid({**spec["base"], **part["base"], **overrides}, part["axes"], seeds)
    return runs


# ---------------------------------------------------------------------------- training
# The two-tower step (model, negatives, task, optimizer, exact resume) is
# `tfrs_logq.towers.loop`'s, shared with the trainer on users' logs.


def train_batches(run: Run, stream: SyntheticStream, first_step: int = 0) -> tf.data.Dataset:
    return stream.dataset(run.batch_size, num_batches=run.steps - first_step,
                          start_batch=run.seed * SEED_STRIDE + first_step)


def train(run: Run, stream: SyntheticStream, log_q_table: np.ndarray,
          record: Optional[list] = None, checkpoint_dir: Optional[str] = None,
          checkpoint_seconds: float = 120.0,
          on_step: Optional[Callable[[int], None]] = None,
          on_eval: Optional[Callable[[int, TowerModel, dict], None]] = None
          ) -> tuple[TowerModel, dict]:
    """Trains one run on the stream (`tfrs_logq.towers.loop.train_loop`, which says what
    ``record``, ``checkpoint_dir``, ``on_step`` and ``on_eval`` do)."""
    return train_loop(run, lambda first: train_batches(run, stream, first), log_q_table,
                      record=record, checkpoint_dir=checkpoint_dir,
                      checkpoint_seconds=checkpoint_seconds, on_step=on_step, on_eval=on_eval)


# ---------------------------------------------------------------------------- evaluation

def popularity_bands(log_q_unigram: np.ndarray) -> np.ndarray:
    """`[V + 1]` int band of every id: 0 head, 1 torso, 2 tail (see the module docstring)."""
    q = np.exp(log_q_unigram[1:])
    order = np.argsort(-q, kind="stable")
    before = np.cumsum(q[order]) - q[order]  # mass of the strictly more popular items
    band = np.zeros(len(q), np.int64)
    band[order] = np.minimum((3.0 * before / q.sum()).astype(np.int64), 2)
    return np.concatenate([[2], band])


def model_top_k(queries: np.ndarray, items: np.ndarray, k: int,
                targets: Optional[np.ndarray] = None) -> tuple:
    """Brute-force top-``k`` ids of every query over ids ``1..V`` (row 0 of ``items`` is
    padding) and, when ``targets`` are given, the model's ``log P(target|u)`` under its
    full-catalog softmax and the target's 0-based rank (`metrics.ranks_from_scores`),
    all from one pass over the scores: ``(top, log_p, ranks)``, the last two None
    without targets. Chunked: ``chunk x V`` scores at most `MAX_CHUNK_FLOATS`."""
    items_t = tf.constant(items[1:], tf.float32)  # column j is item j + 1
    num_items = items.shape[0] - 1
    chunk = max(1, MAX_CHUNK_FLOATS // num_items)
    tops, log_probs, ranks = [], [], []
    for start in range(0, len(queries), chunk):
        scores = tf.matmul(tf.constant(queries[start:start + chunk], tf.float32), items_t,
                           transpose_b=True)
        tops.append(tf.math.top_k(scores, k=min(k, num_items)).indices.numpy() + 1)
        if targets is not None:
            column = tf.constant(targets[start:start + chunk], tf.int64) - 1
            log_probs.append((tf.gather(scores, column, batch_dims=1)
                              - tf.reduce_logsumexp(scores, axis=1)).numpy())
            ranks.append(ranks_from_scores(scores, column).numpy())
    if targets is None:
        return np.concatenate(tops).astype(np.int64), None, None
    return (np.concatenate(tops).astype(np.int64), np.concatenate(log_probs),
            np.concatenate(ranks))


def exact_expected_recall(stream: SyntheticStream, users: np.ndarray, top: np.ndarray,
                          ks: Sequence[int] = KS) -> dict:
    """Mean over users of ``sum_{d in top[:, :k]} P(d|u)`` for every ``k``."""
    chunk = max(1, MAX_CHUNK_FLOATS // max(stream.config.num_topics, top.shape[1]))
    sums = np.concatenate([
        np.cumsum(np.exp(stream.true_log_prob(users[i:i + chunk], top[i:i + chunk]).numpy()),
                  axis=1)
        for i in range(0, len(users), chunk)])
    return {k: float(sums[:, min(k, sums.shape[1]) - 1].mean()) for k in ks}


def quantiles(values: np.ndarray, prefix: str) -> dict:
    return {f"{prefix}_q{q}": float(np.percentile(values, q)) for q in QUANTILES}


def evaluate(model: TowerModel, stream: SyntheticStream, eval_batch: dict,
             log_q_unigram: np.ndarray, bands: np.ndarray) -> dict:
    users = eval_batch["user_id"].numpy()
    targets = eval_batch["target"].numpy()
    queries = model.query_tower(eval_batch["history"]).numpy()
    items = model.item_tower.embeddings.numpy()
    top, model_log_p, ranks = model_top_k(queries, items, max(KS), targets)
    row = {f"exact_recall@{k}": v
           for k, v in exact_expected_recall(stream, users, top).items()}
    overall = recall_ndcg_from_ranks(ranks, KS)
    row.update({f"observed_recall@{k}": overall[f"recall@{k}"] for k in KS})
    target_band = bands[targets]
    for b, name in enumerate(BANDS):
        part = recall_ndcg_from_ranks(ranks[target_band == b], KS)
        row.update({f"{name}_recall@{k}": part[f"recall@{k}"] for k in KS})
    log_q_target = log_q_unigram[targets]
    row.update(quantiles(np.exp(model_log_p), "model_p"))
    row.update(quantiles(np.exp(model_log_p - log_q_target), "model_p_over_q"))
    return row


def truth_columns(stream: SyntheticStream, eval_batch: dict, log_q_unigram: np.ndarray,
                  bands: np.ndarray) -> dict:
    """The run-independent columns: the oracle's exact recall, the truth's P and P/Q
    quantiles and the share of held-out targets in each band."""
    users = eval_batch["user_id"].numpy()
    targets = eval_batch["target"].numpy()
    top, _ = stream.true_top_k(users, max(KS))
    row = {f"oracle_exact_recall@{k}": v
           for k, v in exact_expected_recall(stream, users, top.numpy()).items()}
    log_p = stream.true_log_prob(users, targets).numpy()
    row.update(quantiles(np.exp(log_p), "truth_p"))
    row.update(quantiles(np.exp(log_p - log_q_unigram[targets]), "truth_p_over_q"))
    for b, name in enumerate(BANDS):
        row[f"{name}_targets"] = int((bands[targets] == b).sum())
    return row


# ---------------------------------------------------------------------------- the grid

class World:
    """The stream, its true unigram log Q, bands and held-out batch (shared by runs).

    ``truth_cache``: a JSON file of truth columns by world (``truth.json`` in a grid's
    output directory): the oracle's top-1000 over a 1M-item, 10,000-topic catalog takes
    minutes, and every run of the driver is a process of its own."""

    def __init__(self, run: Run, truth_cache: Optional[str] = None) -> None:
        self.stream = SyntheticStream(run.world())
        self.log_q = self.stream.item_log_marginal()
        self.bands = popularity_bands(self.log_q)
        self.eval_batch = next(iter(self.stream.dataset(
            run.num_eval_users, num_batches=1, start_batch=EVAL_BATCH_INDEX)))
        key = (f"{run.world()!r} num_eval_users={run.num_eval_users} "
               f"eval_batch={EVAL_BATCH_INDEX} ks={KS} quantiles={QUANTILES} "
               f"truth_version={TRUTH_VERSION}")
        cached = {}
        if truth_cache and os.path.exists(truth_cache):
            with open(truth_cache) as f:
                cached = json.load(f)
        if key in cached:
            self.truth = cached[key]
            return
        self.truth = truth_columns(self.stream, self.eval_batch, self.log_q, self.bands)
        if truth_cache:
            write_text(truth_cache, json.dumps({**cached, key: self.truth}, indent=1,
                                               sort_keys=True) + "\n")


def execute(run: Run, world: Optional[World] = None, checkpoint_dir: Optional[str] = None,
            on_row: Optional[Callable[[dict], None]] = None,
            done: Sequence[str] = ()) -> dict:
    """Trains and evaluates one run: its results.csv row at its last step. A run with
    ``eval_at`` is also evaluated at those steps, each row (keyed by `Run.at`) passed to
    ``on_row`` as it is made, unless its ``run_id`` is in ``done`` (written before a
    kill); the last row is returned and also passed to ``on_row``. ``checkpoint_dir``:
    see `train` (``train_seconds`` and ``seconds_per_step`` are then this process's,
    from ``resumed_from_step`` on)."""
    world = world or World(run)
    start = time.perf_counter()

    def row(steps: int, model: TowerModel, timing: dict) -> dict:
        eval_start = time.perf_counter()
        metrics = evaluate(model, world.stream, world.eval_batch, world.log_q, world.bands)
        return {"run_id": run.at(steps).run_id, **run.at(steps).row_fields(), **metrics,
                **world.truth,
                "seconds_per_step": (round(timing["seconds_per_step"], 4)
                                     if np.isfinite(timing["seconds_per_step"]) else ""),
                "train_seconds": round(eval_start - start, 1),
                "eval_seconds": round(time.perf_counter() - eval_start, 1),
                "resumed_from_step": timing["resumed_from_step"],
                "machine": machine_description()}  # s/step and rounding are the machine's

    def on_eval(steps: int, model: TowerModel, timing: dict) -> None:
        if run.at(steps).run_id not in done and on_row is not None:
            on_row(row(steps, model, timing))

    model, timing = train(run, world.stream, proposal_log_q_table(run, world.log_q),
                          checkpoint_dir=checkpoint_dir, on_eval=on_eval)
    last = row(run.steps, model, timing)
    if on_row is not None:
        on_row(last)
    return last


__all__ = ["PRESETS", "Run", "World", "checkpoint_key", "execute", "exact_expected_recall",
           "grid", "model_top_k", "popularity_bands", "preset_runs", "train"]
