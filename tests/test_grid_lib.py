"""`benchmarks/grid_lib.sh`, what the grid scripts share, in a temporary git repository:
the pinned commit, the snapshot of the code at it, one commit of the results after a
run, and `fixed_grid.sh` end to end with a stand-in Python (no training)."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "benchmarks", "grid_lib.sh")

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None,
                                reason="needs git and bash")


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository with the package's three code directories, committed twice (the
    first commit's code says "v1", the second's "v2", which adds the lab, lab/) and then
    edited, uncommitted."""
    repo = tmp_path / "repo"
    for d in ("tfrs_logq", "pipelines", "serving", "benchmarks", "results"):
        (repo / d).mkdir(parents=True)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    with open(os.path.join(ROOT, "pyproject.toml")) as f:  # its package-dir mapping
        (repo / "pyproject.toml").write_text(f.read())
    for version in ("v1", "v2"):
        for d in ("tfrs_logq", "pipelines", "serving"):
            (repo / d / "__init__.py").write_text(f"VERSION = {version!r}\n")
        if version == "v2":
            (repo / "lab").mkdir()
            (repo / "lab" / "__init__.py").write_text(f"VERSION = {version!r}\n")
            (repo / "lab" / "__main__.py").write_text("import lab\nprint('lab', lab.VERSION)\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", version)
    for d in ("tfrs_logq", "pipelines", "serving"):
        (repo / d / "__init__.py").write_text("VERSION = 'work tree'\n")
    return repo


def _lib(repo, script, env=None):
    """Runs ``script`` in bash in ``repo`` with grid_lib.sh sourced."""
    full = {k: v for k, v in os.environ.items() if k not in ("PIN", "COMMIT", "OUT")}
    full.update({"GRID_NAME": "test_grid", "GRID_RETRY_SECONDS": "0", **(env or {})})
    return subprocess.run(["bash", "-c", f'set -u -o pipefail; . "{LIB}"; {script}'],
                          cwd=repo, env=full, capture_output=True, text=True, timeout=60)


def test_sourcing_the_library_runs_nothing(repo):
    result = _lib(repo, "true")
    assert result.returncode == 0 and result.stdout == result.stderr == ""


def test_the_first_run_pins_head_and_later_runs_read_it(repo):
    head = _git(repo, "rev-parse", "HEAD")
    first = _git(repo, "rev-parse", "HEAD~1")
    result = _lib(repo, 'grid_pin results/g && echo "$PIN"')
    assert result.returncode == 0 and result.stdout.strip() == head
    assert (repo / "results" / "g" / "code_commit").read_text().strip() == head
    _git(repo, "commit", "-q", "--allow-empty", "-m", "later")  # HEAD moves on
    assert _lib(repo, 'grid_pin results/g && echo "$PIN"').stdout.strip() == head
    # PIN=<commit> starts a new grid at that commit.
    result = _lib(repo, 'grid_pin results/g && echo "$PIN"', {"PIN": first})
    assert result.stdout.strip() == first
    assert (repo / "results" / "g" / "code_commit").read_text().strip() == first
    result = _lib(repo, "grid_pin results/g", {"PIN": "0" * 40})
    assert result.returncode == 2 and f"pinned commit {'0' * 40} not found" in result.stderr


def test_the_snapshot_is_the_pinned_code_laid_out_as_installed(repo, tmp_path):
    first = _git(repo, "rev-parse", "HEAD~1")
    snap = tmp_path / "snap"
    snap.mkdir()
    script = (f'PY="{sys.executable}"; grid_snapshot {first} "{snap}" && '
              f'grid_python "{snap}" -c "import tfrs_logq, tfrs_logq.pipelines, '
              'tfrs_logq.serving, os; print(tfrs_logq.VERSION, tfrs_logq.pipelines.VERSION, '
              'tfrs_logq.serving.VERSION, os.getcwd())"')
    result = _lib(repo, script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["v1", "v1", "v1", str(snap)]  # not the work tree's
    assert sorted(os.listdir(snap)) == ["tfrs_logq"]
    missing = _lib(repo, f'grid_snapshot {"0" * 40} "{tmp_path}"')
    assert missing.returncode != 0 and f"no snapshot of {'0' * 40}" in missing.stderr


def test_the_snapshot_holds_the_lab_where_the_commit_has_one(repo, tmp_path):
    """The lab (lab/, not installed) runs from the snapshot as ``python -m lab``; a pin from
    before the lab left the package runs its commands as ``-m tfrs_logq.cli``."""
    for commit, module in (("HEAD", "lab"), ("HEAD~1", "tfrs_logq.cli")):
        snap = tmp_path / commit
        snap.mkdir()
        result = _lib(repo, f'PY="{sys.executable}"; grid_snapshot {commit} "{snap}" && '
                            f'grid_lab "{snap}"')
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == [module]
        assert sorted(os.listdir(snap)) == sorted({"tfrs_logq", module.split(".")[0]})
    result = _lib(repo, f'PY="{sys.executable}"; grid_python "{tmp_path / "HEAD"}" -m lab')
    assert result.returncode == 0 and result.stdout.split() == ["lab", "v2"], result.stderr


def test_check_out_accepts_results_name_only(repo):
    assert _lib(repo, "grid_check_out results/a results/b").returncode == 0
    for bad in ("results/a/b", "/tmp/x", "foo", "../x", "results/", "results/..", "./results/a"):
        assert _lib(repo, f"grid_check_out results/a {bad}").returncode == 2


def test_a_finished_row_is_found_by_its_prefix(repo):
    out = repo / "results" / "g"
    out.mkdir()
    assert _lib(repo, "grid_has_row results/g ml-1m,gsasrec,a,0,fixed,").returncode == 1
    (out / "results.csv").write_text("dataset,split,loss,seed,preset\n"
                                     "ml-1m,gsasrec,a,0,fixed,0.1\n")
    assert _lib(repo, "grid_has_row results/g ml-1m,gsasrec,a,0,fixed,").returncode == 0
    assert _lib(repo, "grid_has_row results/g ml-1m,gsasrec,a,1,fixed,").returncode == 1
    assert _lib(repo, "grid_has_row results/g gsasrec,a,0").returncode == 1  # a prefix only


def test_commit_commits_the_results_directory_only_and_only_when_asked(repo):
    out = repo / "results" / "g"
    out.mkdir()
    (out / "results.csv").write_text("header\nrow 1\nrow 2\n")
    (repo / "notes.txt").write_text("someone else's work\n")
    _git(repo, "add", "notes.txt")  # staged by another process: not this commit's
    count = _git(repo, "rev-list", "--count", "HEAD")
    assert _lib(repo, 'grid_commit results/g "of a test"').returncode == 0  # COMMIT unset
    assert _git(repo, "rev-list", "--count", "HEAD") == count
    result = _lib(repo, 'grid_commit results/g "of a test (code X)"', {"COMMIT": "1"})
    assert result.returncode == 0, result.stderr
    assert _git(repo, "log", "-1", "--format=%s") == (
        "results/g: 2 row(s) of a test (code X)")
    assert _git(repo, "show", "--name-only", "--format=", "HEAD").split() == [
        "results/g/results.csv"]
    assert "A  notes.txt" in _git(repo, "status", "--short")  # still staged, not committed
    # Nothing new: no empty commit.
    assert _lib(repo, 'grid_commit results/g "x"', {"COMMIT": "1"}).returncode == 0
    assert _git(repo, "log", "-1", "--format=%s").startswith("results/g: 2 row(s)")


def test_a_commit_that_keeps_failing_is_retried_then_reported(repo):
    out = repo / "results" / "g"
    out.mkdir()
    (out / "results.csv").write_text("header\nrow\n")
    count = _git(repo, "rev-list", "--count", "HEAD")
    # The index locked by another git command: nothing staged, nothing said (next time).
    (repo / ".git" / "index.lock").write_text("")
    assert _lib(repo, 'grid_commit results/g "x"', {"COMMIT": "1"}).returncode == 0
    (repo / ".git" / "index.lock").unlink()
    # Staged, but every commit fails: five tries, then one line, status 1.
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho try >> \"$(git rev-parse --git-dir)/tries\"\nexit 1\n")
    hook.chmod(0o755)
    result = _lib(repo, 'grid_commit results/g "x"', {"COMMIT": "1"})
    assert result.returncode == 1 and "test_grid: could not commit results/g" in result.stderr
    assert (repo / ".git" / "tries").read_text().count("try") == 5
    assert _git(repo, "rev-list", "--count", "HEAD") == count


_FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for the Python of fixed_grid.sh: `-P -m tfrs_logq.cli experiment ...` appends
# the run's row to results.csv; anything else (paired_report.py) does nothing.
[ "$1" = -P ] || exit 0
echo "cwd=$(pwd) code=$(cat tfrs_logq/__init__.py) args=$*" >> "$CALLS"
while [ $# -gt 0 ]; do
  case "$1" in --output-dir) out=$2;; --losses) loss=$2;; --seeds) seed=$2;; esac
  shift
done
[ -f "$out/results.csv" ] || echo "dataset,split,loss,seed,preset,x" > "$out/results.csv"
echo "ml-1m,gsasrec,$loss,$seed,fixed,0.5" >> "$out/results.csv"
"""


def test_fixed_grid_skips_finished_rows_trains_from_the_pin_and_commits_each_run(repo,
                                                                               tmp_path):
    for name in ("fixed_grid.sh", "grid_lib.sh"):
        shutil.copy(os.path.join(ROOT, "benchmarks", name), repo / "benchmarks" / name)
    (repo / "tools").mkdir(exist_ok=True)
    shutil.copy(os.path.join(ROOT, "tools", "installed_layout.py"), repo / "tools")
    python = tmp_path / "python"
    python.write_text(_FAKE_PYTHON)
    python.chmod(0o755)
    pin = _git(repo, "rev-parse", "HEAD~1")
    out = repo / "results" / "g"
    out.mkdir()
    (out / "results.csv").write_text("dataset,split,loss,seed,preset,x\n"
                                     "ml-1m,gsasrec,a,0,fixed,0.4\n")  # finished earlier
    calls = tmp_path / "calls"
    env = {**os.environ, "COMMIT": "1", "PIN": pin, "OUT": "results/g", "SEEDS": "0 1",
           "LOSSES": "a b", "PY": str(python), "CALLS": str(calls)}
    result = subprocess.run(["bash", str(repo / "benchmarks" / "fixed_grid.sh")], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [
        f"fixed_grid.sh: every run trains from commit {pin}", "skip a seed 0: in "
        "results/g/results.csv"]
    runs = calls.read_text().splitlines()
    assert len(runs) == 3  # b 0, a 1, b 1
    assert all("code=VERSION = 'v1'" in r and "-m tfrs_logq.cli experiment" in r for r in runs)
    assert all(r.startswith("cwd=/") and "/repo" not in r.split()[0] for r in runs)
    assert [r.split("--losses ")[1].split()[:3] for r in runs] == [
        ["b", "--seeds", "0"], ["a", "--seeds", "1"], ["b", "--seeds", "1"]]
    log = _git(repo, "log", "--format=%s", "-3").splitlines()
    assert log == [f"results/g: {n} row(s) at the fixed preset (code {pin})"
                   for n in (4, 3, 2)]
    assert (out / "code_commit").read_text().strip() == pin
    # Run again: everything is finished, nothing trains, nothing is committed.
    calls.unlink()
    env.pop("PIN")
    again = subprocess.run(["bash", str(repo / "benchmarks" / "fixed_grid.sh")], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and not calls.exists()
    assert again.stdout.count("skip ") == 4
    assert _git(repo, "log", "--format=%s", "-1") == log[0]
