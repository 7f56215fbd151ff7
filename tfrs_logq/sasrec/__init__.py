"""SASRec with every loss of the paper: its configuration (`TrainConfig`, `resolve_config`),
model (`SASRecEncoder`, `SequentialRetrievalModel`) and resumable trainer (`train`); the
public names are listed in `tfrs_logq._api` (docs/api.md), the modules are implementation.

    from tfrs_logq.sasrec import resolve_config, train
    train(resolve_config("cpu", loss="inbatch-corrected"), "runs/a")
"""

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.sasrec")
