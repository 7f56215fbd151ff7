"""Export, model server and client (importable as ``tfrs_logq.serving``): ``export``, ``server``, ``client``."""
