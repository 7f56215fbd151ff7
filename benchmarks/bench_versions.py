"""SASRec training step time of two versions of this project, side by side.

Answers "how much faster than release X" on the same machine and data: each version
runs from its own snapshot (``git archive REV`` of ``tfrs_logq``, ``pipelines`` and
``serving``, or a copy of the work tree for ``WORKTREE``) in its own process, and the
versions alternate for ``--rounds`` rounds (which goes first alternates too) so that
drifting machine load hits both alike. Each process builds the model at the preset,
warms up, then times 3 x ``--steps`` training steps (full batches only); the table
gives the median over rounds of each process's median, wall and CPU (all threads)
milliseconds per step, and the ratio.

    python benchmarks/bench_versions.py --baseline 40bc40e --candidate WORKTREE \\
        --preset cpu --loss inbatch-corrected mns-corrected
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PACKAGES = ("tfrs_logq", "pipelines", "serving")
DEFAULT_DATA = os.path.join(ROOT, "..", "shared", "data", "ml-1m-sasrec")


def snapshot(rev: str, into: str) -> str:
    """The importable package of ``rev`` (or of the work tree) under ``into``."""
    if rev == "WORKTREE":
        for name in PACKAGES:
            shutil.copytree(os.path.join(ROOT, name), os.path.join(into, name),
                            ignore=shutil.ignore_patterns("__pycache__"))
    else:
        proc = subprocess.run(["git", "archive", rev, *PACKAGES], cwd=ROOT, capture_output=True)
        if proc.returncode:
            raise SystemExit(f"git archive {rev} failed: {proc.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", into], input=proc.stdout, check=True)
    for name in PACKAGES[1:]:  # installed as tfrs_logq.pipelines / tfrs_logq.serving
        shutil.move(os.path.join(into, name), os.path.join(into, "tfrs_logq", name))
    return into


def child(args) -> None:
    """Runs inside a snapshot (PYTHONPATH, ``-P``): prints one JSON line."""
    import time

    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    # An editable install of this project adds a finder that would serve any module
    # the snapshot lacks from the work tree; only the snapshot may be imported.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, HERE)  # common.py; it imports tfrs_logq, here the snapshot's
    import tensorflow as tf  # noqa: I001  (after the finder is gone)
    from common import ml1m_or_stand_in

    import tfrs_logq
    from tfrs_logq.pipelines.sequential import training_dataset
    from tfrs_logq.pipelines.splits import make_split
    from tfrs_logq.sasrec.training import build_model, resolve_config

    if not os.path.abspath(tfrs_logq.__file__).startswith(os.path.abspath(args.snapshot)):
        raise SystemExit(f"imported {tfrs_logq.__file__}, not the snapshot {args.snapshot}")
    inter, _ = ml1m_or_stand_in(args.data_dir)
    split = make_split(inter, "gsasrec")
    (loss,) = args.loss  # one loss a child process
    cfg = resolve_config(args.preset, loss=loss)
    model = build_model(cfg, split, tf.distribute.get_strategy())
    full = lambda x: tf.shape(tf.nest.flatten(x)[0])[0] == cfg.batch_size  # noqa: E731
    data = iter(training_dataset(split, cfg.batch_size, cfg.max_length).repeat().filter(full))
    step = model.make_train_function()
    for _ in range(3):
        float(step(data)["loss"])
    wall, cpu = [], []
    for _ in range(3):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            logs = step(data)
        float(logs["loss"])
        wall.append((time.perf_counter() - start) / args.steps * 1000)
        cpu.append((time.process_time() - start_cpu) / args.steps * 1000)
    outside = sorted(name for name, module in sys.modules.items()
                     if name.split(".")[0] == "tfrs_logq" and getattr(module, "__file__", None)
                     and not os.path.abspath(module.__file__).startswith(
                         os.path.abspath(args.snapshot)))
    if outside:
        raise SystemExit(f"modules imported from outside the snapshot: {outside}")
    print(json.dumps({"wall_ms": statistics.median(wall), "cpu_ms": statistics.median(cpu)}))


def main():
    parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=False, default=None,
                        help="git revision to compare against")
    parser.add_argument("--candidate", default="WORKTREE",
                        help="git revision, or WORKTREE for the files as they are")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--loss", nargs="+", default=["inbatch-corrected", "mns-corrected"],
                        help="the losses timed, one after the other")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--data-dir", default=DEFAULT_DATA)
    parser.add_argument("--timeout", type=float, default=1800,
                        help="seconds one version's process may take")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if not args.baseline:
        parser.error("--baseline REV is required")
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be >= 1")
    sys.path.insert(0, HERE)
    from tfrs_logq._util.hostinfo import cpu_description

    revs = {"baseline": args.baseline, "candidate": args.candidate}
    losses = args.loss
    results = {(who, loss): [] for who in revs for loss in losses}
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as tmp:
        snaps = {who: snapshot(rev, tempfile.mkdtemp(dir=tmp)) for who, rev in revs.items()}
        for round_ in range(args.rounds):
            for loss in losses:
                order = list(snaps.items())
                for who, snap in (order if round_ % 2 == 0 else order[::-1]):
                    env = {**os.environ, "PYTHONPATH": snap, "TF_CPP_MIN_LOG_LEVEL": "2"}
                    try:
                        proc = subprocess.run(
                            [sys.executable, "-P", os.path.abspath(__file__), "--child",
                             "--snapshot", snap, "--loss", loss, "--preset", args.preset,
                             "--steps", str(args.steps), "--data-dir", args.data_dir],
                            env=env, cwd=snap, capture_output=True, text=True,
                            timeout=args.timeout)
                    except subprocess.TimeoutExpired as err:
                        raise SystemExit(f"{revs[who]} {loss}: over {args.timeout:.0f} s"
                                         ) from err
                    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
                    if proc.returncode or not lines:
                        raise SystemExit(f"{revs[who]} {loss} failed:\n{proc.stderr[-3000:]}")
                    results[who, loss].append(json.loads(lines[-1]))
    print(f"machine: {os.cpu_count()} CPU cores ({cpu_description()}), preset {args.preset}, "
          f"data {'ML-1M' if os.path.isdir(args.data_dir) else 'synthetic stand-in'}; "
          f"median of {args.rounds} alternating rounds, each the median of 3 x "
          f"{args.steps} steps")
    print(f"| loss | {args.baseline} ms/step | {args.candidate} ms/step | "
          f"{args.baseline} CPU ms/step | {args.candidate} CPU ms/step | speed-up (wall) | "
          "speed-up (CPU) |")
    print("|---|---|---|---|---|---|---|")
    for loss in losses:
        med = {(who, key): statistics.median(r[key] for r in results[who, loss])
               for who in revs for key in ("wall_ms", "cpu_ms")}
        print(f"| {loss} | {med['baseline', 'wall_ms']:.0f} | {med['candidate', 'wall_ms']:.0f}"
              f" | {med['baseline', 'cpu_ms']:.0f} | {med['candidate', 'cpu_ms']:.0f} | "
              f"{med['baseline', 'wall_ms'] / med['candidate', 'wall_ms']:.2f}x | "
              f"{med['baseline', 'cpu_ms'] / med['candidate', 'cpu_ms']:.2f}x |")


if __name__ == "__main__":
    main()
