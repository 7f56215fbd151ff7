#!/usr/bin/env python3
"""Lays the package out as it is installed, for tools that read a package from a
directory tree (import-linter; a pinned snapshot a grid trains from).

``pipelines/`` and ``serving/`` live at the repository's top level and are installed as
``tfrs_logq.pipelines`` and ``tfrs_logq.serving``: pyproject.toml's
``[tool.setuptools.package-dir]`` is the one place that says so, and this script reads it
(at a commit of the current directory's repository with ``--commit``, else from the
work tree this script is in).

``--lab`` lays the lab out beside it (``lab/``: the study and the SASRec grid, run from a
checkout with ``python -m lab``, never installed), where the tree has one: the grid
scripts train from such a snapshot (benchmarks/grid_lib.sh).

    tools/installed_layout.py DEST [--commit COMMIT] [--lab]  # -> DEST/tfrs_logq/..., DEST/lab/...
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAB = "lab"  # the lab's directory and package, at the repository's root


def package_dirs(pyproject: bytes) -> dict[str, str]:
    """``{package: directory}`` of the package-dir table, parents before children."""
    table = tomllib.loads(pyproject.decode())["tool"]["setuptools"]["package-dir"]
    return dict(sorted(table.items(), key=lambda item: item[0].count(".")))


def lay_out(source: str, dest: str, dirs: dict[str, str]) -> None:
    """Copies every mapped package's directory from ``source`` into ``dest`` at its
    import path; a child mapping (``tfrs_logq.pipelines.beam``) lands inside its
    parent's copy, so a mapped directory nested in another is copied once."""
    for package, directory in dirs.items():
        target = os.path.join(dest, *package.split("."))
        if os.path.isdir(target) or not os.path.isdir(os.path.join(source, directory)):
            continue  # copied with its parent (or not in this tree)
        shutil.copytree(os.path.join(source, directory), target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest")
    parser.add_argument("--commit", help="lay out this commit (git archive), not the work tree")
    parser.add_argument("--lab", action="store_true",
                        help="also the lab (lab/, not installed), where the tree has one")
    args = parser.parse_args(argv)
    os.makedirs(args.dest, exist_ok=True)
    lab = {LAB: LAB} if args.lab else {}
    if args.commit is None:
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            dirs = package_dirs(f.read())
        lay_out(ROOT, args.dest, {**dirs, **lab})
        return 0
    try:
        pyproject = subprocess.run(["git", "show", f"{args.commit}:pyproject.toml"],
                                   capture_output=True, check=True).stdout
        dirs = package_dirs(pyproject)
        if lab and subprocess.run(["git", "cat-file", "-e", f"{args.commit}:{LAB}"],
                                  capture_output=True).returncode == 0:
            dirs = {**dirs, **lab}  # a commit from before the lab has none
        roots = sorted({d.split("/")[0] for d in dirs.values()})
        archive = subprocess.run(["git", "archive", args.commit, *roots],
                                 capture_output=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        print(f"installed_layout.py: {args.commit}: {e.stderr.decode().strip()[:300]}",
              file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tree:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        lay_out(tree, args.dest, dirs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
