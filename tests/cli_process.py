"""`tfrs_logq.cli.main` run in the test's process, reported as a process would be: an
interpreter importing TensorFlow costs about 7 s of the suite."""

import re
import subprocess


def cli_in_process(capsys, *args, main=None) -> subprocess.CompletedProcess:
    """``main(args)`` here (`tfrs_logq.cli.main` unless given, e.g. ``lab.cli.main``): the
    exit code (argparse's `SystemExit` too), stdout, stderr."""
    if main is None:
        from tfrs_logq.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def entries(help_text):
    """``{flag: its help entry}`` of a command's help (one entry per flag shown): argparse's
    (the command tree) or tyro's, whose groups are boxes."""
    found, flag = {}, None
    for line in help_text.splitlines():
        if not line.startswith(("  ", "│")):  # a group's title or border, a usage line
            continue
        line = re.sub(r"^│ ?|^  |\s*│$", "", line)
        if not line.strip("-─ "):  # a rule under a group's description
            continue
        match = re.match(r"(-[\w-]+)", line)
        if match:
            flag = match.group(1)
        if flag and line.strip():
            found[flag] = found.get(flag, "") + " " + line.strip()
    return found
