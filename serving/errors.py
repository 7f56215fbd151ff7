"""Errors and their status codes on both protocols, in one place.

TF Serving keeps this in ``model_servers/grpc_status_util`` and the REST handler's
``ToHTTPStatusCode``: a request fails with one canonical status (a gRPC code name),
and each front end maps it to its own wire form. `STATUS` is that table here:

>>> ServingError("NOT_FOUND", "no such model").http_status
404
"""

from __future__ import annotations

# canonical code -> HTTP status (REST); the gRPC status has the same name.
STATUS = {
    "INVALID_ARGUMENT": 400,
    "FAILED_PRECONDITION": 400,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,  # REST only (gRPC has no methods to refuse)
    "REQUEST_TIMEOUT": 408,  # REST only: the client did not send its request in time
    "RESOURCE_EXHAUSTED": 413,
    "NOT_IMPLEMENTED": 501,  # REST only: an HTTP method this server does not know
    "UNAVAILABLE": 503,
    "DEADLINE_EXCEEDED": 504,
    "INTERNAL": 500,
}


class ServingError(Exception):
    """A request's failure: ``code`` is a canonical status name (a key of `STATUS`).

    Args:
        code: str. ``"INVALID_ARGUMENT"``, ``"NOT_FOUND"``, ... (a key of `STATUS`).
        message: str. What was wrong, for the client.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def http_status(self) -> int:
        """The REST status: `STATUS[code]`, 500 for a code not in the table."""
        return STATUS.get(self.code, 500)

    @property
    def grpc_status(self):
        """The ``grpc.StatusCode`` of the same name (INTERNAL where gRPC has none)."""
        import grpc

        return getattr(grpc.StatusCode, self.code, grpc.StatusCode.INTERNAL)


ECHO_LIMIT = 64  # characters of a client's string (a model name, a path) echoed in an error


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as an error may echo it: its repr, cut to ``limit`` characters, saying how
    long it was (a 100 KB model name is not sent back).

    >>> shorten("ml")
    "'ml'"
    >>> shorten("x" * 100_000, 8)
    "'xxxxxxxx...' (100000 characters)"
    """
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    head = repr(text[:limit])
    return f"{head[:-1]}...{head[-1]} ({len(text)} characters)"


def as_serving_error(exc: BaseException) -> ServingError:
    """``exc`` itself when it is a `ServingError`, else INTERNAL with its text."""
    if isinstance(exc, ServingError):
        return exc
    return ServingError("INTERNAL", f"internal error: {type(exc).__name__}: {exc}")


__all__ = ["ECHO_LIMIT", "STATUS", "ServingError", "as_serving_error", "shorten"]
