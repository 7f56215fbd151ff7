"""The two-tower trainer's step (`tfrs-logq train two-tower`, `compare`) against
the catalog size: 100,000 against 1,000,000 items, row-sparse `lazy-adam` (the
default) against tf-keras `adam`.

Each configuration runs in its own subprocess: a log of 2,000,000 interactions
(every item once, the rest Zipf(1.05)) over 50,000 users, split leave-one-out, then
`tfrs_logq.towers.training.train` with the trainer's defaults (batch 512 in-batch,
d 64, history 50, ``inbatch-corrected``; ``--loss mns-corrected`` adds 1,024 uniform
negatives), timed step by step from the host's view (batch drawing included) and
stopped after ``--steps`` steps, before any evaluation. Prints the median step and
the ratio of 1M to 100k items, with the machine.

    python benchmarks/bench_towers_step.py            # ~5 min on 2 cores
    python benchmarks/bench_towers_step.py --quick    # small catalogs, seconds
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CATALOGS = [(100_000, "lazy-adam"), (1_000_000, "lazy-adam"), (100_000, "adam"),
            (1_000_000, "adam")]
QUICK = [(2_000, "lazy-adam"), (20_000, "lazy-adam")]


class _Stop(Exception):
    pass


def one(num_items: int, optimizer: str, steps: int, loss: str, interactions: int) -> dict:
    """Times ``steps`` steps of the trainer on a catalog of ``num_items`` items."""
    import numpy as np
    from common import machine  # sets TF_USE_LEGACY_KERAS first

    from tfrs_logq.pipelines.interactions import build_interactions
    from tfrs_logq.pipelines.splits import make_split
    from tfrs_logq.towers import training
    from tfrs_logq.towers.config import TwoTowerConfig

    rng = np.random.default_rng(0)
    num_users = max(50, interactions // 40)
    rank = np.arange(1, num_items + 1, dtype=np.float64) ** -1.05
    items = np.concatenate([rng.permutation(num_items),
                            rng.choice(num_items, interactions - num_items, p=rank / rank.sum())])
    rng.shuffle(items)
    users = np.sort(rng.integers(0, num_users, len(items)))
    split = make_split(build_interactions(users, items, np.arange(len(items)),
                                          min_item_interactions=1), "loo")
    config = TwoTowerConfig(loss=loss, optimizer=optimizer, steps=steps + 1,
                                     eval_every=steps + 1)
    times = []

    def on_step(i: int) -> None:
        times.append(time.perf_counter())
        if i + 1 == steps:
            raise _Stop

    try:
        training.train(config, split, on_step=on_step)
    except _Stop:
        pass
    per_step = np.diff(times[5:])  # the first steps trace and warm up
    return {"num_items": split.num_items, "optimizer": optimizer, "loss": loss,
            "median_ms": 1000 * float(statistics.median(per_step)),
            "steps_timed": len(per_step), "machine": machine()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--loss", default="inbatch-corrected")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        num_items, optimizer = args.one.split(":")
        interactions = max(2 * int(num_items), 2_000_000 if not args.quick else 40_000)
        print(json.dumps(one(int(num_items), optimizer, args.steps, args.loss, interactions)))
        return
    rows = []
    for num_items, optimizer in QUICK if args.quick else CATALOGS:
        cmd = [sys.executable, os.path.abspath(__file__), "--one", f"{num_items}:{optimizer}",
               "--steps", str(args.steps if not args.quick else 12), "--loss", args.loss]
        cmd += ["--quick"] if args.quick else []
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{rows[-1]['num_items']:>10,} items  {optimizer:9s}  "
              f"{rows[-1]['median_ms']:8.1f} ms/step", flush=True)
    print(f"machine: {rows[0]['machine']}; loss {args.loss}, the trainer's defaults")
    by = {(r["num_items"], r["optimizer"]): r["median_ms"] for r in rows}
    sizes = sorted({r["num_items"] for r in rows})
    for optimizer in ("lazy-adam", "adam"):
        if all((n, optimizer) in by for n in sizes):
            print(f"{optimizer}: {sizes[-1]:,} / {sizes[0]:,} items = "
                  f"{by[(sizes[-1], optimizer)] / by[(sizes[0], optimizer)]:.2f}x")


if __name__ == "__main__":
    main()
