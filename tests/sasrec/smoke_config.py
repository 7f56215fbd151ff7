"""The smoke preset as the SASRec training tests run it: `smoke_config`."""

from tfrs_logq.sasrec.training import resolve_config


def smoke_config(**overrides):
    """``resolve_config("smoke", split="loo", length_buckets=1, **overrides)``.

    One length bucket: the preset's 8 make every `train` trace 8 copies of the blocks
    (about 5 s of a 7 s run of 2 steps on a 2-core AMD EPYC). Buckets change the speed
    only, which test_length_buckets_train_the_same_model checks with its own buckets.
    """
    return resolve_config("smoke", **{"split": "loo", "length_buckets": 1, **overrides})
