"""SASRec training step time and examples/s per loss, and corrected vs logq overhead.

Interleaves the losses round-robin (machine noise hits all alike) on ML-1M
(SASRec ml-1m.txt from ../shared/data, or a synthetic stand-in).

    python benchmarks/bench_sasrec.py [--preset cpu] [--rounds 3] [--steps 10] [--xla]
"""

import argparse
import statistics
import time

import tensorflow as tf  # noqa: E402
from common import DEFAULT_ML1M, machine, ml1m_or_stand_in
from tfrs_logq.pipelines.sequential import training_dataset  # noqa: E402
from tfrs_logq.pipelines.splits import leave_one_out  # noqa: E402

from tfrs_logq.objectives import OBJECTIVES  # noqa: E402
from tfrs_logq.training import build_model, resolve_config  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--losses", default=",".join(OBJECTIVES))
    parser.add_argument("--xla", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--data-dir", default=DEFAULT_ML1M)
    args = parser.parse_args()
    if args.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    inter, source = ml1m_or_stand_in(args.data_dir)
    split = leave_one_out(inter)
    losses = args.losses.split(",")
    runs = {}
    for loss in losses:
        cfg = resolve_config(args.preset, loss=loss, jit_compile=args.xla)
        model = build_model(cfg, split, tf.distribute.get_strategy())
        data = iter(training_dataset(split, cfg.batch_size, cfg.max_length).repeat())
        step = model.make_train_function()
        for _ in range(2):  # trace and warm up
            step(data)
        runs[loss] = (step, data, cfg)
    times = {loss: [] for loss in losses}
    for _ in range(args.rounds):
        for loss, (step, data, cfg) in runs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                logs = step(data)
            float(logs["loss"])  # wait for the last step
            times[loss].append((time.perf_counter() - start) / args.steps)
    cfg = next(iter(runs.values()))[2]
    print(f"machine: {machine()}")
    print(f"SASRec training on {source}, preset {args.preset}: batch {cfg.batch_size}, "
          f"L={cfg.max_length}, d={cfg.embedding_dim}, {cfg.num_blocks} blocks, "
          f"{cfg.num_negatives} negatives; {'XLA' if args.xla else 'graph'}"
          f"{', mixed float16' if args.mixed_precision else ''}; median of {args.rounds} "
          f"rounds x {args.steps} steps")
    print(f"| {'loss':<18} | ms/step | sequences/s |")
    print(f"|{'-' * 20}|---------|-------------|")
    med = {k: statistics.median(v) for k, v in times.items()}
    for loss, t in med.items():
        print(f"| {loss:<18} | {t * 1e3:7.1f} | {cfg.batch_size / t:11.1f} |")
    for sampling in ("inbatch", "mns"):
        a, b = med.get(f"{sampling}-corrected"), med.get(f"{sampling}-logq")
        if a and b:
            print(f"{sampling}: corrected / logq step time = {a / b:.3f}")


if __name__ == "__main__":
    main()
