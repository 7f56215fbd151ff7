"""Parity harness: tfrs-logq's SASRec against the paper's official PyTorch code.

Trains both implementations on the same split (gSASRec's ML-1M leave-one-out,
SASRec's ``ml-1m.txt``), the same item counts and the same budget, and prints
their validation curves (NDCG@10 after every epoch) and test Recall/NDCG@20
(best validation epoch) side by side, per loss and seed.

The official code (github.com/NonameUntitled/logq) is never part of this
project: it is cloned into a temporary directory, or read from a local checkout
(``--official-dir``), and run with a Python that has PyTorch
(``--official-python``; without it a virtual environment is created in a
temporary directory and ``torch ir_measures tqdm torchinfo`` are installed
into it). Its training scripts run unchanged; a small wrapper seeds them, runs
them with a config file of this budget and evaluates the best checkpoint on the
test part with the official evaluation code.

Budget ``cpu`` (tfrs-logq's ``cpu`` preset): L = 200, d = 64, batch 64, 2 blocks,
1 head, dropout 0.5, 256 negatives, Adam 1e-3, 12 epochs of 50 steps, best
validation epoch kept. The official "epoch" is the first 50 batches of a fresh
shuffle; ours 50 steps of a continuously reshuffled stream.

Finished runs are appended to ``OUTPUT/runs.jsonl`` as they end and skipped on a
rerun, so the harness can be stopped and resumed; ``OUTPUT/parity.md`` holds the
table.

    python benchmarks/parity_official.py --data-dir ../shared/data/ml-1m-sasrec \\
        --official-dir /tmp/logq --official-python /tmp/refenv/bin/python \\
        --loss inbatch-none inbatch-logq-official mns-logq-official mns-corrected --seeds 0 1 \\
        --output results/parity-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

OFFICIAL_REPOSITORY = "https://github.com/NonameUntitled/logq"

# Our loss name -> the official training script (and config overrides).
OFFICIAL_SCRIPTS = {
    "bce": ("train_sasrec.py", {"negs_per_pos": 1, "gbce_t": 0.0}),
    "gbce": ("train_gsasrec.py", {"gbce_t": 0.75}),
    "uniform": ("train_uniform.py", {}),
    "inbatch-none": ("train_in_batch.py", {}),
    "inbatch-logq-official": ("train_in_batch_logq_old.py", {}),
    # The official "in-batch, improved logQ" script draws 128 uniform + 128 in-batch
    # negatives: it is the same computation as train_mns_log_new.py.
    "inbatch-corrected": ("train_in_batch_logq_new.py", {}),
    "mns-none": ("train_mns.py", {}),
    "mns-logq-official": ("train_mns_log_old.py", {}),
    "mns-corrected": ("train_mns_log_new.py", {}),
    "full-softmax": ("train_full_softmax.py", {}),
}

BUDGETS = ("cpu", "smoke", "long", "paper")  # tfrs-logq training presets


def official_budget(preset: str) -> dict:
    """The official config fields for one of our training presets (one source of truth)."""
    from tfrs_logq.sasrec.training import resolve_config

    c = resolve_config(preset)
    return {"sequence_length": c.max_length, "embedding_dim": c.embedding_dim,
            "train_batch_size": c.batch_size, "num_heads": c.num_heads,
            "num_blocks": c.num_blocks, "dropout_rate": c.dropout,
            "negs_per_pos": c.num_negatives, "max_batches_per_epoch": c.steps_per_epoch,
            "max_epochs": c.max_epochs, "early_stopping_patience": c.patience}

# Runs inside the official checkout: seeds everything, runs the training script
# unchanged, then evaluates its best checkpoint on the test part.
_WRAPPER = r'''
import glob, json, os, random, runpy, sys
import numpy as np, torch
script, config_path, seed, threads, out_json = sys.argv[1:6]
seed, threads = int(seed), int(threads)
random.seed(seed); np.random.seed(seed); torch.manual_seed(seed)
torch.set_num_threads(threads)
sys.argv = [script, "--config", config_path]
runpy.run_path(script, run_name="__main__")
from utils import load_config, build_model
from dataset_utils import get_test_dataloader
from eval_utils import evaluate
config = load_config(config_path)
model = build_model(config)
best = max(glob.glob("models/*.pt"), key=os.path.getmtime)
model.load_state_dict(torch.load(best))
loader = get_test_dataloader(config.dataset_name, batch_size=config.eval_batch_size,
                             max_length=config.sequence_length)
test = evaluate(model, loader, config.metrics, config.recommendation_limit,
                config.filter_rated, "cpu")
with open(out_json, "w") as f:
    json.dump({str(k): float(v) for k, v in test.items()}, f)
'''

# Runs inside the official checkout: builds gSASRec with its own initialisation and
# writes its weights, an input batch (official ids) and its outputs to an npz.
_FORWARD = r'''
import sys
import numpy as np, torch
from gsasrec import GSASRec
num_items, length, dim, heads, blocks, seed = map(int, sys.argv[1:7])
out = sys.argv[7]
torch.manual_seed(seed)
model = GSASRec(num_items, sequence_length=length, embedding_dim=dim, num_heads=heads,
                num_blocks=blocks, dropout_rate=0.5)
with torch.no_grad():  # random biases and norms, so every term counts
    for name, p in model.named_parameters():
        if "bias" in name or "norm" in name:
            p.add_(0.3 * torch.randn_like(p))
model.eval()
rng = np.random.default_rng(seed)
ids = rng.integers(1, num_items + 1, size=(8, length))
for row, n in enumerate(rng.integers(1, length + 1, size=8)):
    ids[row, : length - n] = num_items + 1  # left padding with the official padding id
with torch.no_grad():
    hidden, _ = model(torch.tensor(ids))
np.savez(out, ids=ids, hidden=hidden.numpy(),
         **{k: v.detach().numpy() for k, v in model.state_dict().items()})
'''

_EPOCH_LINE = re.compile(r"Epoch (\d+) evaluation result: (.*)")


def load_split(data_dir: str):
    from tfrs_logq.pipelines.datasets import load_dataset
    from tfrs_logq.pipelines.splits import make_split

    return make_split(load_dataset("ml-1m", data_dir, fmt="sasrec"), "gsasrec")


def write_official_dataset(split, root: str, name: str) -> None:
    """The split in the official code's layout (ids 1..N, padding N + 1)."""
    base = os.path.join(root, "datasets", name)
    for part in ("train", "val", "test"):
        os.makedirs(os.path.join(base, part), exist_ok=True)
    with open(os.path.join(base, "train", "input.txt"), "w") as f:
        for seq in split.train_sequences():
            f.write(" ".join(map(str, seq)) + "\n")
    for part, data in (("val", split.validation), ("test", split.test)):
        with open(os.path.join(base, part, "input.txt"), "w") as fi, \
                open(os.path.join(base, part, "output.txt"), "w") as fo:
            for u, n, t in zip(data.users, data.history_lengths, data.targets):
                fi.write(" ".join(map(str, split.sequences[u][:n])) + "\n")
                fo.write(f"{t}\n")
    with open(os.path.join(base, "dataset_stats.json"), "w") as f:
        json.dump({"num_items": int(split.num_items)}, f)
    counts = np.concatenate([split.train_item_counts(), [0]]).astype(np.float64)
    with open(os.path.join(base, "item_cnt.pkl"), "wb") as f:
        pickle.dump(counts.tolist(), f)


def write_official_config(path: str, dataset: str, budget: dict, overrides: dict) -> None:
    fields = {**budget, **overrides, "path_to_cnt": f"./datasets/{dataset}/item_cnt.pkl"}
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    with open(path, "w") as f:
        f.write("from config import GSASRecExperimentConfig\n"
                f"config = GSASRecExperimentConfig(dataset_name={dataset!r}, {args})\n")


def prepare_official(args) -> tuple[str, str]:
    workdir = tempfile.mkdtemp(prefix="logq-official-")
    source = args.official_dir
    if source is None:
        source = os.path.join(workdir, "src")
        subprocess.run(["git", "clone", "--depth", "1", OFFICIAL_REPOSITORY, source], check=True)
    code = os.path.join(workdir, "code")
    shutil.copytree(source, code, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    python = args.official_python
    if python is None:
        env = os.path.join(workdir, "venv")
        subprocess.run([sys.executable, "-m", "venv", env], check=True)
        python = os.path.join(env, "bin", "python")
        subprocess.run([python, "-m", "pip", "install", "-q", "torch", "ir_measures", "tqdm",
                        "torchinfo", "numpy"], check=True)
    with open(os.path.join(code, "parity_wrapper.py"), "w") as f:
        f.write(_WRAPPER)
    return code, python


def run_official(code: str, python: str, loss: str, seed: int, budget: str,
                 threads: int, log_dir: str) -> dict:
    script, overrides = OFFICIAL_SCRIPTS[loss]
    config = os.path.join(code, f"parity_config_{loss}.py")
    write_official_config(config, "ml1m_parity", official_budget(budget), overrides)
    shutil.rmtree(os.path.join(code, "models"), ignore_errors=True)
    out_json = os.path.join(code, "parity_test.json")
    log_path = os.path.join(log_dir, f"official-{loss}-seed{seed}.log")
    start = time.perf_counter()
    with open(log_path, "w") as log:
        subprocess.run([python, "parity_wrapper.py", script, config, str(seed), str(threads),
                        out_json], cwd=code, stdout=log, stderr=subprocess.STDOUT, check=True)
    seconds = time.perf_counter() - start
    curve = []
    with open(log_path, errors="replace") as log:
        for line in log:
            match = _EPOCH_LINE.search(line)
            if match:
                ndcg = re.search(r"nDCG@10: ([0-9.eE+-]+)", match.group(2))
                curve.append(float(ndcg.group(1)))
    with open(out_json) as f:
        test = json.load(f)
    return {"val_ndcg@10": curve, "test_recall@20": test["R@20"],
            "test_ndcg@20": test["nDCG@20"], "seconds": round(seconds, 1)}


def run_ours(data_dir: str, loss: str, seed: int, budget: str, threads: int) -> dict:
    """Trains in a fresh process (its own TensorFlow state) and returns its record."""
    with tempfile.TemporaryDirectory(prefix="logq-ours-") as tmp:
        out_json = os.path.join(tmp, "record.json")
        env = {**os.environ, "TF_NUM_INTEROP_THREADS": str(threads),
               "TF_NUM_INTRAOP_THREADS": str(threads), "TF_CPP_MIN_LOG_LEVEL": "2"}
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "_ours", "--data-dir", data_dir, "--loss", loss,
                        "--seed", str(seed), "--budget", budget, "--model-dir", tmp,
                        "--record", out_json], check=True, env=env)
        seconds = time.perf_counter() - start
        with open(out_json) as f:
            record = json.load(f)
    record["seconds"] = round(seconds, 1)
    return record


def _ours_config(data_dir: str, loss: str, seed: int, budget: str):
    from tfrs_logq.sasrec.training import resolve_config

    return resolve_config(budget, dataset="ml-1m", split="gsasrec", loss=loss,
                          data_dir=data_dir, data_format="sasrec", seed=seed)


def import_ours(grid_dir: str, data_dir: str, loss: str, seed: int, budget: str):
    """Our record from a finished `python -m lab experiment` run of exactly the config
    `run_ours` trains, or None when there is none."""
    from tfrs_logq.sasrec.training import same_run

    run_dir = os.path.join(grid_dir, "runs", f"ml-1m_gsasrec_{loss}_seed{seed}")
    metrics = os.path.join(run_dir, "metrics.json")
    if not os.path.exists(metrics) or not same_run(_ours_config(data_dir, loss, seed, budget),
                                                   run_dir):
        return None
    with open(metrics) as f:
        result = json.load(f)
    return {"val_ndcg@10": result["validation_curve"],
            "test_recall@20": result["test"]["recall@20"],
            "test_ndcg@20": result["test"]["ndcg@20"],
            "seconds": result["train_seconds"], "source": run_dir}


def _ours_child(args) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from tfrs_logq.sasrec.training import train

    tf.config.threading.set_intra_op_parallelism_threads(
        int(os.environ.get("TF_NUM_INTRAOP_THREADS", "0")))
    curve = []

    class Curve(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            curve.append(float(logs["val_ndcg@10"]))

    config = _ours_config(args.data_dir, args.loss, args.seed, args.budget)
    result = train(config, os.path.join(args.model_dir, "run"), verbose=0,
                   extra_callbacks=[Curve()])
    with open(args.record, "w") as f:
        json.dump({"val_ndcg@10": curve, "test_recall@20": result["test"]["recall@20"],
                   "test_ndcg@20": result["test"]["ndcg@20"]}, f)


def check_forward(code: str, python: str, num_items: int = 50, length: int = 20, dim: int = 16,
                  heads: int = 2, blocks: int = 2, seed: int = 0) -> float:
    """Max |difference| between the official gSASRec's outputs and `SASRecEncoder`'s
    with the official weights copied in (same input, inference mode)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from tfrs_logq.sasrec.models import SASRecEncoder

    script = os.path.join(code, "parity_forward.py")
    with open(script, "w") as f:
        f.write(_FORWARD)
    out = os.path.join(code, "parity_forward.npz")
    subprocess.run([python, script, *map(str, (num_items, length, dim, heads, blocks, seed)),
                    out], cwd=code, check=True)
    w = dict(np.load(out))
    official_ids = w["ids"]
    ids = np.where(official_ids == num_items + 1, 0, official_ids).astype(np.int32)
    encoder = SASRecEncoder(num_items + 1, length, dim, blocks, heads, dropout=0.5)
    encoder(tf.zeros([1, length], tf.int32))

    def table(rows):  # official rows 0..N+1 (N+1 = padding) -> ours 0..N (0 = padding)
        return np.concatenate([rows[num_items + 1:num_items + 2], rows[1:num_items + 1]])

    encoder.item_embedding.embeddings.assign(table(w["item_embedding.weight"]))
    encoder.output_embedding.embeddings.assign(table(w["output_embedding.weight"]))
    encoder.position_embedding.embeddings.assign(w["position_embedding.weight"])
    for i, block in enumerate(encoder.blocks):
        p = f"transformer_blocks.{i}."
        for norm, name in ((block.attention_norm, "first_norm"), (block.ffn_norm, "second_norm")):
            norm.set_weights([w[p + name + ".weight"], w[p + name + ".bias"]])
        for dense, name in ((block.attention.query, "multihead_attention.query_proj"),
                            (block.attention.key, "multihead_attention.key_proj"),
                            (block.attention.value, "multihead_attention.val_proj"),
                            (block.ffn_in, "dense1"), (block.ffn_out, "dense2")):
            dense.set_weights([w[p + name + ".weight"].T, w[p + name + ".bias"]])
    encoder.final_norm.set_weights([w["seq_norm.weight"], w["seq_norm.bias"]])
    ours = encoder(ids, training=False).numpy()
    return float(np.abs(ours - w["hidden"]).max())


def _mean_std(values, digits: int = 4) -> str:
    values = np.asarray(values, np.float64)
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def table(records: list[dict]) -> str:
    lines = ["| loss | seeds | official R@20 | ours R@20 | official NDCG@20 | ours NDCG@20 | "
             "official s/run | ours s/run |", "|---|---|---|---|---|---|---|---|"]
    losses = list(dict.fromkeys(r["loss"] for r in records))
    for loss in losses:
        side = {s: [r for r in records if r["loss"] == loss and r["side"] == s]
                for s in ("official", "ours")}
        seeds = sorted({r["seed"] for r in records if r["loss"] == loss})

        def cell(s, key):
            digits = 0 if key == "seconds" else 4
            # Imported runs (--import-ours) timed training only: not comparable seconds.
            runs = [r for r in side[s] if key != "seconds" or "source" not in r]
            return _mean_std([r[key] for r in runs], digits) if runs else "-"

        cells = [cell(s, key) for key in ("test_recall@20", "test_ndcg@20", "seconds")
                 for s in ("official", "ours")]
        lines.append(f"| {loss} | {','.join(map(str, seeds))} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def curves(records: list[dict]) -> str:
    out = []
    for r in records:
        points = " ".join(f"{v:.4f}" for v in r["val_ndcg@10"])
        out.append(f"{r['side']:8s} {r['loss']:18s} seed {r['seed']}: {points}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="directory holding SASRec's ml-1m.txt")
    parser.add_argument("--official-dir", help="local checkout of the official code "
                        "(default: git clone into a temporary directory)")
    parser.add_argument("--official-python", help="a Python with torch, ir_measures, tqdm, "
                        "torchinfo (default: a new virtual environment)")
    parser.add_argument("--loss", nargs="+", default=["inbatch-none", "inbatch-logq-official",
                                                      "mns-logq-official", "mns-corrected"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--budget", default="cpu", choices=BUDGETS)
    parser.add_argument("--sides", nargs="+", default=["official", "ours"],
                        choices=("official", "ours"))
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per run")
    parser.add_argument("--output", default="results/parity-cpu")
    parser.add_argument("--import-ours", metavar="DIR",
                        help="take our side from the finished runs of a `python -m lab experiment "
                             "--preset BUDGET --splits gsasrec` directory instead of training "
                             "(only runs whose saved config is the one this harness trains)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rewrite OUTPUT/parity.md from OUTPUT/runs.jsonl")
    parser.add_argument("--check-forward", action="store_true",
                        help="only compare the forward pass with the official weights copied "
                             "into SASRecEncoder (2 blocks, 2 heads, random biases/norms)")
    args = parser.parse_args(argv)
    if args.check_forward:
        code, python = prepare_official(args)
        diff = check_forward(code, python)
        print(f"forward pass, official gSASRec vs SASRecEncoder with its weights: "
              f"max |difference| {diff:.2e}")
        return 0 if diff < 1e-4 else 1
    losses = args.loss
    unknown = set(losses) - set(OFFICIAL_SCRIPTS)
    if unknown:
        parser.error(f"unknown losses {sorted(unknown)}; expected some of {list(OFFICIAL_SCRIPTS)}")
    seeds, sides = args.seeds, args.sides
    os.makedirs(args.output, exist_ok=True)
    runs_path = os.path.join(args.output, "runs.jsonl")
    records = []
    if os.path.exists(runs_path):
        with open(runs_path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    done = {(r["side"], r["loss"], r["seed"], r["budget"]) for r in records}

    code = python = None
    split = None
    for seed in ([] if args.report_only else seeds):
        for loss in losses:
            for side in sides:
                if (side, loss, seed, args.budget) in done:
                    continue
                if side == "official":
                    if code is None:
                        code, python = prepare_official(args)
                        split = split or load_split(args.data_dir)
                        write_official_dataset(split, code, "ml1m_parity")
                    result = run_official(code, python, loss, seed, args.budget, args.threads,
                                          args.output)
                elif args.import_ours:
                    result = import_ours(args.import_ours, args.data_dir, loss, seed,
                                         args.budget)
                    if result is None:
                        print(f"ours {loss} seed {seed}: no matching finished run in "
                              f"{args.import_ours}", flush=True)
                        continue
                else:
                    result = run_ours(args.data_dir, loss, seed, args.budget, args.threads)
                record = {"side": side, "loss": loss, "seed": seed, "budget": args.budget,
                          **result}
                records.append(record)
                with open(runs_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"{side} {loss} seed {seed}: test R@20 {result['test_recall@20']:.4f} "
                      f"NDCG@20 {result['test_ndcg@20']:.4f} ({result['seconds']} s)", flush=True)
    report = (f"# Parity with the official code, budget `{args.budget}`\n\n"
              f"ML-1M, gSASRec leave-one-out split, test metrics at the best validation "
              f"epoch; mean ± std over seeds.\n\n{table(records)}\n\n"
              f"Validation NDCG@10 per epoch:\n\n```\n{curves(records)}\n```\n")
    with open(os.path.join(args.output, "parity.md"), "w") as f:
        f.write(report)
    print(report)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_ours":
        child = argparse.ArgumentParser()
        for flag in ("--data-dir", "--loss", "--budget", "--model-dir", "--record"):
            child.add_argument(flag, required=True)
        child.add_argument("--seed", type=int, required=True)
        _ours_child(child.parse_args(sys.argv[2:]))
        sys.exit(0)
    sys.exit(main())
