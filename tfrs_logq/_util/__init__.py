"""Plumbing the rest of the package shares: atomic writes, the cache directory, file
and source fingerprints, exact-resume checkpoints of custom loops, a description of the
machine. Private: no stable API."""
