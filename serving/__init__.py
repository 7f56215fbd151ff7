"""Export, model server and client (installed as ``tfrs_logq.serving``): `export_version`
writes a SavedModel version, `ModelServer` serves TF Serving's REST and gRPC APIs,
`make_request` / `ranks_through_server` / `evaluate_through_server` are the client side.
The public names are listed in `tfrs_logq._api` (docs/api.md); the modules behind them
(``options``, ``manager``, ``servable``, ``inputs``, ``batching``, ``grpc_service``,
``rest_api``, ``http_server``, ``errors``, ``drain``) are implementation."""

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.serving")
