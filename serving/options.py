"""`ServerOptions`: the model server's settings, named after TF Serving's flags.

`tfrs-logq serve` builds one flag per field (``--port``, ``--rest_api_port``, ...), so the
checks live here, where the Python API gets them too: a servable name as ``export``
takes it, ports in 0-65535, positive thread counts, sizes and timeouts.
"""

from __future__ import annotations

import dataclasses

MAX_PORT = 65535


@dataclasses.dataclass
class ServerOptions:
    """The model server's settings, named after TF Serving's flags, each checked when made.

    Args:
        model_name: str. The servable's name (as ``export`` takes it: letters, digits,
            ``._-``).
        model_base_path: str. The directory of integer versions.
        port: int. gRPC port, 0 to 65535 (0 picks a free one). Defaults to 8500.
        rest_api_port: int. REST port, 0 to 65535. Defaults to 8501.
        max_request_rows: int. Most rows (histories) in one request. Defaults to 1,024.
        max_rows_times_k: int. Most results one request may ask for: rows x k (``k`` of
            ``top_k``, the export's ``default_k`` for ``serving_default``), and most in
            one batched model call. Defaults to 262,144 (1,024 rows x 256).
        max_request_bytes: int. Largest request (REST body, gRPC message). 16 MiB.
        max_response_bytes: int. Largest reply (REST body, gRPC message). 64 MiB.
        drain_timeout_in_ms: int. On SIGTERM/SIGINT (or `ModelServer.stop`), how long
            the shutdown may take: the grace, then requests in flight finishing before
            they are cut. Defaults to 30 s.
        drain_grace_in_ms: int. The first part of the drain: readiness fails (``/readyz``
            503, the version ``UNLOADING``) and every REST reply says ``Connection:
            close``, while both ports still accept, so a request sent before the signal
            is never refused or reset. Then the ports close. Defaults to 1 s (within
            ``drain_timeout_in_ms``).
        (the others as their comments say)
    """

    model_name: str
    model_base_path: str
    port: int = 8500
    rest_api_port: int = 8501
    host: str = "127.0.0.1"
    file_system_poll_wait_seconds: float = 1.0
    max_batch_size: int = 256
    batch_timeout_micros: int = 500
    max_request_rows: int = 1024
    max_rows_times_k: int = 262_144  # results in one request, and in one batch
    max_request_bytes: int = 16 * 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    num_threads: int = 16  # gRPC workers
    rest_api_num_threads: int = 32  # REST workers (requests run at once)
    rest_api_timeout_in_ms: int = 30_000  # longest a REST client may take to send a request
    request_timeout_in_ms: int = 60_000  # longest a request waits for its batch's result
    drain_timeout_in_ms: int = 30_000  # graceful shutdown: longest it takes, grace included
    drain_grace_in_ms: int = 1_000  # readiness fails, ports still open, then they close

    def __post_init__(self) -> None:
        from tfrs_logq.serving.export import check_model_name  # the rule export applies

        check_model_name(self.model_name)
        for name in ("port", "rest_api_port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or \
                    not 0 <= value <= MAX_PORT:
                raise ValueError(f"--{name} {value!r} is not a port: give 0 to {MAX_PORT} "
                                 "(0 picks a free one)")
        for name in ("num_threads", "rest_api_num_threads", "rest_api_timeout_in_ms",
                     "request_timeout_in_ms", "max_request_rows", "max_request_bytes",
                     "max_rows_times_k", "max_response_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        for name in ("drain_timeout_in_ms", "drain_grace_in_ms", "batch_timeout_micros",
                     "file_system_poll_wait_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be at least 0, got {getattr(self, name)}")


__all__ = ["MAX_PORT", "ServerOptions"]
