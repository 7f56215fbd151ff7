"""The two-tower trainer: a run's settings free of TensorFlow (`TwoTowerConfig`), a run in a
model directory (`train_run`, `load_run`); the public names are listed in `tfrs_logq._api`
(docs/api.md), the modules (``config``, ``loop``, ``training``, ``run``) are implementation."""

from typing import TYPE_CHECKING

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.towers")

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.towers.config import TwoTowerConfig as TwoTowerConfig
    from tfrs_logq.towers.run import load_run as load_run
    from tfrs_logq.towers.run import train_run as train_run
