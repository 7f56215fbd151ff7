"""Export, model server and client (importable as ``tfrs_logq.serving``). Not built yet."""
