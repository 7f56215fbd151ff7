"""Plumbing the rest of the package shares: atomic writes, the cache directory, file
and source fingerprints, exact-resume checkpoints of custom loops, a description of the
machine, the count-min sketch's hashes in numpy. Private: no stable API."""
