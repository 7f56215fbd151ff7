"""A user's log made to hurt: each input below once took the reader down or read wrong
without a word; each is now a one-line refusal (exit status 2 on the command line) or
read right.

- one enormous id (memory grew as distinct ids x the longest id);
- a stray quote that swallowed the rest of the file under ``--skip-bad-lines``;
- times in two units in one column; ISO years outside 1..9999 and dates shown in a
  guessed unit;
- UTF-16 files, and column names that differ only in Unicode normalisation;
- weights whose mean overflows.
"""

import json
import math
import subprocess
import sys
import textwrap
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tfrs_logq.cli import main
from tfrs_logq.pipelines import ids, splits
from tfrs_logq.pipelines.interactions import DataFormatError
from tfrs_logq.pipelines.user_log import UserLogSource, load_user_log, read_user_log

COLUMNS = ("--user-column", "user", "--item-column", "item")


def write_csv(path, rows, header="user,item,ts"):
    path.write_text(header + "\n" + "".join(row + "\n" for row in rows), encoding="utf-8")
    return path


def log_rows(n, time=lambda k: 1_000_000_000 + k):
    """``n`` rows of 50 users and 20 items, each row its own time."""
    return [f"u{k % 50},i{k % 20},{time(k)}" for k in range(n)]


def stats(capsys, path, *flags):
    """``(exit status, stdout, stderr)`` of ``data stats`` on ``path``."""
    code = main(["data", "stats", "--interactions", str(path), *COLUMNS, *flags])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err):
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tfrs-logq: error: "), err
    return lines[0]


# --------------------------------------------------------------------- one long id


# The peak is the process's own (VmHWM): ru_maxrss would keep the RSS of the test process
# the child was forked from (Linux carries it across exec).
_PEAK = textwrap.dedent("""
    import resource, sys
    # A net under the measurement: 4 GiB of address space (the reader once took 23 GB).
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    from tfrs_logq.cli import main
    code = main(sys.argv[1:])
    with open("/proc/self/status") as f:
        peak = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    print("PEAK", code, peak)
""")


def peak_of_data_stats(*args):
    """``(exit status, peak resident KiB, stderr)`` of ``data stats`` in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", _PEAK, "data", "stats", *args],
                          capture_output=True, text=True, timeout=120)
    line = [x for x in proc.stdout.splitlines() if x.startswith("PEAK")]
    assert line, proc.stderr[-2000:]
    _, code, peak = line[-1].split()
    return int(code), int(peak), proc.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("skip", [False, True])
def test_a_5_million_character_id_is_refused_in_a_few_hundred_mb(tmp_path, skip):
    rows = log_rows(3000)
    rows[100] = "x" * 5_000_000 + ",i1,1000000100"
    log = write_csv(tmp_path / "long.csv", rows)
    code, peak_kib, err = peak_of_data_stats(
        "--interactions", str(log), *COLUMNS, "--time-column", "ts",
        *(["--skip-bad-lines"] if skip else []))
    assert peak_kib < 400 * 1024, f"peak {peak_kib / 1024:.0f} MB"
    if skip:  # the row is malformed: skipped and counted (1 of 3,000 lines)
        assert code == 0, err
        assert "1 malformed skipped" in err
    else:
        assert code == 2
        line = one_line_error(err)
        assert "long.csv, line 102" in line and "column 'user'" in line
        assert f"longer than {ids.MAX_ID_CHARS:,} characters" in line
        assert "(5,000,000 characters)" in line and len(line) < 1000


def test_an_id_of_exactly_the_limit_is_read(tmp_path):
    rows = log_rows(200)
    longest = "y" * ids.MAX_ID_CHARS
    rows[0] = f"{longest},i0,1000000000"
    got = load_user_log(UserLogSource(str(write_csv(tmp_path / "l.csv", rows)), "user",
                                      "item", time_column="ts"), min_item_interactions=1)
    assert longest in set(got.raw_users.tolist())


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_too_long_id_is_refused_in_every_format(tmp_path, fmt):
    users = [f"u{k % 5}" for k in range(30)]
    users[7] = "z" * (ids.MAX_ID_CHARS + 1)
    items = [f"i{k % 3}" for k in range(30)]
    path = tmp_path / f"log.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"user": users, "item": items}), path)
    else:
        path.write_text("".join(json.dumps({"user": u, "item": i}) + "\n"
                                for u, i in zip(users, items)))
    with pytest.raises(DataFormatError, match=r"(row|line) 8: a user id longer than 1,024"):
        read_user_log(UserLogSource(str(path), "user", "item"))


# ---------------------------------------------------- --skip-bad-lines counts all


def stray_quote_log(tmp_path):
    """6,000 rows; a stray quote at line 5,400 opens a field to the end of the file."""
    rows = log_rows(6000)
    rows[5398] = 'u7,"i3,1000005398'
    return write_csv(tmp_path / "stray.csv", rows)


def test_a_stray_quote_counts_every_line_it_swallows_and_is_refused(tmp_path, capsys):
    code, _, err = stats(capsys, stray_quote_log(tmp_path), "--time-column", "ts",
                         "--skip-bad-lines")
    assert code == 2
    line = one_line_error(err)
    assert "602 of 6,000 lines (10.0%) were skipped" in line  # lines 5,400 to 6,001
    assert "stray.csv, line 5400" in line and "--max-bad-share" in line


def test_max_bad_share_lets_the_user_accept_the_loss_and_the_count_is_shown(tmp_path,
                                                                             capsys):
    code, out, err = stats(capsys, stray_quote_log(tmp_path), "--time-column", "ts",
                           "--skip-bad-lines", "--max-bad-share", "0.2")
    assert code == 0, err
    assert "5,398 rows, 602 malformed lines skipped" in out


def test_within_the_share_a_bad_line_is_skipped_as_before(tmp_path):
    rows = log_rows(1000)
    rows[10] = "u1,i1"  # one field short: 1 of 1,000 lines
    source = UserLogSource(str(write_csv(tmp_path / "ok.csv", rows)), "user", "item",
                           time_column="ts", skip_bad_lines=True)
    got = load_user_log(source, min_item_interactions=1)
    assert (got.num_rows, got.skipped_lines) == (999, 1)


def test_max_bad_share_needs_skip_bad_lines_and_a_log(tmp_path, capsys):
    log = write_csv(tmp_path / "ok.csv", log_rows(100))
    code, _, err = stats(capsys, log, "--max-bad-share", "0.5")
    assert code == 2 and "give --skip-bad-lines too" in one_line_error(err)
    with pytest.raises(ValueError, match="max_bad_share"):
        UserLogSource(str(log), "user", "item", max_bad_share=1.5)


# ------------------------------------------------------------------- time units


@pytest.mark.parametrize("first, later, later_kind", [
    (lambda k: 1_600_000_000 + k, lambda k: 1_600_000_000_000 + k, "epoch milliseconds"),
    (lambda k: f"2020-09-13T12:{k % 60:02d}:00Z", lambda k: 1_600_000_000_000 + k,
     "epoch milliseconds"),
    (lambda k: 1_600_000_000_000 + k, lambda k: f"2020-09-13T12:{k % 60:02d}:00",
     "a date (seconds)"),
])
def test_a_time_column_in_two_units_is_refused_naming_the_first_other_row(
        tmp_path, capsys, first, later, later_kind):
    rows = log_rows(3000, lambda k: first(k) if k < 2500 else later(k))
    code, _, err = stats(capsys, write_csv(tmp_path / "mixed.csv", rows), "--time-column",
                         "ts", "--skip-bad-lines")  # a column-wide fault: never skipped
    assert code == 2
    line = one_line_error(err)
    assert "mixed.csv, line 2502" in line and "mixes units" in line
    assert f"is {later_kind}" in line and "mixed.csv, line 2)" in line


def test_units_are_checked_across_files(tmp_path):
    write_csv(tmp_path / "a.csv", log_rows(100))
    write_csv(tmp_path / "b.csv", log_rows(100, lambda k: 1_600_000_000_000 + k))
    with pytest.raises(DataFormatError, match=r"b.csv, line 2: the time column 'ts' mixes "
                                              r"units.*a.csv, line 2"):
        read_user_log(UserLogSource(str(tmp_path), "user", "item", time_column="ts"))


def test_one_unit_is_read_and_shown_in_the_logs_own_unit(tmp_path, capsys):
    rows = log_rows(3000, lambda k: 1_600_000_000_000 + 1000 * k)
    code, out, err = stats(capsys, write_csv(tmp_path / "ms.csv", rows), "--time-column",
                           "ts")
    assert code == 0, err
    assert ("2020-09-13 12:26:40 .. 2020-09-13 13:16:39 UTC (the times are epoch "
            "milliseconds)") in out


def test_iso_dates_of_the_years_1_and_9999_are_shown_as_such(tmp_path, capsys):
    rows = log_rows(3000, lambda k: f"2000-01-01T00:{k % 60:02d}:00")
    rows[5] = "u5,i5,9999-12-31T23:59:59"
    rows[6] = "u6,i6,0001-01-01"
    code, out, err = stats(capsys, write_csv(tmp_path / "iso.csv", rows), "--time-column",
                           "ts", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["time_unit"] == "seconds"
    assert result["time_range"] == [-62135596800, 253402300799]
    code, out, err = stats(capsys, tmp_path / "iso.csv", "--time-column", "ts")
    assert "time range: 0001-01-01 00:00:00 .. 9999-12-31 23:59:59 UTC\n" in out


@pytest.mark.parametrize("year", ["0000-06-01", "10000-01-01", "+10000-01-01"])
def test_iso_years_outside_1_to_9999_are_refused(tmp_path, capsys, year):
    rows = log_rows(100, lambda k: f"2000-01-01T00:{k % 60:02d}:00")
    rows[3] = f"u3,i3,{year}"
    code, _, err = stats(capsys, write_csv(tmp_path / "y.csv", rows), "--time-column", "ts")
    assert code == 2
    line = one_line_error(err)
    assert "y.csv, line 5: unparseable timestamp" in line and "years 1 to 9999" in line


# ------------------------------------------------------ encodings and column names


@pytest.mark.parametrize("encoding, named", [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"),
                                             ("utf-16-le", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_utf16_or_utf32_file_is_named_as_such(tmp_path, capsys, encoding, named):
    path = tmp_path / "wide.csv"
    path.write_text("user,item,ts\n" + "".join(r + "\n" for r in log_rows(100)),
                    encoding=encoding)
    code, _, err = stats(capsys, path, "--time-column", "ts")
    assert code == 2
    line = one_line_error(err)
    assert f"wide.csv is {named}" in line and "save it as UTF-8" in line
    assert "truncated or corrupt" not in line


def test_a_utf16_json_lines_file_is_named_as_such(tmp_path):
    path = tmp_path / "wide.jsonl"
    path.write_text('{"user": "a", "item": "b"}\n', encoding="utf-16")
    with pytest.raises(DataFormatError, match="is UTF-16 .*save it as UTF-8"):
        read_user_log(UserLogSource(str(path), "user", "item"))


def test_a_latin1_file_is_named_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin.csv"
    path.write_bytes(("usér,item\n" + "".join(f"u{k},i{k}\n" for k in range(9)))
                     .encode("latin-1"))
    code, _, err = stats(capsys, path)
    assert code == 2
    line = one_line_error(err)
    assert "not UTF-8" in line and "save it as UTF-8" in line


def test_a_utf8_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_text("user,item\n" + "".join(f"u{k % 4},i{k % 3}\n" for k in range(30)),
                    encoding="utf-8-sig")
    assert len(read_user_log(UserLogSource(str(path), "user", "item"))) == 30


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_column_names_are_matched_after_unicode_normalisation(tmp_path, fmt):
    decomposed = unicodedata.normalize("NFD", "usér")  # e + U+0301 in the file
    users, items = [f"u{k % 4}" for k in range(30)], [f"i{k % 3}" for k in range(30)]
    path = tmp_path / f"nfd.{fmt}"
    if fmt == "csv":
        write_csv(path, [f"{u},{i}" for u, i in zip(users, items)], f"{decomposed},item")
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({decomposed: u, "item": i}) + "\n"
                                for u, i in zip(users, items)))
    else:
        pq.write_table(pa.table({decomposed: users, "item": items}), path)
    raw = read_user_log(UserLogSource(str(path), unicodedata.normalize("NFC", "usér"),
                                      "item"))
    assert len(raw) == 30 and len(raw.users) == 4


def test_two_columns_that_differ_only_in_normalisation_are_named_apart(tmp_path, capsys):
    composed, decomposed = (unicodedata.normalize(f, "usér") for f in ("NFC", "NFD"))
    path = write_csv(tmp_path / "two.csv", [f"a{k},b{k},i{k % 3}" for k in range(30)],
                     f"{composed},{decomposed},item")
    code = main(["data", "stats", "--interactions", str(path), "--user-column", composed,
                 "--item-column", "item"])
    assert code == 2
    line = one_line_error(capsys.readouterr().err)
    assert ascii(composed) in line and ascii(decomposed) in line
    assert "differ only in Unicode normalisation" in line


# ------------------------------------------------------------------------ weights


def test_the_mean_of_huge_weights_does_not_overflow(tmp_path, capsys):
    rows = [f"u{k % 10},i{k % 5},{1e308 if k % 2 else 5e307!r}" for k in range(200)]
    path = write_csv(tmp_path / "w.csv", rows, "user,item,w")
    code, out, err = stats(capsys, path, "--weight-column", "w", "--min-item-interactions",
                           "1")
    assert code == 0, err
    assert "mean 7.5e+307" in out and "inf" not in out


def test_finite_mean_against_exact_arithmetic():
    rng = np.random.default_rng(0)
    for values in (np.array([1e308, 1e308, -1e308, 1e308]), rng.normal(size=1000) * 1e300,
                   rng.uniform(size=77), np.array([0.0, 0.0]), np.array([5e-324, 0.0])):
        exact = math.fsum(v / 2**1000 for v in values) / len(values) * 2**1000
        assert splits.finite_mean(values) == pytest.approx(exact, rel=1e-12, abs=1e-320)


def test_ids_that_would_not_fit_in_memory_are_refused_before_their_array_is_built(
        tmp_path, monkeypatch):
    from tfrs_logq.pipelines import user_log

    rows = [f"{'u' * 1000}{k % 50},i{k % 20}" for k in range(200)]
    path = write_csv(tmp_path / "wide.csv", rows, "user,item")
    need = 50 * 4 * 1002 + 20 * 4 * 3  # distinct ids x 4 bytes x the longest, per kind
    monkeypatch.setattr(user_log, "available_memory_bytes", lambda: need - 1)
    with pytest.raises(DataFormatError, match=r"wide.csv: the log's ids would take .* GiB "
                                              r"as arrays .*: shorten the ids"):
        load_user_log(UserLogSource(str(path), "user", "item"), min_item_interactions=1)
    monkeypatch.setattr(user_log, "available_memory_bytes", lambda: need)
    got = load_user_log(UserLogSource(str(path), "user", "item"), min_item_interactions=1)
    assert got.raw_users.dtype.itemsize == 4 * 1002
