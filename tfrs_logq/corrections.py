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
A bare ``logq`` names neither standard form and is refused.
"""

from __future__ import annotations

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


def check_loss_name(loss, allowed: tuple, what: str = "loss") -> str:
    """Returns the ``<negatives>-<correction>`` name ``loss`` if it is one of ``allowed``;
    a bare ``<negatives>-logq`` (``inbatch-logq``, ``mns-logq``) is refused with the two
    standard forms, anything else with the list."""
    if isinstance(loss, str) and loss.endswith("-" + AMBIGUOUS):
        negatives = loss[: -len(AMBIGUOUS) - 1]
        raise ValueError(
            f"{what} {loss!r} is ambiguous: use '{negatives}-logq-tfrs' (TFRS's Retrieval: "
            f"the positive's logit corrected too) or '{negatives}-logq-official' (the "
            "paper's code: the positive uncorrected).")
    if loss not in allowed:
        raise ValueError(f"`{what}` must be one of {', '.join(allowed)}; received "
                         f"{str(loss)[:60]!r}.")
    return loss


__all__ = ["AMBIGUOUS", "CORRECTIONS", "STANDARD_FORMS", "check_correction",
           "check_loss_name"]
