"""The data layer (installed as ``tfrs_logq.pipelines``): a user's log (`load_user_log`,
`load_user_log_split`), the built-in datasets (`load_dataset`, `load_split`), splits, the
tf.data pipelines, the synthetic stream, vocabularies and id normalisation; ``beam`` is the
batch pipeline. The public names are listed in `tfrs_logq._api` (docs/api.md)."""

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.pipelines")
