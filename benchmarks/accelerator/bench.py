"""Step time of the accelerator study, with its ratios measured in the same process.

    python -m benchmarks.accelerator.bench                      # CPU or whatever JAX sees
    python -m benchmarks.accelerator.bench --synthetic-items 100000 1000000 10000000 --batch 4096

For each catalog size and each correction the jitted training step of
`benchmarks.accelerator.model` (stream drawn on the device, negatives, keras-logq loss,
row-sparse LazyAdam) runs ``--rounds`` blocks of ``--steps`` steps after compilation, the
configurations interleaved round by round (so that a change of load hits all alike); the
median block (or with ``--statistic min`` the fastest, on a shared machine) gives ms/step.
Printed: the table, then the ratios corrected / logq-tfrs at every size and largest /
smallest catalog for every correction, and the machine.
The world has ``--synthetic-users`` users (the step reads one row of the `[users, C]` table per
draw; the size does not enter the step's cost beyond cache effects).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.accelerator import driver, model, world  # noqa: E402
from benchmarks.accelerator.runs import Run, proposal_log_q  # noqa: E402


@contextlib.contextmanager
def log_q_check(enabled: bool):
    """keras_logq's ``check_log_q`` as shipped, or (``enabled=False``) the identity while
    a step is traced: to measure what the check costs inside the jitted step."""
    import keras_logq.losses as klq

    original = klq.check_log_q
    if not enabled:
        klq.check_log_q = lambda log_q, name, where=None: log_q
    try:
        yield
    finally:
        klq.check_log_q = original


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic-items", dest="items", nargs="+", type=int,
                   default=[100_000, 1_000_000], help="catalog sizes")
    p.add_argument("--loss", nargs="+", default=["logq-tfrs", "corrected"],
                   help="the corrections timed")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--negatives", type=int, default=1024, help="uniform and in-batch, each")
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--synthetic-users", dest="users", type=int, default=2000)
    p.add_argument("--topics", type=int, default=10_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--statistic", choices=("median", "min"), default="median",
                   help="of the blocks' ms/step (min: the least disturbed, on a shared machine)")
    p.add_argument("--log-q-check", choices=("on", "off", "both"), default="on",
                   help="keras_logq's traced log Q <= 0 check (a jax.debug.callback per "
                        "step under jit): as shipped, patched out, or both")
    args = p.parse_args(argv)
    checks = {"on": [True], "off": [False], "both": [True, False]}[args.log_q_check]

    sizes, corrections = args.items, args.loss
    configs = []
    for v in sizes:
        base = Run(num_items=v, num_users=args.users, num_topics=min(args.topics, v),
                   topic_sharpness=8.0, sampler="mixed", num_in_batch=args.negatives,
                   num_uniform=args.negatives, proposal="mixture", batch_size=args.batch,
                   embedding_dim=args.dim, learning_rate=1e-2, eval_at=(1,))
        t0 = time.perf_counter()
        w = world.World(base.world(), 8)
        tables = world.device_tables(w)
        print(f"world V={v:,}: {time.perf_counter() - t0:.1f} s", flush=True)
        for check, c in [(check, c) for check in checks for c in corrections]:
            run = Run(**{**base.__dict__, "correction": c})
            config = driver.step_config(run)
            log_q = proposal_log_q(run, w.log_q)
            table = jnp.asarray(np.where(np.isfinite(log_q), log_q, 0.0), jnp.float32)
            model.make_train_loop.cache_clear()
            with log_q_check(check):
                loop = model.make_train_loop(config)
                state, loss = loop(tables, table, model.init_state(config), 2)  # traces
                jax.block_until_ready(loss)
            name = c if check else f"{c} (no check)"
            configs.append({"items": v, "correction": name, "loop": loop, "tables": tables,
                            "table": table, "state": state, "times": []})
    corrections = list(dict.fromkeys(cfg["correction"] for cfg in configs))
    for _ in range(args.rounds):
        for cfg in configs:
            t0 = time.perf_counter()
            cfg["state"], loss = cfg["loop"](cfg["tables"], cfg["table"], cfg["state"],
                                             args.steps)
            jax.block_until_ready(loss)
            cfg["times"].append((time.perf_counter() - t0) / args.steps)
    stat = np.min if args.statistic == "min" else np.median
    ms = {(c["items"], c["correction"]): 1e3 * float(stat(c["times"])) for c in configs}
    print(f"\nbatch {args.batch}, {args.negatives} uniform + {args.negatives} in-batch "
          f"negatives, d = {args.dim}; {args.statistic} of {args.rounds} blocks of {args.steps} "
          "steps")
    print("| items | " + " | ".join(f"{c} ms/step" for c in corrections) + " |")
    print("|---|" + "---|" * len(corrections))
    for v in sizes:
        print(f"| {v:,} | " + " | ".join(f"{ms[(v, c)]:.2f}" for c in corrections) + " |")
    if "corrected" in corrections and "logq-tfrs" in corrections:
        for v in sizes:
            print(f"corrected / logq-tfrs at {v:,} items: "
                  f"{ms[(v, 'corrected')] / ms[(v, 'logq-tfrs')]:.3f}")
    if "corrected (no check)" in corrections and "logq-tfrs (no check)" in corrections:
        for v in sizes:
            print(f"without the check, corrected / logq-tfrs at {v:,} items: "
                  f"{ms[(v, 'corrected (no check)')] / ms[(v, 'logq-tfrs (no check)')]:.3f}")
    if len(sizes) > 1:
        for c in corrections:
            print(f"{c}: {sizes[-1]:,} / {sizes[0]:,} items: "
                  f"{ms[(sizes[-1], c)] / ms[(sizes[0], c)]:.3f}")
    print(f"device {driver.device_name()}, jax {jax.__version__}; machine "
          f"{driver.machine_name()}; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
