"""Why the corrected loss without its weight (``corrected-w1``) collapses: its loss and
norms over training, beside the corrected loss, on a small world (CPU, about 30 s).

    KERAS_BACKEND=jax .venv-keras/bin/python -m benchmarks.accelerator.w1_probe

The per-example loss of ``corrected-w1`` is ``lse_d(s_d - log Q'(d)) - s_p``, with the
positive outside its denominator: it has no lower bound in ``s_p``. Printed for both
corrections at 50, 200, 800 and 2,000 steps (same world, seeds and batches): the batch
loss (summed over the batch), the mean norm of the held-out users' query embeddings and of
the item embeddings, the median held-out ``s_p``, and exact Recall@10.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from . import driver, evaluate, model, world  # noqa: E402
from .runs import Run, proposal_log_q  # noqa: E402

WORLD = dict(num_items=20_000, num_users=5_000, num_topics=500, topic_sharpness=8.0,
             batch_size=256, num_in_batch=256, num_uniform=256, proposal="mixture",
             embedding_dim=32, learning_rate=1e-2, num_eval_users=1024, eval_at=(1,))
STEPS = (50, 200, 800, 2000)


def main() -> int:
    w = world.World(Run(**WORLD).world(), WORLD["num_eval_users"])
    tables = world.device_tables(w)
    history = jnp.asarray(w.eval_batch["history"], jnp.int32)
    targets = jnp.asarray(w.eval_batch["target"])
    print("| correction | steps | batch loss | mean query norm | mean item norm | median s_p "
          "| exact R@10 |\n|---|---|---|---|---|---|---|")
    for correction in ("corrected", "corrected-w1"):
        run = Run(**{**WORLD, "correction": correction})
        log_q = proposal_log_q(run, w.log_q)
        log_q = jnp.asarray(np.where(np.isfinite(log_q), log_q, 0.0), jnp.float32)
        config = driver.step_config(run)
        loop, state, done = model.make_train_loop(config), model.init_state(config), 0
        for steps in STEPS:
            state, loss = loop(tables, log_q, state, steps - done)
            done = steps
            params = state["params"]
            queries = model.query_embeddings(params, history)
            items = params["item_embedding"]
            s_p = (queries * items[targets]).sum(-1)
            recall = evaluate.evaluate(params, w)["exact_recall@10"]
            print(f"| {correction} | {steps:,} | {float(loss):,.1f} "
                  f"| {float(jnp.linalg.norm(queries, axis=-1).mean()):,.2f} "
                  f"| {float(jnp.linalg.norm(items[1:], axis=-1).mean()):.3f} "
                  f"| {float(jnp.median(s_p)):.2f} | {recall:.4f} |", flush=True)
    print(f"device {driver.device_name()}; machine {driver.machine_name()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
