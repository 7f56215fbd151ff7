"""The study's two-tower model, its negatives and one training step, in JAX.

The model is the retired TensorFlow study's `TowerModel` (`lab/study.py` at d9f8357): a
query tower that averages the history's item embeddings (`HistoryQueryTower`: masked mean,
``Dense(2d, relu)``, ``Dense(d)``) and an item embedding table, both tables ``[V + 1, d]``
(row 0 is padding), with tf-keras's
initialisers (embeddings uniform in [-0.05, 0.05], Dense kernels Glorot uniform, biases 0)
drawn from ``jax.random`` (the TF study's initial weights come from TensorFlow's stateful
RNG, which is not reproduced: same distribution, other draws).

The optimizer is `tfrs_logq.lazy_adam.LazyAdam`'s rule, row-sparse: the step gathers the
rows it uses, differentiates with respect to the gathered rows (never a dense `[V, d]`
gradient), sums the gradients of duplicate ids and updates ``m``, ``v`` and the value of
those rows only (bias correction with the global step), so its cost does not grow with
the catalog. Dense weights get the ordinary Adam update (``eps`` added to ``sqrt(v)``).

Everything random in a step is keyed by ``(seed, step)`` alone: the stream's batch
(`world.sample_batch`), the negatives (uniform with replacement over ``1..V``; the batch's
distinct targets in random order, `distinct_in_random_order`) and, at step 0, the
initial weights. Runs of one seed that differ in proposal or correction therefore see
the same batches, negatives and initial weights (common random numbers).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from . import world as world_lib
from .loss import study_loss

TABLES = ("history_embedding", "item_embedding")
DENSE = ("hidden_kernel", "hidden_bias", "out_kernel", "out_bias")
_STREAM, _NEGATIVES, _INIT = 1, 2, 3  # fold_in tags of the seed's key


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What the jitted step needs (hashable: it is a static argument)."""

    world: world_lib.WorldConfig
    batch_size: int
    embedding_dim: int
    num_uniform: int
    num_in_batch: int
    correction: str
    inclusion: bool
    learning_rate: float
    seed: int
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7


def seed_key(seed: int, tag: int):
    return jax.random.fold_in(jax.random.PRNGKey(seed), tag)


def init_params(config: StepConfig) -> dict:
    """tf-keras's initialisers: uniform(-0.05, 0.05) tables, Glorot kernels, zero biases."""
    v, d = config.world.num_items + 1, config.embedding_dim
    keys = jax.random.split(seed_key(config.seed, _INIT), 4)

    def glorot(key, fan_in, fan_out):
        limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
        return jax.random.uniform(key, (fan_in, fan_out), jnp.float32, -limit, limit)

    return {
        "history_embedding": jax.random.uniform(keys[0], (v, d), jnp.float32, -0.05, 0.05),
        "item_embedding": jax.random.uniform(keys[1], (v, d), jnp.float32, -0.05, 0.05),
        "hidden_kernel": glorot(keys[2], d, 2 * d),
        "hidden_bias": jnp.zeros((2 * d,), jnp.float32),
        "out_kernel": glorot(keys[3], 2 * d, d),
        "out_bias": jnp.zeros((d,), jnp.float32),
    }


def init_state(config: StepConfig) -> dict:
    params = init_params(config)
    return {"params": params, "m": {name: jnp.zeros_like(p) for name, p in params.items()},
            "v": {name: jnp.zeros_like(p) for name, p in params.items()},
            "step": jnp.zeros((), jnp.int32)}


def query_from_rows(params: dict, history_rows, history) -> jnp.ndarray:
    """`[B, d]` queries from the gathered `[B, H, d]` history rows (ids 0 are padding)."""
    is_item = (history != 0).astype(jnp.float32)[..., None]
    mean = (history_rows * is_item).sum(1) / jnp.maximum(is_item.sum(1), 1.0)
    hidden = jax.nn.relu(mean @ params["hidden_kernel"] + params["hidden_bias"])
    return hidden @ params["out_kernel"] + params["out_bias"]


def query_embeddings(params: dict, history) -> jnp.ndarray:
    return query_from_rows(params, params["history_embedding"][history], history)


def distinct_in_random_order(ids, k: int, key):
    """`keras_logq.distinct_in_random_order` with a JAX key: the distinct nonzero ``ids``
    in random order, the first ``k`` kept, padded with 0 (``is_valid`` False).

    Not a call of it: keras-logq draws through `keras.random`, whose seed is an int or a
    `SeedGenerator` (Keras 3.15), and the study's jitted step needs a key that is a function
    of ``(seed, step)`` traced inside the loop. The algorithm is the same line for line."""
    ordered = jnp.sort(ids.reshape(-1))
    first = jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    keep = jnp.logical_and(first, ordered != 0)
    keys = jnp.where(keep, jax.random.uniform(key, ordered.shape), 2.0)
    padded_keys = jnp.concatenate([keys, jnp.full((k,), 3.0)])
    padded_ids = jnp.concatenate([ordered, jnp.zeros((k,), ordered.dtype)])
    _, order = jax.lax.top_k(-padded_keys, k)
    is_valid = padded_keys[order] < 1.0
    return jnp.where(is_valid, padded_ids[order], 0), is_valid


def draw_negatives(config: StepConfig, targets, key):
    """`[k]` ids and validity: ``num_uniform`` uniform draws, then the in-batch ones."""
    k_uniform, k_in_batch = jax.random.split(key)
    ids, valid = [], []
    if config.num_uniform:
        ids.append(jax.random.randint(k_uniform, (config.num_uniform,), 1,
                                      config.world.num_items + 1, jnp.int32))
        valid.append(jnp.ones((config.num_uniform,), bool))
    if config.num_in_batch:
        b_ids, b_valid = distinct_in_random_order(targets, config.num_in_batch, k_in_batch)
        ids.append(b_ids.astype(jnp.int32))
        valid.append(b_valid)
    return jnp.concatenate(ids), jnp.concatenate(valid)


def step_inputs(config: StepConfig, tables: dict, step):
    """The step's batch and negatives: functions of ``(seed, step)`` only."""
    stream_key = jax.random.fold_in(seed_key(config.seed, _STREAM), step)
    negatives_key = jax.random.fold_in(seed_key(config.seed, _NEGATIVES), step)
    batch = world_lib.sample_batch(tables, config.world, config.batch_size, stream_key)
    neg_ids, neg_valid = draw_negatives(config, batch["target"], negatives_key)
    return batch, neg_ids, neg_valid


def _batch_loss(config: StepConfig, dense: dict, history_rows, item_rows, history,
                targets, neg_ids, neg_valid, log_q_table):
    batch = targets.shape[0]
    queries = query_from_rows(dense, history_rows, history)
    positive_rows, negative_rows = item_rows[:batch], item_rows[batch:]
    s_p = (queries * positive_rows).sum(-1)
    s_n = queries @ negative_rows.T
    is_negative = jnp.logical_and(neg_valid[None, :], neg_ids[None, :] != targets[:, None])
    neg_log_q = jnp.where(neg_valid, log_q_table[neg_ids], 0.0)
    per_example = study_loss(config.correction, s_p, s_n, positive_log_q=log_q_table[targets],
                             negative_log_q=neg_log_q, is_negative=is_negative,
                             inclusion=config.inclusion)
    return per_example.sum()  # TFRS's reduction="sum", as the TF study


def _adam_rows(config: StepConfig, table, m, v, ids, row_grads, lr_t):
    """LazyAdam on the rows ``ids`` (duplicates summed); other rows untouched."""
    n = ids.shape[0]
    rows, inverse = jnp.unique(ids, size=n, fill_value=table.shape[0], return_inverse=True)
    g = jax.ops.segment_sum(row_grads, inverse.reshape(-1), num_segments=n)
    m_rows = config.beta_1 * m.at[rows].get(mode="fill", fill_value=0) + (1 - config.beta_1) * g
    v_rows = (config.beta_2 * v.at[rows].get(mode="fill", fill_value=0)
              + (1 - config.beta_2) * g * g)
    update = lr_t * m_rows / (jnp.sqrt(v_rows) + config.epsilon)
    return (table.at[rows].add(-update, mode="drop"), m.at[rows].set(m_rows, mode="drop"),
            v.at[rows].set(v_rows, mode="drop"))


def train_step(config: StepConfig, tables: dict, log_q_table, state: dict) -> tuple:
    """One step: ``(new_state, loss)``."""
    params, step = state["params"], state["step"]
    batch, neg_ids, neg_valid = step_inputs(config, tables, step)
    history, targets = batch["history"], batch["target"]
    item_ids = jnp.concatenate([targets, neg_ids])
    dense = {name: params[name] for name in DENSE}
    history_rows = params["history_embedding"][history]
    item_rows = params["item_embedding"][item_ids]
    loss, (g_dense, g_history, g_items) = jax.value_and_grad(
        lambda d, h, i: _batch_loss(config, d, h, i, history, targets, neg_ids, neg_valid,
                                    log_q_table), argnums=(0, 1, 2))(dense, history_rows,
                                                                     item_rows)
    t = (step + 1).astype(jnp.float32)
    lr_t = config.learning_rate * jnp.sqrt(1 - config.beta_2 ** t) / (1 - config.beta_1 ** t)
    new = {"params": dict(params), "m": dict(state["m"]), "v": dict(state["v"]),
           "step": step + 1}
    for name, grad in g_dense.items():
        m = config.beta_1 * state["m"][name] + (1 - config.beta_1) * grad
        v = config.beta_2 * state["v"][name] + (1 - config.beta_2) * grad * grad
        new["params"][name] = params[name] - lr_t * m / (jnp.sqrt(v) + config.epsilon)
        new["m"][name], new["v"][name] = m, v
    for name, ids, grads in (("history_embedding", history.reshape(-1),
                              g_history.reshape(-1, config.embedding_dim)),
                             ("item_embedding", item_ids, g_items)):
        new["params"][name], new["m"][name], new["v"][name] = _adam_rows(
            config, params[name], state["m"][name], state["v"][name], ids, grads, lr_t)
    return new, loss


@functools.lru_cache(maxsize=8)
def make_train_loop(config: StepConfig):
    """A jitted ``(tables, log_q_table, state, num_steps) -> (state, last loss)`` that runs
    ``num_steps`` steps on the device (a `fori_loop`: one dispatch per call); one
    compilation per configuration and process."""

    def loop(tables, log_q_table, state, num_steps):
        def body(_, carry):
            return train_step(config, tables, log_q_table, carry[0])

        return jax.lax.fori_loop(0, num_steps, body, (state, jnp.zeros((), jnp.float32)))

    return jax.jit(loop, donate_argnums=(2,))


__all__ = ["DENSE", "TABLES", "StepConfig", "distinct_in_random_order", "draw_negatives",
           "init_state", "make_train_loop", "query_embeddings", "step_inputs", "train_step"]
