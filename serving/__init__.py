"""Export, model server and client (importable as ``tfrs_logq.serving``).

Modules: ``export``, ``server``, ``client``.
"""
