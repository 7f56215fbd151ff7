"""`tfrs-logq compare` on real data: MovieLens-1M through the generic user-log path.

SASRec's ``ml-1m.txt`` (the split the project's SASRec results use: every user's items in
time order) is written as a CSV ``user_id,item_id`` and read by
`tfrs_logq.pipelines.user_log` (file order = time order, gSASRec's split), then
`tfrs_logq.studies.compare` trains the two-tower model with compare's default losses
(TFRS's standard logQ, the baseline; the official code's; the corrected loss), paired by
seed. `benchmarks/compare_ml1m.sh` calls it
run by run from a pinned commit; it is the library path of

    tfrs-logq compare --interactions ml-1m.csv --user-column user_id --item-column item_id \\
        --split gsasrec --seeds 0 1 2 3 4 --steps 3000 --output-dir results/compare-ml1m
"""

from __future__ import annotations

import argparse
import gzip
import os
import tempfile

import tfrs_logq  # noqa: F401  (selects tf-keras before TensorFlow loads)
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log_split
from tfrs_logq.studies.compare.builtin import run_compare
from tfrs_logq.studies.compare.plan import Plan
from tfrs_logq.towers.config import TwoTowerConfig

SASREC_TXT = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                          "ml-1m-sasrec", "ml-1m.txt.gz")
PLAN = dict(losses=("inbatch-logq-tfrs", "inbatch-logq-official", "inbatch-corrected"),
            seeds=(0, 1, 2, 3, 4), window=3)
CONFIG = dict(steps=3000, eval_every=500, batch_size=512, embedding_dim=64, history_length=50,
              learning_rate=3e-3)


def write_csv(path: str, source: str = SASREC_TXT) -> None:
    with gzip.open(source, "rt") as src, open(path, "w") as out:
        out.write("user_id,item_id\n")
        for line in src:
            user, item = line.split()
            out.write(f"{user},{item}\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="results/compare-ml1m")
    parser.add_argument("--max-runs", type=int, default=None)
    parser.add_argument("--data", default=SASREC_TXT, help="SASRec's ml-1m.txt(.gz)")
    parser.add_argument("--pending", action="store_true",
                        help="print the number of unfinished runs and exit")
    args = parser.parse_args(argv)
    plan = Plan(config=TwoTowerConfig(**CONFIG), source="ML-1M (SASRec's ml-1m.txt as a "
                "CSV, user_id,item_id), split gsasrec", **PLAN)
    if args.pending:
        import csv

        path = os.path.join(args.output_dir, "results.csv")
        done = len(list(csv.DictReader(open(path)))) if os.path.exists(path) else 0
        print(len(plan.losses) * len(plan.seeds) - done)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = os.path.join(tmp, "ml-1m.csv")
        write_csv(csv_path, args.data)
        split = load_user_log_split(UserLogSource(csv_path, "user_id", "item_id"), "gsasrec")
    run_compare(plan, split, args.output_dir, say=lambda m: print(m, flush=True),
                max_runs=args.max_runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
