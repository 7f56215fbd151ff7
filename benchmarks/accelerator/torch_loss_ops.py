"""What keras-logq's loss does on PyTorch for ``"corrected"`` and not for ``"logq-tfrs"``.

    KERAS_BACKEND=torch python -m benchmarks.accelerator.torch_loss_ops

An H100 measured keras-logq on PyTorch at 14.7 ms a step corrected against 11.4 ms
standard logQ on an H100 (1M items, batch 4,096 with 4,096 uniform negatives). This
script calls the public `keras_logq.CorrectedRetrieval` layer on a `[B, B + k]` score
matrix (in-batch plus shared negatives, ids for hit removal, ``log Q`` of every
candidate), forward and backward, once per correction under `torch.profiler` on the CPU,
and prints for each correction:

- the ATen operators run and how many of them touch a full `[B, B + k]` tensor (each is
  one pass over 4 B (B + k) bytes or more: 128 MB at the issue's shapes);
- the tensors made from Python scalars or host data (``aten::lift_fresh``,
  ``aten::_to_copy`` of a CPU tensor, ``aten::item`` / ``aten::_local_scalar_dense``):
  on a GPU a host-to-device copy from pageable memory, and ``item`` a synchronisation;
- the self CPU time of each operator under the profiler, the largest increases first;
- the median wall time of ``--repeats`` forward + backward passes of each, interleaved.

keras-logq's tests check the values against the paper's formulas; this script only times.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
if __package__ in (None, ""):
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                                "keras-logq")))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import keras_logq  # noqa: E402

HOST_OPS = ("aten::lift_fresh", "aten::item", "aten::_local_scalar_dense", "aten::scalar_tensor")


def inputs(batch: int, extra: int, num_items: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = np.concatenate([rng.integers(1, num_items, batch), rng.integers(1, num_items, extra)])
    q = rng.random(num_items) + 0.1
    log_q = np.log(q / q.sum())[ids]
    scores = torch.tensor(rng.normal(size=(batch, batch + extra)), dtype=torch.float32,
                          requires_grad=True)
    return scores, torch.tensor(ids), torch.tensor(log_q, dtype=torch.float32)


def step(layer, scores, ids, log_q):
    loss = layer(scores, candidate_ids=ids, candidate_log_sampling_probability=log_q)
    loss.backward()
    return loss


def profile_one(correction: str, scores, ids, log_q) -> dict:
    layer = keras_logq.CorrectedRetrieval(correction=correction, reduction="sum")
    step(layer, scores, ids, log_q)  # warm
    full = tuple(scores.shape)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(layer, scores, ids, log_q)
    ops, big, host = collections.Counter(), collections.Counter(), collections.Counter()
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        ops[e.name] += 1
        if any(tuple(s) == full or tuple(s) == (full[0], full[1] + 1)
               for s in (e.input_shapes or []) if isinstance(s, (list, tuple))):
            big[e.name] += 1
        if e.name in HOST_OPS:
            host[e.name] += 1
    self_ms = collections.Counter()
    for avg in prof.key_averages():
        if avg.key.startswith("aten::"):
            self_ms[avg.key] += avg.self_cpu_time_total / 1e3
    return {"ops": ops, "big": big, "host": host, "self_ms": self_ms, "layer": layer}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--extra", type=int, default=1024, help="shared negatives")
    p.add_argument("--synthetic-items", dest="items", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    scores, ids, log_q = inputs(args.batch, args.extra, args.items)
    found = {c: profile_one(c, scores, ids, log_q) for c in ("logq-tfrs", "corrected")}
    print(f"scores [{args.batch}, {args.batch + args.extra}], forward + backward, "
          f"torch {torch.__version__} on CPU, keras-logq {keras_logq.__version__}")
    for c, f in found.items():
        print(f"\n{c}: {sum(f['ops'].values())} ATen ops, "
              f"{sum(f['big'].values())} on a full [B, B + k] tensor; "
              f"host-made tensors / syncs: {dict(f['host']) or 'none'}")
    a, b = found["logq-tfrs"]["big"], found["corrected"]["big"]
    print("\n[B, B + k] ops, corrected minus logq-tfrs:")
    for name in sorted(set(a) | set(b)):
        if a[name] != b[name]:
            print(f"  {name}: {a[name]} -> {b[name]}")
    ta, tb = found["logq-tfrs"]["self_ms"], found["corrected"]["self_ms"]
    diff = sorted(set(ta) | set(tb), key=lambda n: -(tb[n] - ta[n]))
    print("\nself CPU ms under the profiler, the largest increases (logq-tfrs -> corrected):")
    for name in diff[:8]:
        print(f"  {name}: {ta[name]:.1f} -> {tb[name]:.1f} ms "
              f"({found['logq-tfrs']['ops'][name]} -> {found['corrected']['ops'][name]} calls)")
    times = {c: [] for c in found}
    for _ in range(args.repeats):
        for c, f in found.items():
            scores.grad = None
            t0 = time.perf_counter()
            step(f["layer"], scores, ids, log_q)
            times[c].append(time.perf_counter() - t0)
    ms = {c: 1e3 * float(np.median(t)) for c, t in times.items()}
    print(f"\nmedian ms ({torch.get_num_threads()} thread): logq-tfrs {ms['logq-tfrs']:.2f}, "
          f"corrected {ms['corrected']:.2f} (x{ms['corrected'] / ms['logq-tfrs']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
