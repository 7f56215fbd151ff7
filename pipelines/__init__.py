"""Data pipelines (importable as ``tfrs_logq.pipelines``).

Modules: ``synthetic``, ``datasets``, ``interactions``, ``splits``, ``sequential``.
"""
