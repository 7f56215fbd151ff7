"""The two-tower trainer: a run's settings free of TensorFlow (`TwoTowerConfig`), a run in a
model directory (`train_run`, `load_run`); the public names are listed in `tfrs_logq._api`
(docs/api.md), the modules (``config``, ``loop``, ``training``, ``run``) are implementation."""

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.towers")
