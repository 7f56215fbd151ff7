"""Server-side batching: concurrent requests to one signature run as one model call.

As TF Serving's ``BasicBatchScheduler``: a queue per (signature, history dtype, scalar
options); a worker takes the first request, waits at most ``batch_timeout_micros`` for
more (up to ``max_batch_size`` rows), left-pads the histories to one width, calls the
model once and hands each request its rows (``k`` cut per request). A batch is run
with the largest ``k`` of its requests, so it also stops growing before its rows times
that ``k`` would pass ``max_batch_rows_times_k``: a request that asks for many results
never makes the small ones beside it compute as many. Every wait is bounded: a
request gets its result, or DEADLINE_EXCEEDED after ``request_timeout_in_ms``; a
worker that dies fails its queue at once (UNAVAILABLE) and the next request starts a
new one.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from typing import Callable, Optional

import numpy as np

from tfrs_logq.serving.errors import ServingError, as_serving_error

log = logging.getLogger("tfrs_logq.serving")


class Batcher:
    """Batches calls of ``call(signature_name, inputs) -> outputs``.

    Args:
        call: the unbatched model call.
        max_batch_size: int. Most rows in one batch (1 turns batching off).
        batch_timeout_micros: int. Longest a batch waits for more requests.
        request_timeout_in_ms: int. Longest a request waits for its result.
        max_batch_rows_times_k: int or None. Most rows x (largest k) in one model call
            (a single request larger than it still runs alone). Defaults to no bound.
        observe: ``observe(signature_name, rows, queue_waits_s)`` or None. Told of each
            batch run: its rows and how long each of its requests waited in the queue.
    """

    def __init__(self, call: Callable[[str, dict], dict], max_batch_size: int,
                 batch_timeout_micros: int, request_timeout_in_ms: int,
                 max_batch_rows_times_k: Optional[int] = None,
                 observe: Optional[Callable[[str, int, list], None]] = None) -> None:
        self._call = call
        self._observe = observe
        self.max_batch_size = max_batch_size
        self.max_batch_rows_times_k = max_batch_rows_times_k
        self.batch_timeout_s = batch_timeout_micros / 1e6
        self.request_timeout_s = request_timeout_in_ms / 1000
        self._queues: dict = {}
        self._lock = threading.Lock()
        self._stop = False

    def run(self, name: str, inputs: dict, k: int = 1) -> dict:
        """Runs a checked request, batched with concurrent ones of the same kind; ``k``:
        the results a row of it asks for (its cost in a batch)."""
        history = inputs.get("history")
        if history is None or self.max_batch_size <= 1:
            return self._call(name, inputs)
        # Requests batch together only when their scalar options agree.
        scalars = tuple(sorted((k, bool(v)) for k, v in inputs.items() if k == "exclude_history"))
        key = (name, history.dtype.kind, scalars)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if key not in self._queues:
                q: queue.Queue = queue.Queue()
                self._queues[key] = q
                threading.Thread(target=self._batch_loop, args=(name, q), daemon=True,
                                 name=f"tfrs-logq-batch-{name}").start()
            self._queues[key].put((inputs, future, k, time.monotonic()))
        try:
            return future.result(timeout=self.request_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()  # a batch that picks it up later skips it
            raise ServingError("DEADLINE_EXCEEDED",
                               f"no result within {self.request_timeout_s:g} s "
                               "(request_timeout_in_ms); the server is overloaded or its "
                               "batch worker failed") from None

    def _batch_loop(self, name: str, q: queue.Queue) -> None:
        """Runs batches until closed; whatever happens, no request is left waiting: on
        exit the queue is retired and its requests are failed."""
        try:
            self._batch_loop_body(name, q)
        except Exception:  # noqa: BLE001  (logged; its requests fail below)
            log.exception("the batch worker of signature %r stopped", name)
        finally:
            with self._lock:
                for key, queue_ in list(self._queues.items()):
                    if queue_ is q:
                        del self._queues[key]  # the next request starts a new worker
            _fail_pending(q, ServingError("UNAVAILABLE", "the model version is unloading"
                                          if self._stop else "the batch worker stopped"))

    def _fits(self, rows: int, k: int) -> bool:
        return rows <= self.max_batch_size and (self.max_batch_rows_times_k is None or
                                                rows * k <= self.max_batch_rows_times_k)

    def _batch_loop_body(self, name: str, q: queue.Queue) -> None:
        held = None  # a request that did not fit the last batch: it starts the next one
        while not self._stop:
            if held is not None:
                first, held = held, None
            else:
                try:
                    first = q.get(timeout=0.5)
                except queue.Empty:
                    continue
            batch = [first]
            rows, k = first[0]["history"].shape[0], first[2]
            deadline = time.monotonic() + self.batch_timeout_s
            while rows < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = q.get(timeout=remaining)
                except queue.Empty:
                    break
                more, item_k = rows + item[0]["history"].shape[0], max(k, item[2])
                if not self._fits(more, item_k):
                    held = item
                    break
                batch.append(item)
                rows, k = more, item_k
            self._run_batch(name, batch)
        if held is not None:
            q.put(held)  # failed with the rest of the queue

    def _run_batch(self, name: str, batch: list) -> None:
        started = time.monotonic()
        batch = [(inputs, f, started - queued) for inputs, f, _, queued in batch
                 if f.set_running_or_notify_cancel()]
        waits = [wait for *_, wait in batch]
        batch = [(inputs, f) for inputs, f, _ in batch]
        if not batch:
            return
        if self._observe is not None:
            try:
                self._observe(name, sum(inputs["history"].shape[0] for inputs, _ in batch),
                              waits)
            except Exception:  # noqa: BLE001  (counting must never fail a request)
                log.exception("recording a batch of %r failed", name)
        try:
            width = max(inputs["history"].shape[1] for inputs, _ in batch)
            pad = b"" if batch[0][0]["history"].dtype.kind in ("S", "O") else 0
            histories = [np.pad(inputs["history"], ((0, 0), (width - inputs["history"].shape[1],
                                                             0)), constant_values=pad)
                         for inputs, _ in batch]
            merged = {"history": np.concatenate(histories, axis=0)}
            ks = [int(inputs["k"]) for inputs, _ in batch if "k" in inputs]
            if ks:
                merged["k"] = np.int32(max(ks))
            if "exclude_history" in batch[0][0]:
                merged["exclude_history"] = batch[0][0]["exclude_history"]
            outputs = self._call(name, merged)
            start = 0
            for inputs, future in batch:
                n = inputs["history"].shape[0]
                k = int(inputs["k"]) if "k" in inputs else None
                part = {}
                for key, value in outputs.items():
                    value = value[start:start + n]
                    if k is not None and value.ndim == 2 and key in ("item_ids", "scores"):
                        value = value[:, :k]
                    part[key] = value
                future.set_result(part)
                start += n
        except Exception as exc:  # every waiter learns the outcome
            for _, future in batch:
                if not future.done():
                    future.set_exception(as_serving_error(exc))

    def close(self) -> None:
        """Stops the workers (within 0.5 s); requests still queued fail UNAVAILABLE."""
        self._stop = True


def _fail_pending(q: queue.Queue, error: Exception) -> None:
    while True:
        try:
            _, future, *_ = q.get_nowait()
        except queue.Empty:
            return
        if future.set_running_or_notify_cancel():
            future.set_exception(error)


__all__ = ["Batcher"]
