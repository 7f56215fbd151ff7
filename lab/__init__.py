"""The lab: the experiments behind the project's findings, beside the library and not
installed with it (pyproject.toml lists only ``tfrs_logq``'s packages). Run it from a
checkout, with the repository's root on the path: ``python -m lab experiment ...``.

- `experiment`: the SASRec grid of datasets x splits x losses x seeds, as the paper's
  Table 1 (docs/sasrec.md).
- `cli`: the command, on the flags machinery of `tfrs_logq.cli`.

The lab imports the library; the library never imports the lab (an import-linter
contract in pyproject.toml, checked by ``make lint`` and tests/test_layering.py).
"""
