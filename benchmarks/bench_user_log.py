"""Reading a user's log at scale: time and peak memory of `tfrs_logq.pipelines.user_log`.

    python benchmarks/bench_user_log.py --rows 100000000 --work-dir /tmp/bench-user-log \\
        --output results/user-log-reading/results.json

Generates a ``user,item,timestamp`` log of ``--rows`` rows (integer ids: ``--synthetic-users``
users, ``--synthetic-items`` items with Zipf popularity; times in a year; a gzip'd copy is not
made: reading a .gz is the same code behind zlib) as CSV and as Parquet (written in
chunks, never whole in memory), then measures, each in a fresh process so that its
peak resident memory (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is its own:

- ``read``: `read_user_log` alone: the streamed reading into id codes;
- ``load``: `load_user_log`: reading plus the preprocessing (5-core items, ids, the
  per-user time order);
- ``split``: `load_user_log_split(..., "temporal")`.

The peak of ``read`` against the size of its output (int32 user and item codes and
int64 seconds: 16 bytes a row) is what "streamed" means here: the file is never
held, only the columns it becomes. ``--memory-limit-gb`` guards a shared machine: a
phase whose resident memory (``/proc/PID/status`` VmRSS, polled every 0.2 s) passes
it is killed and reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

PHASES = ("read", "load", "split")


def generate(path_csv: str, path_parquet: str, rows: int, users: int, items: int,
             seed: int = 0, chunk: int = 5_000_000) -> None:
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([("user", pa.int64()), ("item", pa.int64()), ("timestamp", pa.int64())])
    # Zipf-like item popularity over a fixed catalog: p(rank r) ~ 1 / (r + 10)
    weights = 1.0 / (np.arange(items) + 10.0)
    cdf = np.cumsum(weights / weights.sum())
    with pcsv.CSVWriter(path_csv, schema) as csv_writer, \
            pq.ParquetWriter(path_parquet, schema) as parquet_writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            table = pa.table({
                "user": rng.integers(1, users + 1, n),
                "item": np.searchsorted(cdf, rng.random(n)).clip(max=items - 1) * 13 + 7,
                "timestamp": 1_600_000_000 + rng.integers(0, 365 * 86400, n)}, schema=schema)
            csv_writer.write_table(table)
            parquet_writer.write_table(table, row_group_size=1 << 20)


def measure(phase: str, path: str) -> dict:
    """One phase in this process; returns its seconds, peak RSS and counts."""
    from tfrs_logq.pipelines.user_log import (
        UserLogSource,
        load_user_log,
        load_user_log_split,
        read_user_log,
    )

    source = UserLogSource(path, "user", "item", time_column="timestamp")
    start = time.perf_counter()
    if phase == "read":
        raw = read_user_log(source)
        counts = {"rows": len(raw), "users": len(raw.users), "items": len(raw.items)}
    elif phase == "load":
        inter = load_user_log(source)
        counts = {"rows": inter.num_rows, "interactions": len(inter),
                  "users": inter.num_users, "items": inter.num_items}
    else:
        split = load_user_log_split(source, "temporal")
        counts = {"rows": split.interactions.num_rows, **split.stats()}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"phase": phase, "seconds": round(seconds, 2), "peak_rss_bytes": int(peak),
            "peak_rss_gib": round(peak / 2**30, 3), **counts}


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_guarded(command: list, limit_bytes: int) -> dict:
    """Runs one measuring child; kills it if its resident memory passes the limit."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = False
    while proc.poll() is None:
        if _rss(proc.pid) > limit_bytes:
            proc.kill()
            killed = True
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    phase = command[3]
    if killed:
        return {"phase": phase, "error": f"killed: resident memory passed "
                                         f"{limit_bytes / 2**30:.1f} GiB"}
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"phase": phase, "error": (err.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        model = next(line.split(":", 1)[1].strip() for line in out.splitlines()
                     if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        model = platform.processor() or "unknown"
    return f"{model}, {os.cpu_count()} CPUs"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000_000)
    p.add_argument("--synthetic-users", dest="users", type=int, default=1_000_000)
    p.add_argument("--synthetic-items", dest="items", type=int, default=100_000)
    p.add_argument("--work-dir", default="/tmp/bench-user-log")
    p.add_argument("--formats", default="csv,parquet")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--memory-limit-gb", type=float, default=16.0)
    p.add_argument("--output", default=None, help="JSON file for the results")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--measure", nargs=2, metavar=("PHASE", "PATH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:  # the child process
        print(json.dumps(measure(*args.measure)))
        return 0
    os.makedirs(args.work_dir, exist_ok=True)
    paths = {"csv": os.path.join(args.work_dir, f"log-{args.rows}.csv"),
             "parquet": os.path.join(args.work_dir, f"log-{args.rows}.parquet")}
    start = time.perf_counter()
    if not all(os.path.exists(p) for p in paths.values()):
        generate(paths["csv"], paths["parquet"], args.rows, args.users, args.items)
    record = {"rows": args.rows, "users_drawn_from": args.users, "items_drawn_from": args.items,
              "machine": machine(), "python": platform.python_version(),
              "generate_seconds": round(time.perf_counter() - start, 1),
              "file_bytes": {k: os.path.getsize(v) for k, v in paths.items()}, "runs": []}
    print(json.dumps({k: v for k, v in record.items() if k != "runs"}), flush=True)
    for fmt in args.formats.split(","):
        for phase in args.phases.split(","):
            result = run_guarded([sys.executable, __file__, "--measure", phase, paths[fmt]],
                                 int(args.memory_limit_gb * 2**30))
            result["format"] = fmt
            record["runs"].append(result)
            print(json.dumps(result), flush=True)
    if args.output:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        from tfrs_logq._util.atomic import write_json

        write_json(args.output, record)
    if not args.keep:
        for path in paths.values():
            os.remove(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
