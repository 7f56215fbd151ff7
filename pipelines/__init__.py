"""The data layer (installed as ``tfrs_logq.pipelines``): a user's log (`load_user_log`,
`load_user_log_split`), the built-in datasets (`load_dataset`, `load_split`), splits, the
tf.data pipelines, the synthetic stream, vocabularies and id normalisation; ``beam`` is the
batch pipeline. The public names are listed in `tfrs_logq._api` (docs/api.md)."""

from typing import TYPE_CHECKING

from tfrs_logq import _api

__all__, __getattr__, __dir__ = _api.exports("tfrs_logq.pipelines")

# The public names for static tools (mypy, pyright, IDEs); at run time they load on
# first use, through __getattr__.
if TYPE_CHECKING:  # written by tools/api_page.py from tfrs_logq/_api.py
    from tfrs_logq.pipelines.datasets import load_dataset as load_dataset
    from tfrs_logq.pipelines.datasets import load_split as load_split
    from tfrs_logq.pipelines.ids import normalize_id as normalize_id
    from tfrs_logq.pipelines.sequential import evaluation_arrays as evaluation_arrays
    from tfrs_logq.pipelines.sequential import training_dataset as training_dataset
    from tfrs_logq.pipelines.splits import Split as Split
    from tfrs_logq.pipelines.splits import data_stats as data_stats
    from tfrs_logq.pipelines.splits import gsasrec_split as gsasrec_split
    from tfrs_logq.pipelines.splits import leave_one_out as leave_one_out
    from tfrs_logq.pipelines.splits import temporal_split as temporal_split
    from tfrs_logq.pipelines.synthetic import SyntheticConfig as SyntheticConfig
    from tfrs_logq.pipelines.synthetic import SyntheticStream as SyntheticStream
    from tfrs_logq.pipelines.user_log import UserLogSource as UserLogSource
    from tfrs_logq.pipelines.user_log import load_user_log as load_user_log
    from tfrs_logq.pipelines.user_log import load_user_log_split as load_user_log_split
    from tfrs_logq.pipelines.vocabulary import Vocabulary as Vocabulary
    from tfrs_logq.pipelines.vocabulary import load_vocabularies as load_vocabularies
    from tfrs_logq.pipelines.vocabulary import save_vocabularies as save_vocabularies
