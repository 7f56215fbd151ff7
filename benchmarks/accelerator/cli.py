"""``benchmarks/accelerator_study.py``'s command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

STARTED_AT = time.time()  # --max-seconds counts from here (imports and set-up included)

from .runs import PRESETS, Run, preset_runs  # noqa: E402  (after STARTED_AT)


def _value(field: dataclasses.Field, text: str):
    default = field.default
    if isinstance(default, bool):
        return text.lower() in ("1", "true", "yes")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    return text


def parse_overrides(items) -> dict:
    fields = {f.name: f for f in dataclasses.fields(Run)}
    out = {}
    for item in items or []:
        name, _, text = item.partition("=")
        if name not in fields or name == "eval_at" or not text:
            raise SystemExit(f"--set takes FIELD=VALUE with FIELD one of "
                             f"{sorted(set(fields) - {'eval_at'})}, received {item!r}")
        out[name] = _value(fields[name], text)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="accelerator_study.py",
        description="The synthetic study (research/study.md) on Keras 3 / JAX, without "
                    "TensorFlow. Rows go to OUT/results.csv run by run; a run continues "
                    "from OUT/runs/ after a stop.")
    p.add_argument("--preset", choices=tuple(PRESETS), default="smoke")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--seeds", nargs="+", type=int, help="seeds (default: the preset's)")
    p.add_argument("--eval-at", nargs="+", type=int,
                   help="step counts to evaluate at (default: the preset's)")
    p.add_argument("--loss", nargs="+",
                   help="a subset of the preset's corrections (default: all)")
    p.add_argument("--proposals", nargs="+",
                   help="a subset of the preset's proposals (default: all)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a Run field of every run (e.g. num_items=100000)")
    p.add_argument("--max-seconds", type=float, help="stop (state saved) before this many "
                                                     "seconds of this process")
    p.add_argument("--max-runs", type=int, help="at most this many pending runs")
    p.add_argument("--checkpoint-seconds", type=float, default=120.0)
    p.add_argument("--chunk-floats", type=int, default=1 << 25,
                   help="scores per evaluation chunk (queries x items)")
    p.add_argument("--pending", action="store_true", help="list the pending runs and exit")
    args = p.parse_args(argv)

    overrides = parse_overrides(args.set)
    if args.eval_at:
        overrides["eval_at"] = tuple(args.eval_at)
    runs = preset_runs(args.preset, args.seeds, **overrides)
    for flag, field, keep in (("--loss", "correction", args.loss),
                              ("--proposals", "proposal", args.proposals)):
        if keep:
            known = sorted({getattr(r, field) for r in runs})
            if set(keep) - set(known):
                p.error(f"argument {flag}: {sorted(set(keep) - set(known))} not in the "
                        f"preset {args.preset!r}, which has {known}")
            runs = [r for r in runs if getattr(r, field) in keep]

    from . import driver  # imports jax

    if args.pending:
        done = driver.finished_rows(f"{args.output_dir}/results.csv")
        todo = [r for r in runs if any(r.row_id(s) not in done for s in r.eval_at)]
        for r in todo:
            print(r.row_id(r.steps))
        print(f"{len(todo)} of {len(runs)} runs pending")
        return 0
    result = driver.run_all(runs, args.output_dir, args.max_seconds, args.max_runs,
                            args.checkpoint_seconds, args.chunk_floats,
                            log=lambda m: print(m, flush=True), started_at=STARTED_AT)
    print(f"{result['rows']} row(s) written; {result['pending']} run(s) pending"
          + (f"; {result['stopped']}" if result["stopped"] else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
