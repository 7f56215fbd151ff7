"""Data pipelines (importable as ``tfrs_logq.pipelines``): ``synthetic``, ``datasets``, ``interactions``, ``splits``, ``sequential``."""
