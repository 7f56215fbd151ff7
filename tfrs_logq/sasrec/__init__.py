"""SASRec with every loss of the paper: its configuration (`TrainConfig`, `resolve_config`),
model (`SASRecEncoder`, `SequentialRetrievalModel`) and resumable trainer (`train`); the
public names are listed in `tfrs_logq._api` (docs/api.md), the modules are implementation.

    from tfrs_logq.sasrec import resolve_config, train
    train(resolve_config("cpu", loss="inbatch-corrected"), "runs/a")
"""

from typing import TYPE_CHECKING

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.sasrec")

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.sasrec.config import TrainConfig as TrainConfig
    from tfrs_logq.sasrec.config import resolve_config as resolve_config
    from tfrs_logq.sasrec.models import SASRecEncoder as SASRecEncoder
    from tfrs_logq.sasrec.models import SequentialRetrievalModel as SequentialRetrievalModel
    from tfrs_logq.sasrec.training import train as train
