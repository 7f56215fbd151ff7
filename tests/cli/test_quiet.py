"""TensorFlow's start-up lines: absent without --verbose, on TF 2.20 and on TF 2.21.

TF 2.21 writes them through absl before ``TF_CPP_MIN_LOG_LEVEL`` is read; the old CLI,
which only set that variable, printed ``port.cc`` (oneDNN) and ``cudart_stub.cc`` lines
on every command there. `tfrs_logq.cli._quiet` filters them at tensorflow's import.
"""

import os
import subprocess
import sys

import pytest

from tfrs_logq.cli._quiet import filter_log, filtered_stderr

TF221 = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795690630.583837   10709 port.cc:153] oneDNN custom operations are on.
I0000 00:00:1795690630.584129   10709 cudart_stub.cc:31] Could not find cuda drivers.
I0000 00:00:1795690630.848275   10709 cpu_feature_guard.cc:227] This TensorFlow binary is
To enable the following instructions: AVX2 AVX512F, in other operations, rebuild.
W0000 00:00:1795690630.9   10709 some_op.cc:12] a warning
/x/y.py:3: DeprecationWarning: a Python warning
  import imp
"""
TF220 = """\
2026-11-26 10:57:01.270915: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:31] Could not.
2026-11-26 10:57:01.275814: I tensorflow/core/util/port.cc:153] oneDNN custom operations.
2026-11-26 10:57:01.380381: E tensorflow/core/x.cc:210] an error
"""


def test_filter_log_drops_records_below_the_level_and_their_continuations():
    assert filter_log(TF221, 3) == ("/x/y.py:3: DeprecationWarning: a Python warning\n"
                                    "  import imp\n")
    assert filter_log(TF221, 1).splitlines()[0].startswith("W0000")
    assert filter_log(TF221, 0) == TF221
    assert filter_log(TF220, 2) == TF220.splitlines(keepends=True)[2]  # the E record
    assert filter_log(TF220, 3) == ""
    assert filter_log("Traceback (most recent call last):\n", 3) == (
        "Traceback (most recent call last):\n")


def test_filtered_stderr_keeps_what_is_not_a_log_record(capfd):
    with filtered_stderr(3):
        os.write(2, b"not a log line\n" + TF220.encode())
        print("from Python", file=sys.stderr)
    assert sorted(capfd.readouterr().err.splitlines()) == ["from Python", "not a log line"]


# ------------------------------------------------ the command, in a fresh process


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, **extra}


def _run(args, **env):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          env=_env(**env))


@pytest.fixture(scope="module")
def start_up_lines():
    """What a bare `import tensorflow` prints on this host (none: the test is skipped)."""
    proc = _run(["-c", "import tensorflow"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line.split("] ", 1)[1] for line in proc.stderr.splitlines()
             if "] " in line and ("port.cc" in line or "cudart_stub" in line
                                  or "cpu_feature_guard" in line)]
    if not lines:
        pytest.skip("this TensorFlow prints no start-up lines here")
    return sorted(set(lines))


def _diagnose_nothing(tmp_path, *flags, **env):
    """`diagnose` of a run that does not exist: imports TensorFlow, then one error line."""
    return _run(["-m", "tfrs_logq.cli", "diagnose", "--model-dir", str(tmp_path / "none"),
                 *flags], **env)


def test_no_start_up_lines_without_verbose(tmp_path, start_up_lines):
    proc = _diagnose_nothing(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.splitlines()[0]], proc.stderr
    assert proc.stderr.startswith("tfrs-logq: error: --model-dir "), proc.stderr
    assert "absl::InitializeLog" not in proc.stderr


def test_start_up_lines_with_verbose_or_the_users_own_level(tmp_path, start_up_lines):
    for proc in (_diagnose_nothing(tmp_path, "--verbose"),
                 _diagnose_nothing(tmp_path, TF_CPP_MIN_LOG_LEVEL="0")):
        assert proc.returncode == 2
        for line in start_up_lines:
            assert line in proc.stderr
