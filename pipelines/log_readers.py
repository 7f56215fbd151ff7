"""Streaming readers of interaction files: CSV, TSV (plain or gzip), Parquet, JSON Lines.

Each reader yields `Batch`es of the named columns as pyarrow arrays, a bounded
number of rows at a time (a CSV block, a Parquet batch, a block of JSON lines),
so memory does not grow with the file. What a file *means* (ids, times, weights)
is decided by `tfrs_logq.pipelines.user_log`; here only reading:

- **CSV/TSV**: pyarrow's streaming CSV reader, the first line a header, every named
  column read as text (a CSV has no types); a row with the wrong number of fields is
  malformed (its line number is pyarrow's). TSV is tab-separated without quoting
  (IANA ``text/tab-separated-values``); CSV follows RFC 4180 (quotes, quoted line
  breaks). ``.gz`` is decompressed on the fly.
- **Parquet**: ``ParquetFile.iter_batches`` over the named columns; a row is named by
  its number in the file. A file is split into pieces by row group (`pieces`).
- **JSON Lines**: blocks of whole lines parsed by pyarrow; a block that pyarrow
  refuses (a malformed line, a field whose type changes) is parsed line by line
  with `json`, which names the line. Blank lines are ignored.

A batch also carries `Batch.where`, which names the file and line (or row) of any
of its rows for an error message; for CSV it reads the file again up to that row,
which only an error pays for.

Memory stays bounded on any input, text or not: a line is read at most a block
(`CSV_BLOCK_BYTES`, `JSON_BLOCK_BYTES`; a CSV header at most `HEADER_BYTES`), and a
line longer than that (a file of zero bytes, a damaged copy, one enormous field) is
a `DataFormatError` naming the file, the line and its byte offset. A text format
given to a Parquet file (its magic bytes ``PAR1``) is refused, naming the format.

Text is UTF-8: a UTF-16 or UTF-32 file (a byte-order mark, or every other byte NUL) is
refused before reading, saying so ("save it as UTF-8"), and so is a file with bytes that
are not UTF-8. Column names are matched after Unicode normalisation (NFC): ``"café"``
typed as one code point finds a header that spells it ``e`` + U+0301; two columns of a
file that differ only in normalisation are refused, their code points shown.

With ``skip_bad_lines`` every line dropped is counted: a CSV row that swallows the lines
after it (a stray ``"`` opening a quoted field to the end of the file) counts as all of
its lines, not as one row.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import os
import unicodedata
import zlib
from typing import Callable, Iterator, Optional

import pyarrow as pa

from tfrs_logq.pipelines.interactions import DataFormatError, ParseReport, open_text

__all__ = ["FORMATS", "Batch", "Piece", "format_of", "pieces", "read_batches",
           "SKIP_HINT"]

FORMATS = ("csv", "tsv", "parquet", "jsonl")
_EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet",
               ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
SKIP_HINT = "(--skip-bad-lines, or skip_bad_lines=True, skips and counts malformed rows)"
CSV_BLOCK_BYTES = 32 << 20  # one CSV batch; about a million rows of a short log
JSON_BLOCK_BYTES = 32 << 20
PARQUET_BATCH_ROWS = 1 << 20
HEADER_BYTES = 1 << 20  # a CSV/TSV header line's most bytes
_DAMAGED = (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError, OSError)
_PARQUET_MAGIC = b"PAR1"


def format_of(path: str, explicit: Optional[str] = None) -> str:
    """The file's format: ``explicit`` when given, else from the extension
    (``.csv``, ``.tsv``/``.tab``, ``.parquet``/``.pq``, ``.jsonl``/``.ndjson``/``.json``,
    each text one optionally followed by ``.gz``).

    Raises:
      ValueError: an unknown ``explicit`` format, or an extension that says none.
    """
    if explicit is not None:
        if explicit not in FORMATS:
            raise ValueError(f"`format` must be one of {FORMATS}, received {explicit!r}.")
        return explicit
    name = os.path.basename(path).lower()
    stem = name[:-3] if name.endswith(".gz") else name
    fmt = _EXTENSIONS.get(os.path.splitext(stem)[1])
    if fmt is None or (fmt == "parquet" and stem != name):
        raise ValueError(f"cannot tell the format of {path} from its name; name it "
                         "*.csv, *.tsv, *.parquet or *.jsonl (text ones optionally .gz), or pass "
                         f"format= (--log-format) one of {', '.join(FORMATS)}.")
    return fmt


@dataclasses.dataclass(frozen=True)
class Piece:
    """A part of a file read on its own (a Beam worker's element).

    Attributes:
      path: str. The file.
      fmt: str. One of `FORMATS`.
      row_group: int. A Parquet row group, or None for the whole file.
      first_row: int. The number of the piece's first row in the file (0-based).
    """

    path: str
    fmt: str
    row_group: Optional[int] = None
    first_row: int = 0


def pieces(path: str, fmt: str) -> list[Piece]:
    """A Parquet file's row groups, or the whole file for the text formats (a gzip
    stream, or a CSV with quoted line breaks, cannot be cut at arbitrary bytes)."""
    if fmt != "parquet":
        return [Piece(path, fmt)]
    meta = _parquet_file(path).metadata
    out, first = [], 0
    for k in range(meta.num_row_groups):
        out.append(Piece(path, fmt, k, first))
        first += meta.row_group(k).num_rows
    return out or [Piece(path, fmt)]


@dataclasses.dataclass
class Batch:
    """Some rows of one file.

    Attributes:
      columns: dict. Column name -> pyarrow array (all of one length).
      where: callable. ``where(k)`` names the batch's row ``k`` as ``"FILE, line N"``
        (``"FILE, row N"`` for Parquet).
      path: str. The file.
    """

    columns: dict
    where: Callable[[int], str]
    path: str

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))


def read_batches(piece: Piece, columns: list, *, skip_bad_lines: bool = False,
                 report: Optional[ParseReport] = None) -> Iterator[Batch]:
    """The named ``columns`` of a piece, batch by batch.

    Malformed rows (the wrong number of fields, a line that is not a JSON object)
    raise `DataFormatError` naming the file and line, or with ``skip_bad_lines`` are
    skipped and counted in ``report``.

    Raises:
      DataFormatError: a column the file does not have (the message lists those it
        has), a malformed row, a damaged file.
    """
    report = report if report is not None else ParseReport()
    read = {"csv": _csv_batches, "tsv": _csv_batches, "parquet": _parquet_batches,
            "jsonl": _jsonl_batches}[piece.fmt]
    yield from read(piece, list(columns), skip_bad_lines, report)


def _nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def _resolve(path: str, columns: list, found: list, what: str = "columns") -> dict:
    """``{column asked for: the file's name of it}``, names compared after Unicode
    normalisation (NFC).

    Raises:
      DataFormatError: a column the file does not have (the message lists those it
        has), or one that two of the file's names both spell (they differ only in
        normalisation; the message shows their code points).
    """
    by_nfc: dict = {}
    for name in found:
        by_nfc.setdefault(_nfc(name), []).append(name)
    resolved = {}
    for column in columns:
        names = by_nfc.get(_nfc(column), [])
        if not names:
            listed = ", ".join(_shorten(c) for c in found[:50]) + (" ..." if len(found) > 50
                                                                     else "")
            raise DataFormatError(f"{path}: no column {_shorten(column)}; the file has the "
                                  f"{what} {listed or '(none)'}.")
        if len(names) > 1:
            raise DataFormatError(
                f"{path}: the {what} {' and '.join(ascii(n) for n in names)} differ only in "
                f"Unicode normalisation, so {_shorten(column)} could mean either: rename one "
                "of them in the file.")
        resolved[column] = names[0]
    return resolved


def _shorten(text: str, limit: int = 60) -> str:
    """``repr(text)``, cut to ``limit`` characters (a header of one enormous field is
    not echoed whole)."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(text):,} characters)"


def _skip_or_raise(message: str, skip: bool, report: ParseReport, lines: int = 1) -> None:
    if not skip:
        raise DataFormatError(f"{message} {SKIP_HINT}")
    report.skipped += lines
    if len(report.first_errors) < 5:
        report.first_errors.append(message)


def _damaged(path: str, exc: BaseException) -> DataFormatError:
    if isinstance(exc, UnicodeDecodeError):
        return DataFormatError(f"{path} is not UTF-8 text (it holds the byte "
                               f"{exc.object[exc.start]:#04x}, which UTF-8 text cannot): save "
                               "it as UTF-8.")
    return DataFormatError(f"{path}: the file is truncated or corrupt ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}); copy it again.")


_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
         (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


def _text_encoding_problem(head: bytes) -> Optional[str]:
    """``"UTF-16"``/``"UTF-32"`` for text that starts with their byte-order mark, or
    whose first bytes are every other one NUL (UTF-16 without a mark); else None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return f"{name} (it starts with a {name} byte-order mark)"
    pairs = head[: len(head) // 2 * 2]
    if len(pairs) >= 8:
        even, odd = pairs[0::2], pairs[1::2]
        if (not odd.strip(b"\0") and even.strip(b"\0")) or \
                (not even.strip(b"\0") and odd.strip(b"\0")):
            return "UTF-16 (every other byte is NUL)"
    return None


def _check_not_parquet(path: str, fmt: str) -> None:
    """Refuses a Parquet file (its magic bytes ``PAR1``) read as text ``fmt``, and text
    that is UTF-16 or UTF-32 rather than UTF-8."""
    with open(path, "rb") as f:
        magic = f.read(len(_PARQUET_MAGIC))
    if magic == _PARQUET_MAGIC:
        raise DataFormatError(f"{path} is a Parquet file (it starts with Parquet's magic bytes "
                              f"PAR1), not {fmt}: read it with --log-format parquet "
                              "(format='parquet'), or name it *.parquet.")
    try:
        with _open_binary(path) as f:
            head = f.read(64)
    except _DAMAGED:
        return  # the reader names the damage
    problem = _text_encoding_problem(head)
    if problem:
        raise DataFormatError(f"{path} is {problem}, not UTF-8: save it as UTF-8 (iconv -f "
                              f"{problem.split()[0]} -t UTF-8, or your editor's 'save as "
                              "UTF-8').")


def _first_long_line(path: str, limit: int) -> Optional[tuple]:
    """``(line number, byte offset)`` of the first line of more than ``limit`` bytes of
    the (decompressed) file, read a chunk at a time; None if there is none."""
    chunk = max(1, min(1 << 20, limit))  # a gap inside one chunk is shorter than limit
    line, start, offset = 1, 0, 0
    with _open_binary(path) as f:
        while True:
            block = f.read(chunk)
            if not block:
                return None
            first = block.find(b"\n")
            if first < 0:
                if offset + len(block) - start > limit:
                    return line, start
            else:
                if offset + first - start > limit:
                    return line, start
                line += block.count(b"\n")
                start = offset + block.rfind(b"\n") + 1
            offset += len(block)


def _long_line(path: str, fmt: str, limit: int, rows_before: Optional[int] = None
               ) -> DataFormatError:
    """The error for a line (or a row) of more than ``limit`` bytes: names the file,
    the line and its byte offset, and what to do."""
    found = _first_long_line(path, limit)
    if found is None:  # a quoted field spanning lines
        return DataFormatError(
            f"{path}: the row after data row {rows_before or 0:,} is longer than {limit:,} "
            "bytes (a quoted field left open?); a row cannot be that long: close the quote, "
            "or copy the file again if it is damaged.")
    line, start = found
    with _open_binary(path) as f:
        f.seek(start)
        head = f.read(16)
    nul = " and starts with NUL bytes (a zero-filled or damaged file)" \
        if head.startswith(b"\0") else ""
    return DataFormatError(
        f"{path}, line {line} (byte {start:,}): no line break within {limit:,} bytes{nul}; "
        f"a {fmt} line cannot be that long: if the file is damaged, copy it again or cut it "
        f"before byte {start:,}; if it is not {fmt}, give its format (--log-format).")


# ------------------------------------------------------------------------- CSV, TSV


def _csv_dialect(fmt: str) -> dict:
    return {"delimiter": "," if fmt == "csv" else "\t", "quoting": fmt == "csv"}


def _csv_header(path: str, fmt: str, dialect: dict) -> Optional[list]:
    """The header's fields, or None for a file without a byte; a header line of more
    than `HEADER_BYTES` is refused without reading further."""
    def lines(f):  # csv.reader over lines read at most HEADER_BYTES at a time
        while True:
            text = f.readline(HEADER_BYTES + 1)
            if len(text) > HEADER_BYTES:
                raise _long_line(path, fmt, HEADER_BYTES)
            if not text:
                return
            yield text

    try:
        with open_text(path, encoding="utf-8-sig") as f:
            reader = csv.reader(lines(f), delimiter=dialect["delimiter"],
                                quoting=csv.QUOTE_MINIMAL if dialect["quoting"]
                                else csv.QUOTE_NONE)
            header = next(reader, None)
    except (DataFormatError, FileNotFoundError):
        raise
    except (_DAMAGED + (csv.Error,)) as exc:
        raise _damaged(path, exc) from None
    if header is not None and any("\0" in field for field in header):
        raise DataFormatError(f"{path}, line 1: the header holds NUL bytes, which no {fmt} "
                              "header does (a zero-filled or damaged file?): copy it again, or "
                              "give its format (--log-format).")
    return header


def _csv_line_of_row(path: str, dialect: dict, fields: int, row: int) -> int:
    """The line on which data row ``row`` (0-based, counting the rows pyarrow keeps:
    not blank, ``fields`` fields) ends: the error path's second reading."""
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, CSV_BLOCK_BYTES))  # a field as long as a row may be
    try:
        with open_text(path, encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter=dialect["delimiter"],
                                quoting=csv.QUOTE_MINIMAL if dialect["quoting"]
                                else csv.QUOTE_NONE)
            next(reader, None)
            seen = 0
            for record in reader:
                if len(record) != fields:
                    continue
                if seen == row:
                    return reader.line_num
                seen += 1
    finally:
        csv.field_size_limit(limit)
    return -1


def _csv_batches(piece: Piece, columns: list, skip: bool, report: ParseReport):
    import pyarrow.csv as pcsv

    path, dialect = piece.path, _csv_dialect(piece.fmt)
    _check_not_parquet(path, piece.fmt)
    header = _csv_header(path, piece.fmt, dialect)
    if header is None:  # an empty file: no rows (the caller reports an empty log)
        return
    names = _resolve(path, columns, header, "header columns")
    refused: list = []

    def on_invalid(row) -> str:
        lines = row.text.count("\n") + 1  # a stray quote's row runs to the next quote
        where = f"line {row.number}" if row.number is not None else "a row"
        message = (f"{path}, {where}: expected {row.expected_columns} fields, found "
                   f"{row.actual_columns}"
                   + (f" in {lines:,} lines (a quote left open?)" if lines > 1 else "")
                   + f": {row.text[:200]!r}")
        if skip:
            _skip_or_raise(message, True, report, lines)
            return "skip"
        refused.append(message)
        return "error"

    options = (pcsv.ReadOptions(use_threads=False, block_size=CSV_BLOCK_BYTES),
               pcsv.ParseOptions(delimiter=dialect["delimiter"],
                                 quote_char='"' if dialect["quoting"] else False,
                                 newlines_in_values=dialect["quoting"],
                                 invalid_row_handler=on_invalid),
               pcsv.ConvertOptions(include_columns=[names[c] for c in columns],
                                   column_types={names[c]: pa.string() for c in columns},
                                   strings_can_be_null=False, quoted_strings_can_be_null=False))
    first = 0
    try:
        reader = pcsv.open_csv(path, read_options=options[0], parse_options=options[1],
                               convert_options=options[2])
        for record_batch in reader:
            if record_batch.num_rows == 0:
                continue
            offset = first

            def where(k: int, offset: int = offset) -> str:
                return f"{path}, line {_csv_line_of_row(path, dialect, len(header), offset + k)}"

            report.rows += record_batch.num_rows
            yield Batch({c: record_batch.column(names[c]) for c in columns}, where, path)
            first += record_batch.num_rows
    except pa.ArrowInvalid as exc:
        if refused:
            raise DataFormatError(f"{refused[0]} {SKIP_HINT}") from None
        if "Empty CSV file" in str(exc):
            return
        if "straddl" in str(exc):  # a row longer than a block
            raise _long_line(path, piece.fmt, CSV_BLOCK_BYTES, first) from None
        if "UTF8" in str(exc) or "UTF-8" in str(exc):
            raise DataFormatError(f"{path}: a value is not UTF-8 text "
                                  f"({str(exc).splitlines()[0]}): save the file as UTF-8."
                                  ) from None
        raise DataFormatError(f"{path}: {str(exc).splitlines()[0]}") from None
    except _DAMAGED as exc:
        raise _damaged(path, exc) from None


# -------------------------------------------------------------------------- Parquet


def _parquet_file(path: str):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        with open(path, "rb") as f:
            magic = f.read(len(_PARQUET_MAGIC))
        if magic != _PARQUET_MAGIC:
            raise DataFormatError(
                f"{path} is not a Parquet file (it does not start with Parquet's magic bytes "
                f"PAR1 but {magic!r}): give its format with --log-format csv, tsv or jsonl "
                "(format=...).") from None
        raise DataFormatError(f"{path} is not a readable Parquet file ({exc}).") from None


def _parquet_batches(piece: Piece, columns: list, skip: bool, report: ParseReport):
    path = piece.path
    parquet = _parquet_file(path)
    names = _resolve(path, columns, parquet.schema_arrow.names)
    groups = None if piece.row_group is None else [piece.row_group]
    first = piece.first_row
    try:
        for record_batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS,
                                                 row_groups=groups,
                                                 columns=[names[c] for c in columns]):
            offset = first

            def where(k: int, offset: int = offset) -> str:
                return f"{path}, row {offset + k + 1}"

            report.rows += record_batch.num_rows
            report.lines += record_batch.num_rows
            yield Batch({c: record_batch.column(names[c]) for c in columns}, where, path)
            first += record_batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise _damaged(path, exc) from None


# ----------------------------------------------------------------------- JSON Lines


def _open_binary(path: str):
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _jsonl_blocks(path: str):
    """``(first line number, bytes of whole lines)``."""
    line = 1
    try:
        with _open_binary(path) as f:
            while True:
                block = f.read(JSON_BLOCK_BYTES)
                if not block:
                    return
                if not block.endswith(b"\n"):
                    rest = f.readline(JSON_BLOCK_BYTES)
                    if len(rest) == JSON_BLOCK_BYTES and not rest.endswith(b"\n"):
                        raise _long_line(path, "jsonl", JSON_BLOCK_BYTES)
                    block += rest
                yield line, block
                line += block.count(b"\n")
    except _DAMAGED as exc:
        raise _damaged(path, exc) from None


def _jsonl_batches(piece: Piece, columns: list, skip: bool, report: ParseReport):
    import pyarrow.json as pjson

    path, seen_columns = piece.path, False
    names = {c: c for c in columns}  # the file's spelling of each column (`_resolve`)
    _check_not_parquet(path, "jsonl")
    for first_line, block in _jsonl_blocks(path):
        table = None
        try:
            table = pjson.read_json(io.BytesIO(block), read_options=pjson.ReadOptions(
                use_threads=False, block_size=len(block) + 1))
        except pa.ArrowInvalid:
            pass  # a malformed line or a changing type: line by line below
        if table is not None and table.num_rows == 0:
            continue
        if table is not None and not seen_columns:
            names.update(_resolve(path, columns, table.column_names,
                                  "fields (in its first lines)"))
        if table is not None:
            lines = None

            def where(k: int, block=block, first_line=first_line) -> str:
                numbers = [first_line + i for i, text in enumerate(block.split(b"\n"))
                           if text.strip()]
                return f"{path}, line {numbers[k]}"

            arrays = {c: (table.column(names[c]).combine_chunks()
                          if names[c] in table.column_names else pa.nulls(table.num_rows))
                      for c in columns}
        else:
            arrays, lines = _jsonl_by_line(path, block, first_line, names, skip, report,
                                           require_columns=not seen_columns)
            if lines is None:
                continue

            def where(k: int, lines=lines) -> str:
                return f"{path}, line {lines[k]}"
        seen_columns = True
        rows = len(arrays[columns[0]])
        report.rows += rows
        report.lines += rows
        yield Batch(arrays, where, path)


def _jsonl_by_line(path: str, block: bytes, first_line: int, names: dict, skip: bool,
                   report: ParseReport, require_columns: bool):
    """The slow path: ``json.loads`` per line; values of mixed types become text.
    ``names``: ``{column: the file's spelling}``, updated on the first line when
    ``require_columns``."""
    columns = list(names)
    values: dict = {c: [] for c in columns}
    lines, keys = [], None
    for number, raw in enumerate(block.split(b"\n"), start=first_line):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            report.lines += 1
            _skip_or_raise(f"{path}, line {number}: {str(exc).splitlines()[0]}: "
                           f"{raw[:200].decode('utf-8', 'replace')!r}", skip, report)
            continue
        if keys is None:
            keys = list(record)
            if require_columns:
                names.update(_resolve(path, columns, keys, "fields (on its first line)"))
        lines.append(number)
        for c in columns:
            values[c].append(record.get(names[c]))
    if not lines:
        return None, None
    return {c: _arrow_values(v) for c, v in values.items()}, lines


def _arrow_values(values: list) -> pa.Array:
    """Numbers stay numbers; a column that holds any text becomes text; values that
    are neither (lists, objects, booleans) become nulls (malformed where required)."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int}:
        return pa.array(values, pa.int64())
    if kinds <= {int, float}:
        return pa.array(values, pa.float64())
    return pa.array([v if isinstance(v, str) else
                     str(v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                     else None for v in values], pa.string())
