"""`tfrs_logq.pipelines.item_statistics` under its earlier name (the reader needs no Beam, so it
lives in the data layer, where training may import it). This name is that same
module object: attributes set on one are set on the other."""

import sys

from tfrs_logq.pipelines import item_statistics as _module

sys.modules[__name__] = _module
