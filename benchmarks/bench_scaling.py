"""Scaling out on one machine: the task's step and the two-tower trainer on 1, 2 and 4
replicas of `tf.distribute.MirroredStrategy` (logical CPUs of this machine), each
replica's own negatives against every replica's (``cross_replica_negatives``).

1. The task: `CorrectedRetrieval` (``corrected``) forward and backward on a global batch of
   ``--batch`` queries (d 64, string-free integer ids), split over the replicas, the
   replicas' gradients summed: median ms per step, examples per second, and the gather's
   cost (cross-replica / local at the same replicas).
2. The trainer: `tfrs-logq train two-tower`'s loop (``--strategy mirrored``) on a synthetic
   log, ``--steps`` steps of a global batch of 512: median ms per step and Recall@10 at the
   end, which must not depend on the replicas when the negatives are global (the same
   computation) and does when they are local.

Each replica count runs in its own process (logical devices are set before TensorFlow
starts). On a machine with fewer cores than replicas the logical CPUs share them: the
ratios then measure the distribution's overhead, not a speed-up.

    python benchmarks/bench_scaling.py            # ~4 min on 2 cores
    python benchmarks/bench_scaling.py --quick    # seconds
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def one(replicas: int, batch: int, steps: int, trainer_steps: int) -> dict:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    import numpy as np
    from common import machine

    from tfrs_logq import CorrectedRetrieval
    from tfrs_logq._util.strategy import make_strategy

    strategy = make_strategy("mirrored" if replicas > 1 else "default")
    rng = np.random.default_rng(0)
    dim, num_ids = 64, 50_000
    ids = rng.zipf(1.1, batch * steps) % num_ids
    prob = np.bincount(ids, minlength=num_ids) / len(ids)
    row = {"replicas": replicas, "machine": machine()}
    share = batch // replicas
    for cross in (False, True):
        with strategy.scope():
            queries = tf.Variable(rng.normal(size=(num_ids, dim)).astype(np.float32) * 0.1)
            items = tf.Variable(rng.normal(size=(num_ids, dim)).astype(np.float32) * 0.1)
        task = CorrectedRetrieval(cross_replica_negatives=cross)

        def replica_step(batch_ids, q_ids):
            if replicas > 1:
                r = tf.distribute.get_replica_context().replica_id_in_sync_group
                batch_ids, q_ids = (batch_ids[r * share:(r + 1) * share],
                                    q_ids[r * share:(r + 1) * share])
            with tf.GradientTape() as tape:
                loss = task(tf.gather(queries, q_ids), tf.gather(items, batch_ids),
                            candidate_ids=batch_ids,
                            candidate_sampling_probability=tf.gather(prob_t, batch_ids))
            grads = tape.gradient(loss, [queries, items])
            if replicas > 1:
                grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
            return loss, grads

        prob_t = tf.constant(prob.astype(np.float32))

        @tf.function
        def step(batch_ids, q_ids):
            if replicas == 1:
                return replica_step(batch_ids, q_ids)[0]
            loss, _ = strategy.run(replica_step, args=(batch_ids, q_ids))
            return strategy.reduce("sum", loss, axis=None)

        times = []
        for i in range(steps):
            batch_ids = tf.constant(ids[i * batch:(i + 1) * batch])
            start = time.perf_counter()
            float(step(batch_ids, tf.constant(rng.integers(0, num_ids, batch))))
            times.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(times[3:])
        row["global" if cross else "local"] = {"ms": ms, "examples_per_s": batch / ms * 1000}
    if trainer_steps:
        row["trainer"] = _trainer(replicas, trainer_steps)
    return row


def _trainer(replicas: int, steps: int) -> dict:
    import numpy as np

    from tfrs_logq.pipelines.interactions import build_interactions
    from tfrs_logq.pipelines.splits import make_split
    from tfrs_logq.towers import training
    from tfrs_logq.towers.config import TwoTowerConfig

    rng = np.random.default_rng(1)
    num_users, num_items, per_user = 4_000, 2_000, 30
    users = np.repeat(np.arange(num_users), per_user)
    taste = users % 20
    rank = np.arange(1, num_items // 20 + 1) ** -1.0
    within = rng.choice(rank.size, len(users), p=rank / rank.sum())
    items = (taste * (num_items // 20) + within) % num_items
    split = make_split(build_interactions(users, items, np.arange(len(users)),
                                          min_item_interactions=1), "loo")
    out = {}
    for cross in (True, False) if replicas > 1 else (True,):
        config = TwoTowerConfig(loss="inbatch-corrected", steps=steps, eval_every=steps,
                                history_length=20, embedding_dim=32,
                                strategy="mirrored" if replicas > 1 else "default",
                                cross_replica_negatives=cross)
        times = []
        result = training.train(config, split, on_step=lambda i: times.append(
            time.perf_counter()))
        per_step = 1000 * statistics.median(np.diff(times[5:]))
        out["global" if cross else "local"] = {"ms": per_step,
                                               "recall@10": result["recall@10"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--trainer-steps", type=int, default=300)
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.batch, args.steps, args.trainer_steps = 256, 8, 12
    if args.one:
        print(json.dumps(one(args.one, args.batch, args.steps, args.trainer_steps)))
        return
    rows = []
    for replicas in args.replicas:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", str(replicas),
               "--batch", str(args.batch), "--steps", str(args.steps),
               "--trainer-steps", str(args.trainer_steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["local"]["ms"]
    print(f"machine: {rows[0]['machine']}")
    print(f"task: corrected, global batch {args.batch}, d 64; trainer: inbatch-corrected, "
          f"global batch 512, {args.trainer_steps} steps")
    print("replicas | task local ms | task global ms | global / local | examples/s (global) "
          "| vs 1 replica | trainer global ms, R@10 | trainer local ms, R@10")
    for r in rows:
        t = r.get("trainer", {})
        cells = [f"{t[k]['ms']:.1f}, {t[k]['recall@10']:.4f}" if k in t else "-"
                 for k in ("global", "local")]
        print(f"{r['replicas']} | {r['local']['ms']:.1f} | {r['global']['ms']:.1f} | "
              f"{r['global']['ms'] / r['local']['ms']:.2f}x | "
              f"{r['global']['examples_per_s']:,.0f} | {base / r['global']['ms']:.2f}x | "
              f"{cells[0]} | {cells[1]}")


if __name__ == "__main__":
    main()
