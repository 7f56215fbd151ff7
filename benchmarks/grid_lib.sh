# shellcheck shell=bash
# What the grid scripts share (fixed_grid.sh, long_grid.sh, compare_ml1m.sh; sourced,
# not run): the pinned commit, a snapshot of the code at a commit to train from, and a
# commit of the results directory after each run. Functions only: sourcing it runs
# nothing. They read two variables of the caller: GRID_NAME (the script's name, in
# messages) and PY (the Python that runs the snapshot); COMMIT=1 turns committing on.

grid_check_out() {  # dir...: each must be results/NAME (its runs/ is git-ignored)
  local d
  for d in "$@"; do
    case "$d" in results/*/*|results/|results/.*) return 2;; results/*) ;; *) return 2;; esac
  done
}

grid_pin() {  # out: sets PIN to the commit every run of the grid in out trains from
  # out/code_commit, written by the first run (the HEAD of then); PIN=<commit> given
  # by the caller overrides it (a new grid). An unknown commit is an error (2).
  mkdir -p "$1"
  if [ -n "${PIN:-}" ]; then
    echo "$PIN" > "$1/code_commit"
  elif [ ! -f "$1/code_commit" ]; then
    git rev-parse HEAD > "$1/code_commit"
  fi
  PIN=$(cat "$1/code_commit")
  git cat-file -e "$PIN^{commit}" 2>/dev/null || { echo "pinned commit $PIN not found" >&2; return 2; }
}

grid_snapshot() {  # commit dir: the package's code at commit, laid out as installed, in dir
  # (pyproject.toml's package-dir at that commit says where each part goes), and the lab
  # (lab/: the SASRec grid, not installed) beside it where the commit has one
  python3 "$(dirname "${BASH_SOURCE[0]}")/../tools/installed_layout.py" --commit "$1" --lab \
    "$2" || { echo "no snapshot of $1" >&2; return 1; }
}
grid_lab() {  # snap: the module that runs the lab's command (experiment) in snap:
  # `lab`, or `tfrs_logq.cli` at a commit from before the lab left the package
  if [ -f "$1/lab/__main__.py" ]; then echo lab; else echo tfrs_logq.cli; fi
}
grid_python() {  # snap args...: $PY args... from inside the snapshot snap, with -P:
  # neither the work tree nor the current directory is on sys.path, so the snapshot runs.
  local snap=$1; shift
  (cd "$snap" && PYTHONPATH="$snap" "$PY" -P "$@")
}

grid_has_row() {  # out prefix: a row of out/results.csv starts with prefix (a finished run)
  [ -f "$1/results.csv" ] && grep -q "^$2" "$1/results.csv"
}

grid_commit() {  # out what: with COMMIT=1, commits out as "out: N row(s) what" (rows of
  # results.csv: one per run in the SASRec grids, one per evaluated step count in the retired TF study)
  [ "${COMMIT:-0}" = 1 ] && [ -f "$1/results.csv" ] || return 0
  git add -- "$1" >/dev/null 2>&1 || return 0
  git diff --cached --quiet -- "$1" && return 0
  local n; n=$(($(wc -l < "$1/results.csv") - 1))
  for _ in 1 2 3 4 5; do  # another git command may hold the index lock
    git commit -q -m "$1: $n row(s) $2" -- "$1" && return 0
    sleep "${GRID_RETRY_SECONDS:-5}"
  done
  echo "$GRID_NAME: could not commit $1" >&2
  return 1
}
