"""The `tfrs-logq` command line."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrs-logq",
        description="Corrected logQ correction of sampled softmax for TFRS retrieval.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo",
        help="train none/logq/corrected on the synthetic stream and compare Recall@k",
    )
    demo.add_argument("--output-dir", default="demo_output")
    demo.add_argument("--num-items", type=_positive_int, default=50_000)
    demo.add_argument("--num-users", type=_positive_int, default=100_000)
    demo.add_argument("--steps", type=_positive_int, default=1500)
    demo.add_argument("--batch-size", type=_positive_int, default=1024)
    demo.add_argument("--embedding-dim", type=_positive_int, default=32)
    demo.add_argument("--learning-rate", type=float, default=3e-3)
    demo.add_argument("--num-eval", type=_positive_int, default=8192)
    demo.add_argument("--frequency", choices=("count-min", "true"), default="count-min",
                      help="where log Q comes from: an in-graph count-min sketch updated "
                           "while training, or the generator's true unigram Q")
    demo.add_argument("--corrections", default="none,logq,corrected",
                      help="comma-separated subset of none,logq,corrected")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--json", action="store_true", help="print the results as one JSON object")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from tfrs_logq.demo import DemoConfig, run_demo
        from tfrs_logq.losses import CORRECTIONS

        corrections = tuple(c.strip() for c in args.corrections.split(",") if c.strip())
        bad = [c for c in corrections if c not in CORRECTIONS]
        if bad or not corrections:
            print(f"tfrs-logq demo: --corrections must name some of {CORRECTIONS}, "
                  f"got {args.corrections!r}", file=sys.stderr)
            return 2
        config = DemoConfig(
            num_items=args.num_items, num_users=args.num_users, batch_size=args.batch_size,
            steps=args.steps, embedding_dim=args.embedding_dim,
            learning_rate=args.learning_rate, num_eval=args.num_eval,
            frequency=args.frequency, corrections=corrections, seed=args.seed,
        )
        verbose = 2 if args.json or not sys.stdout.isatty() else 1
        run_demo(config, args.output_dir, verbose=0 if args.json else verbose,
                 as_json=args.json)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
