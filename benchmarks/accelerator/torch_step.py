"""keras-logq's two-tower step on PyTorch: corrected against logQ, synchronisations counted.

    KERAS_BACKEND=torch python -m benchmarks.accelerator.torch_step \
        --synthetic-items 1000000 --batch 4096 --negatives 4096 --dim 64

An H100 measured keras-logq on PyTorch at 14.7 ms a step corrected against 11.4 ms
standard logQ on an H100 (1M items, batch 4,096 with 4,096 uniform negatives, d = 64,
dense Adam). This script runs that step: a user table and an item table
(`torch.nn.Embedding`, dense `torch.optim.Adam`), each batch's users and positives drawn on
the device (positives from a Zipf unigram table, whose ``log Q`` they carry), ``--negatives``
uniform negatives shared by the batch (``log Q = -log V``), the public
`keras_logq.CorrectedRetrieval` on the `[B, B + k]` scores, backward and the update.

For each correction, interleaved round by round (so a change of load hits both):

- the median ms per step over ``--rounds`` blocks of ``--steps`` steps (CUDA synchronised
  at each block's ends only, as a training loop runs);
- on CUDA, the blocking synchronisations of one step (`torch.cuda.set_sync_debug_mode`
  warns at each one; the warnings are counted);
- on every device, the tensors made from Python numbers in one step (Keras's PyTorch
  backend makes them with ``torch.as_tensor(x, device=...)``: on a GPU a blocking
  host-to-device copy).

Then the ratio corrected / logq-tfrs and the machine. Runs on CPU too (small sizes: the test).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings

os.environ["KERAS_BACKEND"] = "torch"
if __package__ in (None, ""):
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..",
                                                "keras-logq")))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import keras_logq  # noqa: E402

CORRECTIONS = ("logq-tfrs", "corrected")


class Step:
    """One correction's training step; the tables and the draw are shared by both (one
    instance each, same seed: the same initial weights)."""

    def __init__(self, correction: str, args, device: torch.device) -> None:
        torch.manual_seed(0)
        self.args, self.device = args, device
        self.users = torch.nn.Embedding(args.users, args.dim).to(device)
        self.items = torch.nn.Embedding(args.items + 1, args.dim).to(device)
        self.optimizer = torch.optim.Adam(
            list(self.users.parameters()) + list(self.items.parameters()), lr=1e-3)
        ranks = np.arange(1, args.items + 1, dtype=np.float64)
        unigram = ranks ** -1.05
        unigram /= unigram.sum()
        self.unigram = torch.tensor(unigram, dtype=torch.float32, device=device)
        self.log_q_table = torch.log(self.unigram)
        self.negative_log_q = torch.full((args.negatives,), -float(np.log(args.items)),
                                         dtype=torch.float32, device=device)
        self.layer = keras_logq.CorrectedRetrieval(correction=correction)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(1)

    def __call__(self) -> None:
        a = self.args
        users = torch.randint(0, a.users, (a.batch,), device=self.device,
                              generator=self.generator)
        positives = torch.multinomial(self.unigram, a.batch, replacement=True,
                                      generator=self.generator)
        negatives = torch.randint(0, a.items, (a.negatives,), device=self.device,
                                  generator=self.generator)
        ids = torch.cat([positives, negatives]) + 1  # 0 is padding
        log_q = torch.cat([self.log_q_table[positives], self.negative_log_q])
        scores = self.users(users) @ self.items(ids).T
        loss = self.layer(scores, candidate_ids=ids, candidate_log_sampling_probability=log_q)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def python_number_tensors(step: Step) -> int:
    """Tensors made from Python numbers by ``torch.as_tensor`` during one step."""
    made, real = [], torch.as_tensor

    def spy(data, *args, **kwargs):
        if isinstance(data, (bool, int, float)):
            made.append(data)
        return real(data, *args, **kwargs)

    torch.as_tensor = spy
    try:
        step()
    finally:
        torch.as_tensor = real
    return len(made)


def blocking_syncs(step: Step):
    """CUDA: the synchronisations `set_sync_debug_mode("warn")` reports in one step; None
    on other devices."""
    if step.device.type != "cuda":
        return None
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--synthetic-items", dest="items", type=int, default=1_000_000)
    p.add_argument("--synthetic-users", dest="users", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--negatives", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=20, help="steps per timed block")
    p.add_argument("--rounds", type=int, default=7, help="timed blocks per correction")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    steps = {c: Step(c, args, device) for c in CORRECTIONS}
    for step in steps.values():  # warm-up: allocator, kernels, Keras's layer build
        for _ in range(3):
            step()
    sync(device)
    found = {c: {"python": python_number_tensors(s), "syncs": blocking_syncs(s)}
             for c, s in steps.items()}
    blocks = {c: [] for c in CORRECTIONS}
    for _ in range(args.rounds):
        for c, step in steps.items():
            sync(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync(device)
            blocks[c].append((time.perf_counter() - start) / args.steps * 1e3)
    name = (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU {platform.processor() or platform.machine()}, "
                 f"{torch.get_num_threads()} threads")
    print(f"device: {name}; torch {torch.__version__}, keras-logq {keras_logq.__version__}")
    print(f"items {args.items:,}, users {args.users:,}, batch {args.batch:,} + "
          f"{args.negatives:,} uniform negatives, d {args.dim}, dense Adam; median of "
          f"{args.rounds} blocks of {args.steps} steps")
    ms = {c: float(np.median(blocks[c])) for c in CORRECTIONS}
    for c in CORRECTIONS:
        syncs = found[c]["syncs"]
        print(f"{c:>10}: {ms[c]:8.3f} ms/step; blocking syncs/step "
              f"{'n/a (not CUDA)' if syncs is None else syncs}; tensors from Python "
              f"numbers/step {found[c]['python']}")
    print(f"corrected / logq-tfrs: {ms['corrected'] / ms['logq-tfrs']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
