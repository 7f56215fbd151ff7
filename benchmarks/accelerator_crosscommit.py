#!/usr/bin/env python3
"""Do two commits of the accelerator study give the same numbers? (JAX on CPU.)

The 1M-item learning curve (results/accelerator-study/) pairs seed 1's runs across two code
versions: H100 rows at 549b394 (code digest 6ca138781fa8), H200 rows at c7da2e7
(23c9c68e5576). This script checks the code versions apart from the machines: it checks out
each commit into a temporary git worktree, runs that commit's entry point
(``benchmarks/accelerator_study.py``, with that commit's ``keras-logq/`` first on the path)
on one small world with the same flags, and compares

- every metric column of ``results.csv`` at each evaluation point,
- the saved state after the last evaluation (weights and both Adam moments, every array),
- the lowered program of the training step (a hash of its StableHLO text) and the batch
  loss of every step (a probe that runs the commit's own jitted loop one step
  a call, with the run's configuration from the commit's own ``runs.preset_runs``),

and writes one row per compared quantity: both values (or, for arrays, the largest
absolute difference), and whether they are equal to the bit.

    .venv-keras/bin/python benchmarks/accelerator_crosscommit.py \\
        --output results/accelerator-study/crosscommit.csv

About 4.5 minutes a commit at the default 1,000 steps on a shared 2-core CPU. The worktrees go under
``--work`` (default a temporary folder) and are removed at the end.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITS = ("549b394", "c7da2e7")
# Seed 1's cross-commit pairs; both commits name TFRS's logQ `logq-paper` (`logq-tfrs` from
# 085c1a8 on, so the script compares commits before it).
CORRECTIONS = ("corrected", "logq-paper", "logq-official")
# The curve preset's structure (sigma 8, mixed negatives, mixture proposal, d = 32, learning
# rate 1e-2, lazy Adam) on the small world of `benchmarks/accelerator/w1_probe.py`.
WORLD = ("num_items=20000", "num_users=5000", "num_topics=500", "batch_size=256",
         "num_in_batch=256", "num_uniform=256", "num_eval_users=1024")

PROBE = r"""
import hashlib, json, sys
import jax, jax.numpy as jnp, numpy as np
from benchmarks.accelerator import driver, model, world as world_lib
from benchmarks.accelerator.cli import parse_overrides
from benchmarks.accelerator.runs import preset_runs, proposal_log_q
args = json.loads(sys.argv[1])
overrides = parse_overrides(args["set"])
runs = [r for r in preset_runs("curve", [args["seed"]], eval_at=(args["steps"],), **overrides)
        if r.proposal == "mixture" and r.correction in args["corrections"]]
w = world_lib.World(runs[0].world(), runs[0].num_eval_users)
tables = world_lib.device_tables(w)
out = {}
for run in runs:
    log_q = proposal_log_q(run, w.log_q)
    log_q = jnp.asarray(np.where(np.isfinite(log_q), log_q, 0.0), jnp.float32)
    config = driver.step_config(run)
    loop, state = model.make_train_loop(config), model.init_state(config)
    # The training step's program as JAX lowers it (StableHLO, without source locations).
    program = loop.lower(tables, log_q, state, 1).as_text()
    out["program/" + run.correction] = np.array(hashlib.sha256(program.encode()).hexdigest())
    losses = []
    for _ in range(args["steps"]):
        state, loss = loop(tables, log_q, state, 1)
        losses.append(np.asarray(loss))
    out[run.correction] = np.stack(losses)
np.savez(args["out"], **out)
print(f"probe: {len(runs)} runs x {args['steps']} steps, code {driver.code_digest()}")
"""


def sh(cmd, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def run_commit(commit: str, work: str, steps: list, seed: int, log) -> dict:
    """Runs ``commit``'s entry point and the loss probe; returns where their files are."""
    tree = os.path.join(work, f"wt-{commit}")
    out = os.path.join(work, f"out-{commit}")
    sh(["git", "-C", ROOT, "worktree", "add", "--detach", tree, commit])
    try:
        env = {**os.environ, "KERAS_BACKEND": "jax",
               "PYTHONPATH": os.pathsep.join([os.path.join(tree, "keras-logq"), tree])}
        # The flags as the compared commits spell them: `--corrections` (today `--loss`)
        # and comma-separated lists (today space-separated).
        cmd = [sys.executable, "benchmarks/accelerator_study.py", "--preset", "curve",
               "--output-dir", out, "--seeds", str(seed), "--proposals", "mixture",
               "--corrections", ",".join(CORRECTIONS),
               "--eval-at", ",".join(map(str, steps))]
        for item in WORLD:
            cmd += ["--set", item]
        log(f"[{commit}] {' '.join(cmd[1:])}")
        log(sh(cmd, cwd=tree, env=env).rstrip())
        probe = os.path.join(work, f"loss-{commit}.npz")
        spec = {"set": list(WORLD), "seed": seed, "steps": max(steps),
                "corrections": list(CORRECTIONS), "out": probe}
        log(sh([sys.executable, "-c", PROBE, json.dumps(spec)], cwd=tree, env=env).rstrip())
    finally:
        sh(["git", "-C", ROOT, "worktree", "remove", "--force", tree])
    return {"results": os.path.join(out, "results.csv"), "runs": os.path.join(out, "runs"),
            "loss": probe}


def read_rows(path: str) -> dict:
    with open(path, newline="") as f:
        return {(r["correction"], int(r["steps"])): r for r in csv.DictReader(f)}


def checkpoints(folder: str) -> dict:
    """``{correction: {array name: array}}`` of the saved states in ``folder``."""
    out = {}
    for name in sorted(os.listdir(folder)):
        with np.load(os.path.join(folder, name)) as data:
            key = str(data["key"])
            correction = dict(p.split("=", 1) for p in key.split("|"))["correction"]
            out[correction] = {k: data[k] for k in data.files if k != "key"}
    return out


def compare(a: dict, b: dict, commits) -> list:
    rows = []
    ra, rb = read_rows(a["results"]), read_rows(b["results"])
    if set(ra) != set(rb):
        raise SystemExit(f"the commits wrote different rows: {sorted(set(ra) ^ set(rb))}")
    for corr, steps in sorted(ra):
        x, y = ra[corr, steps], rb[corr, steps]
        for col in x:
            if not (col.startswith(("exact_", "observed_", "head_", "torso_", "tail_",
                                    "model_", "oracle_", "truth_"))):
                continue
            fx, fy = float(x[col]), float(y[col])
            rows.append(dict(kind="metric", correction=corr, steps=steps, name=col,
                             value_a=x[col], value_b=y[col], max_abs_diff=abs(fx - fy),
                             bit_equal=x[col] == y[col]))
        rows.append(dict(kind="code", correction=corr, steps=steps,
                         name="code digest (results.csv)", value_a=x["code"],
                         value_b=y["code"], max_abs_diff="", bit_equal=""))
    ca, cb = checkpoints(a["runs"]), checkpoints(b["runs"])
    for corr in sorted(ca):
        steps = int(ca[corr]["step"])
        for name in sorted(ca[corr]):
            u, v = ca[corr][name], cb[corr][name]
            diff = float(np.max(np.abs(u.astype(np.float64) - v.astype(np.float64))))
            rows.append(dict(kind="state", correction=corr, steps=steps, name=name,
                             value_a=f"shape {list(u.shape)}", value_b=f"shape {list(v.shape)}",
                             max_abs_diff=diff,
                             bit_equal=u.shape == v.shape and u.tobytes() == v.tobytes()))
    with np.load(a["loss"]) as la, np.load(b["loss"]) as lb:
        for name in sorted(f for f in la.files if f.startswith("program/")):
            u, v = str(la[name]), str(lb[name])
            rows.append(dict(kind="program", correction=name.split("/", 1)[1], steps="",
                             name="sha256 of the lowered training step (StableHLO)",
                             value_a=u[:16], value_b=v[:16], max_abs_diff="",
                             bit_equal=u == v))
        for corr in sorted(f for f in la.files if not f.startswith("program/")):
            u, v = la[corr], lb[corr]
            equal = u.view(np.uint32) == v.view(np.uint32)
            rows.append(dict(kind="loss", correction=corr, steps=len(u),
                             name="batch loss, every step",
                             value_a=f"last {float(u[-1]):.6g}",
                             value_b=f"last {float(v[-1]):.6g}",
                             max_abs_diff=float(np.max(np.abs(u.astype(np.float64) - v))),
                             bit_equal=bool(equal.all())))
            if not equal.all():
                rows[-1]["name"] += f" (first unequal step {int(np.argmin(equal)) + 1})"
    for r in rows:
        r["commit_a"], r["commit_b"] = commits
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commits", nargs=2, default=list(COMMITS), metavar=("A", "B"),
                   help="the two commits compared")
    p.add_argument("--eval-at", nargs="+", type=int, default=[100, 300, 1000],
                   help="evaluation points (the last is the length of the runs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", required=True, help="the CSV of compared quantities")
    p.add_argument("--work", help="a folder for the worktrees and the runs (default: a "
                                  "temporary folder)")
    args = p.parse_args(argv)
    commits = args.commits
    steps = sorted(args.eval_at)
    work = args.work or tempfile.mkdtemp(prefix="crosscommit-")
    os.makedirs(work, exist_ok=True)

    def log(message: str) -> None:
        print(message, flush=True)

    files = [run_commit(c, work, steps, args.seed, log) for c in commits]
    rows = compare(*files, commits)
    fields = ["commit_a", "commit_b", "kind", "correction", "steps", "name", "value_a",
              "value_b", "max_abs_diff", "bit_equal"]
    with open(args.output, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    for kind in ("program", "metric", "state", "loss"):
        sel = [r for r in rows if r["kind"] == kind]
        diffs = [r["max_abs_diff"] for r in sel if r["max_abs_diff"] != ""]
        log(f"{kind}: {sum(r['bit_equal'] for r in sel)} of {len(sel)} bit-equal"
            + (f", largest absolute difference {max(diffs):.3g}" if diffs else ""))
    codes = {(r["value_a"], r["value_b"]) for r in rows if r["kind"] == "code"}
    log(f"code digests (a, b): {sorted(codes)}; rows: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
