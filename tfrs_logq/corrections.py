"""The names of the logQ corrections, one list for the whole package, free of TensorFlow.

The losses (`tfrs_logq.losses`), the task (`tfrs_logq.tasks.CorrectedRetrieval`), the
two-tower losses (`tfrs_logq.towers.config`), the SASRec objectives
(`tfrs_logq.sasrec.config`) and the studies all take these names, checked here by
`check_correction` (the configuration modules that build the command line's flags import
it without loading TensorFlow).

- ``none``: no correction;
- ``logq-tfrs``: standard logQ as TFRS's ``Retrieval`` computes it, the positive's logit
  corrected too;
- ``logq-official``: standard logQ as the paper's official code computes it, the positive
  uncorrected;
- ``corrected``: the corrected loss of Khrylchenko et al. (RecSys 2025).

Their formulas are written once, in `tfrs_logq.losses`.

Losses are named ``<negatives>-<correction>`` (``inbatch-corrected``, ``mns-logq-tfrs``):
`parse_loss_name` reads such a name, once, into a `LossName`, and is the one check of it
(the two-tower and SASRec configurations and the studies call it where a name comes in); the
trainers take the parsed `LossName` (the two-tower run's spec, the SASRec objectives) and
check it no further.
A bare ``logq`` names neither standard form and is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

CORRECTIONS = ("none", "logq-tfrs", "logq-official", "corrected")
STANDARD_FORMS = ("logq-tfrs", "logq-official")
AMBIGUOUS = "logq"


def check_correction(correction, name: str = "correction",
                     allowed: tuple = CORRECTIONS) -> str:
    """Returns ``correction`` if it is one of ``allowed``, else raises a one-line
    `ValueError` naming ``name``; a bare ``logq`` is refused with the two standard forms.

    >>> check_correction("logq-tfrs")
    'logq-tfrs'
    >>> check_correction("logq")
    Traceback (most recent call last):
    ...
    ValueError: correction 'logq' is ambiguous: use 'logq-tfrs' (TFRS's Retrieval: the positive's logit corrected too) or 'logq-official' (the paper's code: the positive uncorrected).
    """  # noqa: E501
    if correction == AMBIGUOUS:
        raise ValueError(
            f"{name} 'logq' is ambiguous: use 'logq-tfrs' (TFRS's Retrieval: the positive's "
            "logit corrected too) or 'logq-official' (the paper's code: the positive "
            "uncorrected).")
    if correction not in allowed:
        raise ValueError(f"`{name}` must be one of {', '.join(allowed)}; received "
                         f"{str(correction)[:60]!r}.")
    return correction


NEGATIVES = ("inbatch", "mns")
"""Where the negatives of a ``<negatives>-<correction>`` loss come from: the batch's distinct
targets (``inbatch``), or those plus uniform ones (``mns``, mixed negative sampling)."""
LOSS_NAMES = tuple(f"{n}-{c}" for n in NEGATIVES for c in CORRECTIONS)


class LossNameError(ValueError):
    """A loss name refused by `parse_loss_name`: one line; ``problem`` is the message
    without the name of the argument (for a caller that names it its own way)."""

    def __init__(self, message: str, problem: str) -> None:
        super().__init__(message)
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class LossName:
    """A parsed loss name, ``<negatives>-<correction>`` (``mns-logq-tfrs``: negatives
    ``mns``, correction ``logq-tfrs``). A name without a correction (SASRec's ``bce``,
    ``gbce``, ``uniform``, ``full-softmax``) is all ``negatives``, with correction None.
    ``str()`` gives the name back."""

    negatives: str
    correction: Optional[str] = None

    def __str__(self) -> str:
        return self.negatives if self.correction is None else \
            f"{self.negatives}-{self.correction}"


def parse_loss_name(text, allowed: Optional[tuple] = LOSS_NAMES, what: str = "loss") -> LossName:
    """The one parser of loss names, and their one check: ``text`` as a `LossName` if it
    is one of ``allowed`` (None: any name, unchecked, as read back from a record), else a
    one-line `LossNameError` naming ``what``; a bare ``<negatives>-logq`` (``inbatch-logq``)
    is refused with the two standard forms, anything else with the list.

    >>> parse_loss_name("mns-logq-tfrs")
    LossName(negatives='mns', correction='logq-tfrs')
    >>> parse_loss_name("inbatch-logq")
    Traceback (most recent call last):
    ...
    tfrs_logq.corrections.LossNameError: loss 'inbatch-logq' is ambiguous: use 'inbatch-logq-tfrs' (TFRS's Retrieval: the positive's logit corrected too) or 'inbatch-logq-official' (the paper's code: the positive uncorrected).
    """  # noqa: E501
    if allowed is not None:
        if isinstance(text, str) and text.endswith("-" + AMBIGUOUS):
            negatives = text[: -len(AMBIGUOUS) - 1]
            problem = (f"{text!r} is ambiguous: use '{negatives}-logq-tfrs' (TFRS's Retrieval: "
                       f"the positive's logit corrected too) or '{negatives}-logq-official' "
                       "(the paper's code: the positive uncorrected).")
            raise LossNameError(f"{what} {problem}", problem)
        if text not in allowed:
            problem = f"must be one of {', '.join(allowed)}; received {str(text)[:60]!r}."
            raise LossNameError(f"`{what}` {problem}", problem)
    negatives, _, correction = str(text).partition("-")
    if correction in CORRECTIONS:
        return LossName(negatives, correction)
    return LossName(str(text))


__all__ = ["AMBIGUOUS", "CORRECTIONS", "LOSS_NAMES", "NEGATIVES", "STANDARD_FORMS",
           "LossName", "LossNameError", "check_correction", "parse_loss_name"]
