"""Export, model server and client (installed as ``tfrs_logq.serving``): `export_version`
writes a SavedModel version, `ModelServer` serves TF Serving's REST and gRPC APIs,
`make_request` / `ranks_through_server` / `evaluate_through_server` are the client side.
The public names are listed in `tfrs_logq._api` (docs/api.md); the modules behind them
(``options``, ``manager``, ``servable``, ``inputs``, ``batching``, ``grpc_service``,
``rest_api``, ``http_server``, ``errors``, ``drain``) are implementation."""

from typing import TYPE_CHECKING

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.serving")

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.serving.client import make_request as make_request
    from tfrs_logq.serving.client import ranks_through_server as ranks_through_server
    from tfrs_logq.serving.evaluation import evaluate_through_server as evaluate_through_server
    from tfrs_logq.serving.export import export_version as export_version
    from tfrs_logq.serving.export import load_run_split as load_run_split
    from tfrs_logq.serving.export import load_trained as load_trained
    from tfrs_logq.serving.options import ServerOptions as ServerOptions
    from tfrs_logq.serving.server import ModelServer as ModelServer
