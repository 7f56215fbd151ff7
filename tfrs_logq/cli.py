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

    data = sub.add_parser("data", help="dataset tools")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    stats = data_sub.add_parser("stats", help="users, items, interactions and split sizes")
    stats.add_argument("--dataset", choices=("ml-1m", "steam"), required=True)
    stats.add_argument("--split", choices=("loo", "gsasrec", "temporal"), required=True)
    stats.add_argument("--data-dir", default=None,
                       help="directory with the dataset files (else $TFRS_LOGQ_DATA_DIR, "
                            "else download)")
    stats.add_argument("--format", choices=("ratings", "sasrec"), default=None,
                       help="ML-1M source: official ratings.dat or SASRec's ml-1m.txt")
    stats.add_argument("--fraction", type=float, default=None,
                       help="temporal split: test (and validation) fraction; "
                            "default 0.1 for ml-1m, 0.01 for steam")
    stats.add_argument("--skip-bad-lines", action="store_true",
                       help="skip and count malformed lines instead of failing")
    stats.add_argument("--no-download", action="store_true")
    stats.add_argument("--json", action="store_true")

    from tfrs_logq.objectives import OBJECTIVES

    def add_training_flags(p) -> None:
        p.add_argument("--data-dir", default=None)
        p.add_argument("--data-format", choices=("ratings", "sasrec"), default=None)
        p.add_argument("--preset", choices=("smoke", "cpu", "paper"), default=None,
                       help="smoke: minutes on 2 CPU cores; cpu: a fixed CPU step budget; "
                            "paper: the paper's protocol (gSASRec defaults), for a GPU")
        p.add_argument("--config", default=None,
                       help="JSON file of training options (flags override it)")
        for flag, kind in (("max-length", int), ("embedding-dim", int), ("num-blocks", int),
                           ("num-heads", int), ("dropout", float), ("num-negatives", int),
                           ("batch-size", int), ("learning-rate", float),
                           ("steps-per-epoch", int), ("max-epochs", int), ("patience", int),
                           ("max-validation-users", int), ("temporal-fraction", float)):
            p.add_argument(f"--{flag}", type=kind, default=None)
        p.add_argument("--strategy", choices=("auto", "default", "mirrored", "multi-worker",
                                               "tpu"), default=None)
        p.add_argument("--cross-replica-negatives", action="store_true", default=None,
                       help="draw in-batch negatives from the targets of all replicas")
        p.add_argument("--mixed-precision", action="store_true", default=None)
        p.add_argument("--xla", dest="jit_compile", action="store_true", default=None)
        p.add_argument("--json", action="store_true")

    train = sub.add_parser("train", help="train SASRec with one of the paper's losses")
    train.add_argument("--dataset", choices=("ml-1m", "steam"), default=None)
    train.add_argument("--split", choices=("loo", "gsasrec", "temporal"), default=None)
    train.add_argument("--loss", choices=OBJECTIVES, default=None)
    train.add_argument("--model-dir", required=True)
    train.add_argument("--seed", type=int, default=None)
    add_training_flags(train)

    exp = sub.add_parser("experiment", help="run the paper's grid and write its Table 1")
    exp.add_argument("--output-dir", required=True)
    exp.add_argument("--datasets", default="ml-1m")
    exp.add_argument("--splits", default="temporal")
    exp.add_argument("--losses", default="inbatch-none,inbatch-logq,inbatch-corrected,"
                                         "mns-none,mns-logq,mns-corrected,full-softmax")
    exp.add_argument("--seeds", default="0,1,2")
    add_training_flags(exp)

    export = sub.add_parser("export", help="export a trained model as a TF Serving SavedModel")
    export.add_argument("--model-dir", required=True, help="the output of `tfrs-logq train`")
    export.add_argument("--model_base_path", "--model-base-path", dest="model_base_path",
                        required=True)
    export.add_argument("--model_name", "--model-name", dest="model_name", required=True)
    export.add_argument("--version", type=_positive_int, default=None,
                        help="integer version (default: the next free one)")
    export.add_argument("--index", choices=("scann", "brute-force"), default="scann")
    export.add_argument("--k", type=_positive_int, default=100,
                        help="results of serving_default (top_k takes k per request)")

    serve = sub.add_parser("serve", help="serve exports with TF Serving's gRPC and REST APIs")
    serve.add_argument("--port", type=int, default=8500, help="gRPC port (0: any free port)")
    serve.add_argument("--rest_api_port", "--rest-api-port", dest="rest_api_port", type=int,
                       default=8501)
    serve.add_argument("--model_name", "--model-name", dest="model_name", required=True)
    serve.add_argument("--model_base_path", "--model-base-path", dest="model_base_path",
                       required=True, help="directory of integer versions (BASE/NAME)")
    serve.add_argument("--file_system_poll_wait_seconds", type=float, default=1.0)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default loopback only)")
    serve.add_argument("--max_batch_size", type=_positive_int, default=256)
    serve.add_argument("--batch_timeout_micros", type=int, default=500)

    ev = sub.add_parser("evaluate", help="Recall@k through a TF Serving endpoint")
    ev.add_argument("--server", required=True, help="HOST:PORT of the gRPC endpoint")
    ev.add_argument("--model_name", "--model-name", dest="model_name", required=True)
    ev.add_argument("--model-dir", required=True,
                    help="the training output, for the exact in-process figures")
    ev.add_argument("--dataset", choices=("ml-1m", "steam"), default=None)
    ev.add_argument("--split", choices=("loo", "gsasrec", "temporal"), default=None)
    ev.add_argument("--data-dir", default=None)
    ev.add_argument("--max-targets", type=_positive_int, default=None,
                    help="evaluate a seeded sample of the test targets")
    ev.add_argument("--json", action="store_true")
    return parser


def _export(args) -> int:
    from tfrs_logq.serving.export import export

    try:
        path = export(args.model_dir, args.model_base_path, args.model_name,
                      version=args.version, index=args.index, default_k=args.k)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"tfrs-logq export: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _serve(args) -> int:
    import logging

    from tfrs_logq.serving.server import ModelServer, ServerOptions

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    options = ServerOptions(
        model_name=args.model_name, model_base_path=args.model_base_path, port=args.port,
        rest_api_port=args.rest_api_port, host=args.host,
        file_system_poll_wait_seconds=args.file_system_poll_wait_seconds,
        max_batch_size=args.max_batch_size, batch_timeout_micros=args.batch_timeout_micros)
    server = ModelServer(options).start()
    print(f"serving {args.model_name} from {args.model_base_path}: gRPC {args.host}:"
          f"{server.port}, REST {args.host}:{server.rest_port}", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        server.stop()
    return 0


def _evaluate(args) -> int:
    import json

    import numpy as np

    from tfrs_logq.metrics import target_ranks
    from tfrs_logq.pipelines.sequential import evaluation_arrays
    from tfrs_logq.serving.client import predict_stub, ranks_through_server, recall_ndcg
    from tfrs_logq.serving.export import load_trained
    from tfrs_logq.training import load_split, resolve_config

    encoder, config, raw_ids = load_trained(args.model_dir)
    train_config = resolve_config(
        dataset=args.dataset or config["dataset"], split=args.split or config["split"],
        data_dir=args.data_dir or config.get("data_dir"), data_format=config.get("data_format"),
        temporal_fraction=config.get("temporal_fraction"))
    split = load_split(train_config)
    part = split.test
    idx = np.arange(len(part))
    if args.max_targets and len(idx) > args.max_targets:
        idx = np.sort(np.random.default_rng(0).choice(len(idx), args.max_targets, replace=False))
    recall_ks, ndcg_ks = (10, 100, 1000), (20,)
    max_k = max(recall_ks + ndcg_ks)
    arrays = evaluation_arrays(split, part, config["max_length"])
    arrays = {k: (None if v is None else v[idx]) for k, v in arrays.items()}
    full = [split.sequences[u][:n] for u, n in zip(part.users[idx], part.history_lengths[idx])]
    sent_raw = [raw_ids[h[-config["max_length"]:] - 1] for h in full]
    seen_raw = [raw_ids[h - 1] for h in full]
    targets_raw = raw_ids[arrays["targets"] - 1]
    stub, channel = predict_stub(args.server)
    served = ranks_through_server(stub, args.model_name, sent_raw, targets_raw, max_k,
                                  num_items=len(raw_ids), seen_raw=seen_raw)
    channel.close()
    queries = encoder.last_query(arrays["history"], training=False)
    exact = target_ranks(queries, encoder.item_embeddings(), arrays["targets"],
                         exclude=arrays["exclude"])
    result = {"server": args.server, "model_name": args.model_name, "num_targets": len(idx),
              "served": recall_ndcg(served, recall_ks, ndcg_ks),
              "exact": recall_ndcg(np.minimum(exact, max_k), recall_ks, ndcg_ks)}
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


_TRAIN_FIELDS = ("max_length", "embedding_dim", "num_blocks", "num_heads", "dropout",
                 "num_negatives", "batch_size", "learning_rate", "steps_per_epoch",
                 "max_epochs", "patience", "max_validation_users", "temporal_fraction",
                 "strategy", "cross_replica_negatives", "mixed_precision", "jit_compile",
                 "data_dir", "data_format")


def _training_overrides(args) -> dict:
    import json

    overrides = {}
    if args.config:
        with open(args.config) as f:
            overrides.update(json.load(f))
    preset = overrides.pop("preset", None)
    if args.preset:
        preset = args.preset
    for name in _TRAIN_FIELDS:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return {"preset": preset, **overrides}


def _train(args) -> int:
    import json

    from tfrs_logq.pipelines.datasets import DataNotFoundError
    from tfrs_logq.training import resolve_config, train

    overrides = _training_overrides(args)
    for name in ("dataset", "split", "loss", "seed"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    try:
        config = resolve_config(**overrides)
        result = train(config, args.model_dir, verbose=0 if args.json else "auto")
    except (DataNotFoundError, ValueError) as exc:
        print(f"tfrs-logq train: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


def _experiment(args) -> int:
    from tfrs_logq.experiment import run_grid
    from tfrs_logq.objectives import OBJECTIVES

    overrides = _training_overrides(args)
    preset = overrides.pop("preset", None) or "cpu"
    data_dir = overrides.pop("data_dir", None)
    losses = [x for x in args.losses.split(",") if x]
    bad = [x for x in losses if x not in OBJECTIVES]
    if bad:
        print(f"tfrs-logq experiment: unknown losses {bad}; expected some of {OBJECTIVES}",
              file=sys.stderr)
        return 2
    run_grid(args.output_dir, args.datasets.split(","), args.splits.split(","), losses,
             [int(s) for s in args.seeds.split(",")], preset, data_dir=data_dir,
             verbose=0 if args.json else 2, **overrides)
    print(f"wrote {args.output_dir}/results.csv, table.md and table.png")
    return 0


def _data_stats(args) -> int:
    import json

    from tfrs_logq.pipelines.datasets import DataNotFoundError, load_dataset
    from tfrs_logq.pipelines.interactions import DataFormatError
    from tfrs_logq.pipelines.splits import make_split

    kwargs = {"skip_bad_lines": args.skip_bad_lines, "download_ok": not args.no_download}
    if args.dataset == "ml-1m" and args.format:
        kwargs["fmt"] = args.format
    try:
        interactions = load_dataset(args.dataset, args.data_dir,
                                    needs_timestamps=args.split == "temporal", **kwargs)
        split_kwargs = {}
        if args.split == "temporal":
            split_kwargs["fraction"] = args.fraction or (0.1 if args.dataset == "ml-1m" else 0.01)
        split = make_split(interactions, args.split, **split_kwargs)
    except (DataNotFoundError, DataFormatError, ValueError) as exc:
        print(f"tfrs-logq data stats: {exc}", file=sys.stderr)
        return 2
    result = {"dataset": args.dataset, "split": args.split, "source": interactions.name,
              **split.stats()}
    if args.json:
        print(json.dumps(result))
        return 0
    tr = result["time_range"]
    print(f"{args.dataset} ({interactions.name}), split {args.split}")
    print(f"  users {result['num_users']:,}  items {result['num_items']:,}  "
          f"interactions {result['num_interactions']:,}")
    print(f"  time range: {tr[0]} .. {tr[1]}" if tr else "  time range: none (no timestamps)")
    print(f"  train: {result['train']['num_interactions']:,} interactions")
    print(f"  validation: {result['validation']['num_targets']:,} targets")
    print(f"  test: {result['test']['num_targets']:,} targets")
    return 0


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
    if args.command == "data" and args.data_command == "stats":
        return _data_stats(args)
    if args.command == "train":
        return _train(args)
    if args.command == "experiment":
        return _experiment(args)
    if args.command == "export":
        return _export(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "evaluate":
        return _evaluate(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
