"""Specification of `tfrs_logq.corrections`: the correction names and the one parser and
check of ``<negatives>-<correction>`` loss names."""

import subprocess
import sys

import pytest

from tfrs_logq.corrections import (
    CORRECTIONS,
    LOSS_NAMES,
    NEGATIVES,
    LossName,
    LossNameError,
    parse_loss_name,
)


@pytest.mark.parametrize("negatives", NEGATIVES)
@pytest.mark.parametrize("correction", CORRECTIONS)
def test_every_loss_name_parses_into_its_two_parts_and_back(negatives, correction):
    text = f"{negatives}-{correction}"
    assert text in LOSS_NAMES
    parsed = parse_loss_name(text)
    assert parsed == LossName(negatives, correction)
    assert str(parsed) == text
    with pytest.raises(AttributeError):  # frozen
        parsed.correction = "none"


def test_names_without_a_correction_are_whole():
    sasrec = ("bce", "gbce", "uniform", "full-softmax", *LOSS_NAMES)
    for name in ("bce", "gbce", "uniform", "full-softmax"):
        parsed = parse_loss_name(name, sasrec)
        assert parsed == LossName(name, None) and str(parsed) == name
    # Unchecked (allowed=None), as a name read back from a record.
    assert parse_loss_name("mns-logq-official", None) == LossName("mns", "logq-official")


@pytest.mark.parametrize("text, message, problem", [
    ("inbatch-logq", "loss 'inbatch-logq' is ambiguous: use 'inbatch-logq-tfrs' (TFRS's "
     "Retrieval: the positive's logit corrected too) or 'inbatch-logq-official' (the "
     "paper's code: the positive uncorrected).", "'inbatch-logq' is ambiguous: use "),
    ("gbce", "`loss` must be one of " + ", ".join(LOSS_NAMES) + "; received 'gbce'.",
     "must be one of inbatch-none, "),
    (3, "`loss` must be one of " + ", ".join(LOSS_NAMES) + "; received '3'.",
     "must be one of inbatch-none, "),
])
def test_bad_names_are_one_line_errors_with_the_problem_apart(text, message, problem):
    with pytest.raises(LossNameError) as error:
        parse_loss_name(text)
    assert str(error.value) == message and "\n" not in message
    assert error.value.problem.startswith(problem) and message.endswith(error.value.problem)
    assert isinstance(error.value, ValueError)
    with pytest.raises(LossNameError, match="^`objective` must be one of mns-none; received"):
        parse_loss_name("inbatch-none", ("mns-none",), what="objective")


def test_the_module_imports_no_tensorflow():
    code = "import sys, tfrs_logq.corrections; print('tensorflow' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr
