"""Requests in flight, counted per protocol, so a shutdown can drain them and say so.

A request is in flight from the moment its front end has it (REST: the request line
and headers arrived; gRPC: the call reached a worker) until its reply is handed back.
"""

from __future__ import annotations

import contextlib
import threading


class _Request:
    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut = False  # set by a front end whose client can no longer get the reply


class InFlight:
    """A thread-safe count of one protocol's requests in flight, and, since `mark` (a
    shutdown's start), of those that finished (``drained``) or were cut (``cut``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.drained = 0
        self.cut = 0
        self._marked = False

    @contextlib.contextmanager
    def track(self):
        """Counts the block as one request; cancelled (``BaseException``) or flagged
        ``.cut`` by the caller, it counts as cut, else as answered."""
        request = _Request()
        with self._lock:
            self.now += 1
        try:
            yield request
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled: the drain timed out
                request.cut = True
            raise
        finally:
            with self._lock:
                self.now -= 1
                if self._marked:
                    if request.cut:
                        self.cut += 1
                    else:
                        self.drained += 1

    def mark(self) -> int:
        """Starts counting finished requests; returns how many are in flight now."""
        with self._lock:
            self._marked = True
            self.drained = self.cut = 0
            return self.now


__all__ = ["InFlight"]
