"""The log readers (`tfrs_logq.pipelines.log_readers`) on input that is not what it says:
a file of another format, a device, zero bytes, lines without end. Each is one line
naming the file (and the line and byte where there is one) and what to do, read with
memory bounded by a block, never by the file."""

import os
import resource

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tfrs_logq.pipelines import log_readers
from tfrs_logq.pipelines.interactions import DataFormatError
from tfrs_logq.pipelines.user_log import UserLogSource, read_user_log

MIB = 1 << 20


def _read(path, fmt=None):
    return read_user_log(UserLogSource(str(path), "user", "item", format=fmt))


def _one_line(excinfo, *fragments):
    message = str(excinfo.value)
    assert "\n" not in message and len(message) < 500, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _zeros(path, size, prefix=b""):
    """``prefix`` then zero bytes up to ``size`` (a sparse file: instant to write)."""
    with open(path, "wb") as f:
        f.write(prefix)
        f.truncate(size)
    return path


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_a_parquet_file_read_as_text_is_named_as_parquet(tmp_path, fmt):
    """It was "the file is truncated or corrupt (UnicodeDecodeError ...); copy it again"."""
    path = tmp_path / "log.csv"
    pq.write_table(pa.table({"user": ["a", "b"], "item": ["x", "y"]}), path)
    with pytest.raises(DataFormatError) as excinfo:
        _read(path, fmt)
    _one_line(excinfo, str(path), "is a Parquet file", "PAR1", "--log-format parquet")


def test_a_text_file_read_as_parquet_says_it_is_not_parquet(tmp_path):
    path = tmp_path / "log.parquet"
    path.write_text("user,item\na,x\n")
    with pytest.raises(DataFormatError) as excinfo:
        _read(path)
    _one_line(excinfo, str(path), "is not a Parquet file", "PAR1", "--log-format csv")


def test_a_device_or_a_pipe_is_not_a_regular_file(tmp_path):
    """/dev/zero was "no such file or directory"; read, it never ends."""
    with pytest.raises(DataFormatError) as excinfo:
        _read("/dev/zero", "csv")
    _one_line(excinfo, "/dev/zero is not a regular file (a character device)")
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(DataFormatError) as excinfo:
        _read(tmp_path / "pipe.csv")
    _one_line(excinfo, "pipe.csv is not a regular file (a named pipe)")
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "logs" / "pipe.csv")  # in a directory: not one of its files
    (tmp_path / "logs" / "a.csv").write_text("user,item\nu,x\n")
    assert len(_read(tmp_path / "logs")) == 1


def test_zero_bytes_after_a_header_name_the_file_line_and_byte(tmp_path, monkeypatch):
    """It was pyarrow's "straddling object straddles two block boundaries (try to
    increase block size?)", with neither the file nor where."""
    monkeypatch.setattr(log_readers, "CSV_BLOCK_BYTES", MIB)
    path = _zeros(tmp_path / "log.csv", 3 * MIB, b"user,item\nu1,x\nu2,y\n")
    with pytest.raises(DataFormatError) as excinfo:
        _read(path)
    _one_line(excinfo, f"{path}, line 4 (byte 20)", "no line break within 1,048,576 bytes",
              "NUL bytes", "cut it before byte 20", "copy it again")


def test_one_enormous_field_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(log_readers, "CSV_BLOCK_BYTES", MIB)
    path = tmp_path / "log.csv"
    path.write_bytes(b"user,item\nu1,x\nu2," + b"y" * (2 * MIB) + b"\nu3,z\n")
    with pytest.raises(DataFormatError) as excinfo:
        _read(path)
    message = _one_line(excinfo, f"{path}, line 3 (byte 15)", "no line break")
    assert "NUL" not in message
    path.write_bytes(b"user,item\nu1,x\nu2,\"" + b"y\n" * MIB)  # a quote never closed
    with pytest.raises(DataFormatError) as excinfo:
        _read(path)
    _one_line(excinfo, str(path), "after data row 1", "quoted field left open")


@pytest.mark.parametrize("name,fmt", [("zeros.csv", "csv"), ("zeros.tsv", "tsv"),
                                      ("zeros.jsonl", "jsonl")])
def test_a_file_without_line_breaks_is_refused_within_a_bounded_read(tmp_path, monkeypatch,
                                                                     name, fmt):
    """256 MB of zero bytes: the CSV header (and a JSON line's end) was read whole into
    memory, 256 MB and more, before any check; 2 GB of them went further."""
    monkeypatch.setattr(log_readers, "JSON_BLOCK_BYTES", 4 * MIB)
    path = _zeros(tmp_path / name, 256 * MIB)
    before = _peak_rss_bytes()
    with pytest.raises(DataFormatError) as excinfo:
        _read(path)
    limit = log_readers.HEADER_BYTES if fmt != "jsonl" else 4 * MIB
    _one_line(excinfo, f"{path}, line 1 (byte 0)", f"no line break within {limit:,} bytes",
              "NUL bytes", f"if it is not {fmt}")
    assert _peak_rss_bytes() - before < 64 * MIB


def test_a_header_holding_nul_bytes_is_refused(tmp_path):
    path = tmp_path / "log.csv"
    path.write_bytes(b"user,item\0\0\0\n")
    with pytest.raises(DataFormatError) as excinfo:
        _read(path)
    _one_line(excinfo, f"{path}, line 1", "NUL bytes")
