"""Export, model server and client (importable as ``tfrs_logq.serving``).

Modules: ``export`` (SavedModel versions), ``server`` (`ModelServer`, which composes
``options``, ``manager``, ``servable``, ``inputs``, ``batching``, ``grpc_service``,
``rest_api``, ``http_server``, ``errors``, ``drain``), ``client`` (TF Serving requests,
ranks through a server) and ``evaluation`` (Recall/NDCG through a server beside the
exact figures).
"""
