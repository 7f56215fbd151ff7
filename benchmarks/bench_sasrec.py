"""SASRec training step time per loss and variant, side by side with the official code.

Our variants (graph float32 with and without length buckets, XLA, mixed
bfloat16, XLA + mixed bfloat16) are interleaved round-robin so machine noise hits
all alike; then, with ``--official-python`` (a Python with PyTorch) the paper's official training
scripts run the same configuration for ``--official-steps`` steps each, and
the ratio official / ours is printed. Data: SASRec's ML-1M ``ml-1m.txt`` from
``../shared/data`` (or a synthetic stand-in of the same size).

    python benchmarks/bench_sasrec.py --preset paper --loss inbatch-corrected mns-corrected \\
        --official-dir /tmp/logq --official-python /tmp/refenv/bin/python
"""

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time

import tensorflow as tf  # noqa: E402
from common import DEFAULT_ML1M, machine, ml1m_or_stand_in

from tfrs_logq.pipelines.sequential import training_dataset  # noqa: E402
from tfrs_logq.pipelines.splits import make_split  # noqa: E402
from tfrs_logq.sasrec.objectives import OBJECTIVES  # noqa: E402
from tfrs_logq.sasrec.training import _set_policy, build_model, resolve_config  # noqa: E402

VARIANTS = {  # name -> (jit_compile, mixed precision, length buckets)
    "float32": (False, "none", 8),
    "float32-no-buckets": (False, "none", 1),
    "xla": (True, "none", 1),
    "bfloat16": (False, "bfloat16", 8),
    "xla-bfloat16": (True, "bfloat16", 1),
}
_RATE = re.compile(r"(\d+(?:\.\d+)?)(s/it|it/s)")


def time_ours(split, preset, losses, variants, rounds, steps):
    runs = {}
    for loss in losses:
        for variant in variants:
            jit, policy, buckets = VARIANTS[variant]
            _set_policy(policy)
            cfg = resolve_config(preset, loss=loss, jit_compile=jit, mixed_precision=policy,
                                 length_buckets=buckets)
            model = build_model(cfg, split, tf.distribute.get_strategy())
            data = iter(training_dataset(split, cfg.batch_size, cfg.max_length).repeat())
            step = model.make_train_function()
            for _ in range(2):  # trace and warm up
                float(step(data)["loss"])
            runs[loss, variant] = (step, data)
            _set_policy("none")
    times = {key: [] for key in runs}
    cpu = {key: [] for key in runs}
    for _ in range(rounds):
        for key, (step, data) in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                logs = step(data)
            float(logs["loss"])  # wait for the last step
            times[key].append((time.perf_counter() - start) / steps)
            cpu[key].append((time.process_time() - start_cpu) / steps)
    return ({key: statistics.median(v) for key, v in times.items()},
            {key: statistics.median(v) for key, v in cpu.items()})


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_official(args, split, losses, steps):
    """Seconds per step of the official scripts: wall (tqdm's rate over ``steps`` steps)
    and CPU (the process's CPU seconds with ``steps`` steps minus those with 2 steps,
    per extra step, so start-up and evaluation cancel out)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import parity_official as parity

    code, python = parity.prepare_official(args)
    parity.write_official_dataset(split, code, "ml1m_parity")
    budget = {**parity.official_budget(args.preset), "max_batches_per_epoch": steps,
              "max_epochs": 1}
    out, cpu = {}, {}
    for loss in losses:
        script, overrides = parity.OFFICIAL_SCRIPTS[loss]
        config = os.path.join(code, "bench_config.py")
        used = []
        for n in (2, steps):
            parity.write_official_config(config, "ml1m_parity",
                                         {**budget, "max_batches_per_epoch": n}, overrides)
            shutil.rmtree(os.path.join(code, "models"), ignore_errors=True)
            before = _children_cpu()
            proc = subprocess.run([python, "parity_wrapper.py", script, config, "0",
                                   str(args.threads), os.path.join(code, "bench.json")],
                                  cwd=code, capture_output=True, text=True)
            used.append(_children_cpu() - before)
        cpu[loss] = (used[1] - used[0]) / (steps - 2)
        text = (proc.stdout + proc.stderr).replace("\r", "\n")
        lines = [m for line in text.splitlines() if f"{steps}/{steps}" in line
                 for m in _RATE.findall(line)]
        if not lines:
            raise RuntimeError(f"no step rate in the official output of {script}:\n{text[-2000:]}")
        value, unit = lines[-1]
        out[loss] = float(value) if unit == "s/it" else 1.0 / float(value)
    return out, cpu


def main():
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", default="paper")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--loss", nargs="+", default=["inbatch-corrected", "mns-corrected"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                        metavar="VARIANT", help="the variants timed")
    parser.add_argument("--data-dir", default=DEFAULT_ML1M)
    parser.add_argument("--official-dir", help="local checkout of the official code")
    parser.add_argument("--official-python", help="a Python with torch (official timing)")
    parser.add_argument("--official-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    losses, variants = args.loss, args.variants
    for name in losses:
        if name not in OBJECTIVES:
            parser.error(f"unknown loss {name!r}")
    inter, source = ml1m_or_stand_in(args.data_dir)
    split = make_split(inter, "gsasrec")
    ours, ours_cpu = time_ours(split, args.preset, losses, variants, args.rounds, args.steps)
    official, official_cpu = (time_official(args, split, losses, args.official_steps)
                              if args.official_python else ({}, {}))
    cfg = resolve_config(args.preset)
    print(f"machine: {machine()}")
    print(f"SASRec training on {source}, preset {args.preset}: batch {cfg.batch_size}, "
          f"L={cfg.max_length}, d={cfg.embedding_dim}, {cfg.num_blocks} blocks, "
          f"{cfg.num_negatives} negatives; ours: median of {args.rounds} rounds x "
          f"{args.steps} steps; official: {args.official_steps} steps, {args.threads} threads")
    print("Wall ms/step depends on what else runs on the machine; CPU ms/step (CPU seconds of "
          "all threads per step) much less so, and is the fairer ratio on a shared machine.")
    print("| loss | variant | ms/step | CPU ms/step | sequences/s | official ms/step | "
          "official CPU ms/step | official / ours (wall) | official / ours (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (loss, variant), t in ours.items():
        ref, ref_cpu, c = official.get(loss), official_cpu.get(loss), ours_cpu[loss, variant]
        print(f"| {loss} | {variant} | {t * 1e3:.1f} | {c * 1e3:.1f} | "
              f"{cfg.batch_size / t:.1f} | {f'{ref * 1e3:.0f}' if ref else '-'} | "
              f"{f'{ref_cpu * 1e3:.0f}' if ref_cpu else '-'} | "
              f"{f'{ref / t:.2f}x' if ref else '-'} | "
              f"{f'{ref_cpu / c:.2f}x' if ref_cpu else '-'} |")


if __name__ == "__main__":
    main()
