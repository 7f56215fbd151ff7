"""``tfrs-logq study``: the large-catalog study on the synthetic stream (issue 26).

Its flags and handler live beside the study (`tfrs_logq.study.populate_parser`, which
sets ``run``); this module only attaches them.
"""

from __future__ import annotations


def populate(parser) -> None:
    from tfrs_logq.study import populate_parser

    populate_parser(parser)
