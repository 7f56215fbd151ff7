"""MovieLens-1M and Steam loaders: one explicit data directory, or the official download.

Where the files are looked for (one place, never a fallback from one to the next):

1. ``data_dir`` (the ``--data-dir`` flag), when given: it must be an existing
   directory, and only it is searched;
2. else ``$TFRS_LOGQ_DATA_DIR``, when set (the same rules);
3. else the download cache ``~/.cache/tfrs_logq`` (``$TFRS_LOGQ_CACHE_DIR``; see
   `tfrs_logq._util.cache.cache_dir`), where
   an official archive (``ml-1m.zip``, ``steam_reviews.json.gz``) is downloaded with
   a progress bar and checked against its published checksum.

In that directory a file is looked for at the top level and one level down
(``DIR/ratings.dat`` or ``DIR/ml-1m/ratings.dat``). When more than one file
qualifies the loader does not guess: the error names the candidates and the flag
that picks one (``--data-format`` between MovieLens's ``ratings.dat`` and SASRec's
``ml-1m.txt``; a narrower ``--data-dir`` between two files of one format).
SASRec's ``ml-1m.txt`` has no official download and is never downloaded; a
temporal split needs timestamps, which it does not have.

Every source is parsed streamed, line by line; the result records the file, its
format, the rows read and the malformed lines skipped, and the loader logs them
(logger ``tfrs_logq.data``). The preprocessed result is cached
(``interactions.npz`` + ``manifest.json``, written atomically, checked on every
read, rebuilt when damaged) so a second run starts in about a second.

Data terms: MovieLens and Steam are licensed for research use and may not be
redistributed; nothing here ships any of it.
"""

from __future__ import annotations

import array
import ast
import csv
import datetime
import glob
import logging
import os
from typing import Optional

import numpy as np

from tfrs_logq._util.cache import cache_dir  # the one cache location (re-exported here)
from tfrs_logq.pipelines.interactions import (
    DataFormatError,
    Interactions,
    ParseReport,
    build_interactions,
    cache_key,
    load_cache,
    open_text,
    parse_lines,
    save_cache,
)
from tfrs_logq.pipelines.splits import Split, make_split

log = logging.getLogger("tfrs_logq.data")

DATASETS = ("ml-1m", "steam")
ML1M_FORMATS = ("ratings", "sasrec")  # MovieLens's ratings.dat, SASRec's ml-1m.txt
# The test (and validation) fraction of the temporal split, per dataset (the paper's).
DEFAULT_TEMPORAL_FRACTION = {"ml-1m": 0.1, "steam": 0.01}
ML1M_URL = "https://files.grouplens.org/datasets/movielens/ml-1m.zip"
ML1M_SHA256 = "a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20"
STEAM_URL = "https://cseweb.ucsd.edu/~wckang/steam_reviews.json.gz"
STEAM_SHA256 = "40c6343deedf488689987749c5f8435233da48c163fbaa2a7766c215d584bc61"
SASREC_ML1M = "data/ml-1m.txt of the SASRec repository (github.com/kang205/SASRec)"

# File names per source format, looked for in the data directory and one level down.
_PATTERNS = {
    "ratings": ["ml-1m.zip", "ratings.dat", "ratings.dat.gz"],
    "sasrec": ["ml-1m.txt", "ml-1m.txt.gz"],
    "steam": ["steam_reviews.json.gz", "steam_reviews.json", "steam.csv", "steam.csv.gz"],
}
_DESCRIPTION = {
    "ratings": "MovieLens's ratings.dat",
    "sasrec": "SASRec's ml-1m.txt",
    "steam": "Steam reviews",
}


class DataNotFoundError(FileNotFoundError):
    """No usable local copy and no way to download one; the message says what to fetch."""


class AmbiguousDataError(ValueError):
    """Several files could be the data; the message names them and the flag that picks."""


def _checked_cache_dir() -> str:
    root = cache_dir()
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(
            f"the cache directory {root} (TFRS_LOGQ_CACHE_DIR, default ~/.cache/tfrs_logq) is "
            "not a directory: point TFRS_LOGQ_CACHE_DIR at a directory, or pass --no-cache "
            "(use_cache=False) with --data-dir.")
    return root


def data_root(data_dir: Optional[str] = None) -> tuple[str, str]:
    """The one directory searched and how it was chosen: ``(directory, origin)``,
    ``origin`` one of ``"--data-dir"``, ``"TFRS_LOGQ_DATA_DIR"``, ``"cache"``.

    Raises:
      ValueError: ``data_dir`` is the empty string.
      DataNotFoundError: the directory given does not exist.
      NotADirectoryError: it is a file.
    """
    if data_dir is not None:
        if not str(data_dir).strip():
            raise ValueError("--data-dir is empty: give the directory that holds the data, or "
                             "leave the flag out to use $TFRS_LOGQ_DATA_DIR or the download "
                             "cache.")
        root, origin = str(data_dir), "--data-dir"
    elif os.environ.get("TFRS_LOGQ_DATA_DIR", "").strip():
        root, origin = os.environ["TFRS_LOGQ_DATA_DIR"], "TFRS_LOGQ_DATA_DIR"
    else:
        return _checked_cache_dir(), "cache"
    flag = "--data-dir" if origin == "--data-dir" else "$TFRS_LOGQ_DATA_DIR"
    if not os.path.exists(root):
        raise DataNotFoundError(f"{flag} {root} does not exist.")
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{flag} {root} is a file; give the directory that holds it.")
    return root, origin


def _candidates(root: str, kind: str) -> list[str]:
    """Files of one source format in ``root`` and one level below, sorted by path."""
    found = {}
    for pattern in _PATTERNS[kind]:
        for sub in ("", "*"):
            for path in glob.glob(os.path.join(root, sub, pattern)):
                if os.path.isfile(path):
                    found.setdefault(os.path.realpath(path), path)
    return sorted(found.values())


def _where(root: str, origin: str) -> str:
    return {"--data-dir": f"--data-dir {root}", "TFRS_LOGQ_DATA_DIR":
            f"$TFRS_LOGQ_DATA_DIR ({root})", "cache": f"the download cache {root}"}[origin]


def _one(paths: list[str], kind: str, root: str, origin: str) -> str:
    if len(paths) > 1:
        raise AmbiguousDataError(
            f"several {_DESCRIPTION[kind]} files in {_where(root, origin)}: "
            f"{', '.join(paths)}; point --data-dir at the directory that holds the one to use.")
    return paths[0]


def _looked_for(kind: str) -> str:
    names = _PATTERNS[kind]
    return ", ".join(names) + " (at the top level or one directory down)"


def download(url: str, sha256: str, destination: str) -> str:
    """Downloads ``url`` to ``destination`` with a progress bar, verifying sha256;
    the file appears only once complete and verified.

    `pooch.retrieve` does the work: it streams into a temporary file beside
    ``destination``, checks the hash, and only then moves it into place (a failed,
    interrupted or altered download leaves no file); a ``destination`` that already
    holds the right bytes is not downloaded again.

    Raises:
      OSError: the download failed (network, HTTP status, timeout), or what arrived does
        not match ``sha256`` ("checksum mismatch"). One line.
    """
    import pooch
    import requests

    directory, name = os.path.split(os.path.abspath(destination))
    downloader = pooch.HTTPDownloader(progressbar=True, timeout=30)
    try:
        return pooch.retrieve(url, known_hash=f"sha256:{sha256}", fname=name, path=directory,
                              downloader=downloader)
    except ValueError as exc:  # pooch: the hash does not match (the download was deleted)
        if "hash" not in str(exc):
            raise
        raise OSError(f"checksum mismatch for {url}: expected sha256 {sha256}, received "
                      f"other bytes (nothing was kept)") from None
    except requests.RequestException as exc:
        raise OSError(f"downloading {url} failed: {' '.join(str(exc).split())}") from None


def _fetch_or_explain(url: str, sha256: str, filename: str, kind: str, root: str, origin: str,
                      download_ok: bool) -> str:
    """Downloads ``filename`` into the cache when that is where data is looked for;
    otherwise (or offline) explains what to fetch and where to put it."""
    what = _DESCRIPTION[kind]
    if origin != "cache":
        raise DataNotFoundError(
            f"no {what} in {_where(root, origin)} (looked for {_looked_for(kind)}). Put "
            f"{filename} (from {url}) there, or leave out --data-dir and $TFRS_LOGQ_DATA_DIR "
            f"to download it into the cache {cache_dir()}.")
    destination = os.path.join(root, filename)
    hint = (f"{what} not found. Put {filename} (from {url}) in a directory and pass "
            f"--data-dir DIR (or set TFRS_LOGQ_DATA_DIR=DIR), or place it at {destination}.")
    if not download_ok:
        raise DataNotFoundError(f"{hint} (downloading is off: --no-download)")
    try:
        return download(url, sha256, destination)
    except OSError as exc:
        raise DataNotFoundError(f"{hint} (download failed: {exc})") from None


# ---------------------------------------------------------------------------- parsers


def _parse_ratings_dat(line: str):
    if not line.strip():
        return None
    fields = line.rstrip("\r\n").split("::")
    if len(fields) != 4:
        raise ValueError(f"expected UserID::MovieID::Rating::Timestamp, got {len(fields)} fields")
    return int(fields[0]), int(fields[1]), int(fields[3])


def _parse_sasrec(line: str):
    if not line.strip():
        return None
    fields = line.split()
    if len(fields) != 2:
        raise ValueError(f"expected 'user item', got {len(fields)} fields")
    return int(fields[0]), int(fields[1])


def _parse_steam_review(line: str):
    if not line.strip():
        return None
    record = ast.literal_eval(line)
    if not isinstance(record, dict):
        raise ValueError("expected a Python dict literal")
    day = datetime.date.fromisoformat(record["date"])
    timestamp = int(datetime.datetime(day.year, day.month, day.day,
                                      tzinfo=datetime.timezone.utc).timestamp())
    return str(record["username"]), str(record["product_id"]), timestamp


def _parse_interactions_csv(line: str):
    if not line.strip():
        return None
    fields = next(csv.reader([line]))
    if fields[:3] == ["user", "item", "timestamp"]:
        return None
    if len(fields) != 3:
        raise ValueError(f"expected user,item,timestamp, got {len(fields)} fields")
    return fields[0], fields[1], int(fields[2])


def _read(path, parse, n_fields, *, member=None, skip_bad_lines=False, report=None,
          encoding="latin-1"):
    """Streams ``path`` into ``n_fields`` columns in bounded memory: each field is
    packed into an int64 ``array`` as it is read (string fields through a
    vocabulary of distinct values, returned as the column's decoded values)."""
    columns = [array.array("q") for _ in range(n_fields)]
    vocabs: list[Optional[dict]] = [None] * n_fields
    with open_text(path, member=member, encoding=encoding) as f:
        rows = parse_lines(f, parse, path if member is None else f"{path}:{member}",
                           skip_bad_lines=skip_bad_lines, report=report)
        for row in rows:
            for k, value in enumerate(row):
                if isinstance(value, str):
                    vocab = vocabs[k]
                    if vocab is None:
                        vocab = vocabs[k] = {}
                    value = vocab.setdefault(value, len(vocab))
                columns[k].append(value)
    out = []
    for column, vocab in zip(columns, vocabs):
        codes = np.frombuffer(column, dtype=np.int64) if len(column) else np.zeros(0, np.int64)
        if vocab is not None:
            values = np.asarray(list(vocab), dtype=str)
            out.append(values[codes])
        else:
            out.append(codes)
    return out


def read_ratings_dat(path: str, *, skip_bad_lines: bool = False,
                     report: Optional[ParseReport] = None):
    """``(user, item, timestamp)`` arrays from ``ratings.dat`` (plain, .gz or ml-1m.zip)."""
    member = "ml-1m/ratings.dat" if path.endswith(".zip") else None
    return tuple(_read(path, _parse_ratings_dat, 3, member=member,
                       skip_bad_lines=skip_bad_lines, report=report))


def read_sasrec_txt(path: str, *, skip_bad_lines: bool = False,
                    report: Optional[ParseReport] = None):
    """``(user, item)`` arrays from SASRec's ``user item`` files (time-ordered per user)."""
    return tuple(_read(path, _parse_sasrec, 2, skip_bad_lines=skip_bad_lines, report=report))


def read_steam_reviews(path: str, *, skip_bad_lines: bool = False,
                       report: Optional[ParseReport] = None):
    """``(user, item, timestamp)`` from ``steam_reviews.json.gz`` (one dict literal a line);
    a review's ``date`` (a day) becomes midnight UTC."""
    return tuple(_read(path, _parse_steam_review, 3, skip_bad_lines=skip_bad_lines,
                       report=report, encoding="utf-8"))


def read_interactions_csv(path: str, *, skip_bad_lines: bool = False,
                          report: Optional[ParseReport] = None):
    """``(user, item, timestamp)`` from a ``user,item,timestamp`` CSV (header optional)."""
    return tuple(_read(path, _parse_interactions_csv, 3, skip_bad_lines=skip_bad_lines,
                       report=report, encoding="utf-8"))


# ---------------------------------------------------------------------------- loaders


def _build(path: str, fmt: str, read, make, skip_bad_lines: bool) -> Interactions:
    """Reads ``path`` with ``read`` and preprocesses with ``make``; the result records
    its provenance, and any error names the file."""
    report = ParseReport()
    columns = read(path, skip_bad_lines=skip_bad_lines, report=report)
    if len(columns[0]) == 0:
        raise DataFormatError(f"{path}: no interactions ({report.lines} lines read, "
                              f"{report.skipped} skipped as malformed).")
    try:
        interactions = make(*columns)
    except ValueError as exc:
        raise DataFormatError(f"{path}: {exc}") from None
    if len(interactions) == 0:
        raise DataFormatError(f"{path}: no interactions left after preprocessing ({report.rows} "
                              "rows read; every item has fewer interactions than the minimum).")
    interactions.source = os.path.abspath(path)
    interactions.data_format = fmt
    interactions.num_rows = report.rows
    interactions.skipped_lines = report.skipped
    return interactions


def _load(path: str, fmt: str, params: dict, build, use_cache: bool) -> Interactions:
    if not use_cache:
        return build()
    directory = os.path.join(_checked_cache_dir(), "preprocessed", cache_key(path, params))
    cached = load_cache(directory)
    if cached is not None:
        return cached
    interactions = build()
    try:
        save_cache(interactions, directory, {"params": params})
    except OSError as exc:  # the data is fine; only the next start is slower
        log.warning("could not write the cache %s (%s); continuing without it", directory, exc)
    return interactions


def describe(interactions: Interactions, skip_bad_lines: bool = False) -> str:
    """One line: the file used, its format and the rows read (and skipped)."""
    rows = f"{interactions.num_rows:,} rows"
    if skip_bad_lines or interactions.skipped_lines:
        n = interactions.skipped_lines
        rows += f", {n:,} malformed line{'' if n == 1 else 's'} skipped"
    label = _DESCRIPTION.get(interactions.data_format, interactions.data_format)
    return (f"{interactions.name}: {interactions.source} ({label}): {rows}; "
            f"{len(interactions):,} interactions, {interactions.num_users:,} users, "
            f"{interactions.num_items:,} items after preprocessing")


def resolve_ml1m(data_dir: Optional[str] = None, fmt: Optional[str] = None, *,
                 needs_timestamps: bool = False, download_ok: bool = True) -> tuple[str, str]:
    """The ML-1M file to read and its format, ``(path, fmt)``.

    ``fmt`` None picks the format from what the data directory holds: with
    ``needs_timestamps`` only ``ratings`` qualifies; otherwise either does, and a
    directory holding both is an `AmbiguousDataError`.

    Raises:
      ValueError: the temporal split (``needs_timestamps``) asked of SASRec's file.
      AmbiguousDataError: several files qualify.
      DataNotFoundError: none does (and none can be downloaded).
    """
    if fmt is not None and fmt not in ML1M_FORMATS:
        raise ValueError(f"--data-format must be one of {ML1M_FORMATS} for ml-1m, received "
                         f"{fmt!r}.")
    if fmt == "sasrec" and needs_timestamps:
        raise ValueError("the temporal split needs timestamps; SASRec's ml-1m.txt "
                         "(--data-format sasrec) has none: use --split loo or --split gsasrec, "
                         "or --data-format ratings with MovieLens's ratings.dat.")
    root, origin = data_root(data_dir)
    found = {kind: _candidates(root, kind) for kind in ML1M_FORMATS}
    if fmt is None:
        if needs_timestamps:
            if not found["ratings"] and found["sasrec"]:
                raise ValueError(
                    f"the temporal split needs timestamps; {', '.join(found['sasrec'])} "
                    "(SASRec's ml-1m.txt) has none: use --split loo or --split gsasrec, or give "
                    "ratings.dat (a --data-dir holding ratings.dat or ml-1m.zip).")
            fmt = "ratings"
        elif found["ratings"] and found["sasrec"]:
            raise AmbiguousDataError(
                f"{_where(root, origin)} holds both MovieLens's ratings "
                f"({', '.join(found['ratings'])}) and SASRec's ml-1m.txt "
                f"({', '.join(found['sasrec'])}), and this split can use either: choose one "
                "with --data-format ratings or --data-format sasrec.")
        else:
            fmt = "ratings" if found["ratings"] else "sasrec"
    if found[fmt]:
        return _one(found[fmt], fmt, root, origin), fmt
    if fmt == "sasrec":
        raise DataNotFoundError(
            f"no SASRec ml-1m.txt in {_where(root, origin)} (looked for "
            f"{_looked_for('sasrec')}). It has no official download, so it is never "
            f"downloaded: copy {SASREC_ML1M} into a directory and pass --data-dir DIR, or pass "
            "--data-format ratings to build the split from MovieLens's ratings.dat "
            "(ml-1m.zip, downloaded when no --data-dir is given; the same preprocessing, "
            "MovieLens's own ids).")
    return _fetch_or_explain(ML1M_URL, ML1M_SHA256, "ml-1m.zip", "ratings", root, origin,
                             download_ok), fmt


def find_ml1m(data_dir: Optional[str], fmt: str, download_ok: bool = True) -> str:
    """Path of the ML-1M file of format ``ratings`` or ``sasrec``."""
    return resolve_ml1m(data_dir, fmt, download_ok=download_ok)[0]


def load_movielens_1m(
    data_dir: Optional[str] = None,
    *,
    fmt: str = "ratings",
    min_item_interactions: int = 5,
    skip_bad_lines: bool = False,
    download_ok: bool = True,
    use_cache: bool = True,
) -> Interactions:
    """MovieLens-1M as implicit feedback.

    Args:
      data_dir: directory holding ``ml-1m.zip``, ``ratings.dat[.gz]`` or (for
        ``fmt="sasrec"``) ``ml-1m.txt[.gz]``, at its top level or one level down.
        Defaults to ``$TFRS_LOGQ_DATA_DIR``, else the download cache.
      fmt: ``"ratings"`` (the official file, with timestamps) or ``"sasrec"``
        (SASRec's preprocessed ``ml-1m.txt``: its ids and order kept, no times;
        the file gSASRec and BERT4Rec results were produced on). Defaults to
        ``"ratings"``.
      min_item_interactions: items with fewer interactions are removed.
        Defaults to 5 (SASRec's preprocessing; a no-op on ``ml-1m.txt``).
      skip_bad_lines: skip and count malformed lines instead of failing.
        Defaults to False.
      download_ok: download the official archive when no local copy exists (only
        when neither ``data_dir`` nor ``$TFRS_LOGQ_DATA_DIR`` is given). Defaults to True.
      use_cache: read/write the preprocessed cache. Defaults to True.
    """
    path, fmt = resolve_ml1m(data_dir, fmt, download_ok=download_ok)
    return _load_ml1m(path, fmt, min_item_interactions, skip_bad_lines, use_cache)


def _load_ml1m(path: str, fmt: str, min_item_interactions: int, skip_bad_lines: bool,
               use_cache: bool) -> Interactions:
    params = {"dataset": "ml-1m", "fmt": fmt, "min_item": min_item_interactions,
              "skip": skip_bad_lines}

    def build():
        if fmt == "sasrec":
            return _build(path, fmt, read_sasrec_txt, lambda users, items: build_interactions(
                users, items, None, reindex=False, min_item_interactions=min_item_interactions,
                name="ml-1m"), skip_bad_lines)
        return _build(path, fmt, read_ratings_dat, lambda users, items, times: build_interactions(
            users, items, times, min_item_interactions=min_item_interactions, name="ml-1m"),
            skip_bad_lines)

    return _load(path, fmt, params, build, use_cache)


def load_movielens_1m_tfds(data_dir: Optional[str] = None, min_item_interactions: int = 5):
    """MovieLens-1M through ``tensorflow-datasets`` (``movielens/1m-ratings``)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as exc:
        raise ImportError("install the `data` extra (pip install 'tfrs-logq[data]') to load "
                          "MovieLens through tensorflow-datasets") from exc
    ds = tfds.load("movielens/1m-ratings", split="train", data_dir=data_dir)
    ds = ds.map(lambda x: (x["user_id"], x["movie_id"], x["timestamp"]))
    users, items, times = [], [], []
    for user, item, time in ds.batch(65536).as_numpy_iterator():
        # TFDS stores the official ids as strings ("138"); kept as such.
        users.append(user.astype(str))
        items.append(item.astype(str))
        times.append(time.astype(np.int64))
    return build_interactions(np.concatenate(users), np.concatenate(items),
                              np.concatenate(times),
                              min_item_interactions=min_item_interactions, name="ml-1m (tfds)")


def resolve_steam(data_dir: Optional[str] = None, *,
                  download_ok: bool = True) -> tuple[str, str]:
    """The Steam file to read and its format, ``(path, fmt)``: ``steam_reviews.json[.gz]``
    (``steam``) or a ``user,item,timestamp`` CSV (``csv``), found in ``data_dir`` as
    `resolve_ml1m` finds ML-1M's, else downloaded (unless ``download_ok`` is False).

    Raises:
      AmbiguousDataError: several files qualify.
      DataNotFoundError: none does (and none can be downloaded).
    """
    root, origin = data_root(data_dir)
    found = _candidates(root, "steam")
    path = _one(found, "steam", root, origin) if found else _fetch_or_explain(
        STEAM_URL, STEAM_SHA256, "steam_reviews.json.gz", "steam", root, origin, download_ok)
    return path, "csv" if ".csv" in os.path.basename(path) else "steam"


def load_steam(
    data_dir: Optional[str] = None,
    *,
    min_item_interactions: int = 5,
    skip_bad_lines: bool = False,
    download_ok: bool = True,
    use_cache: bool = True,
) -> Interactions:
    """Steam (Kang & McAuley 2018) from ``steam_reviews.json.gz`` or a
    ``user,item,timestamp`` CSV (``steam.csv``) in ``data_dir`` (resolved as for
    `load_movielens_1m`; arguments as there)."""
    path, fmt = resolve_steam(data_dir, download_ok=download_ok)
    is_csv = fmt == "csv"
    params = {"dataset": "steam", "min_item": min_item_interactions, "skip": skip_bad_lines}

    def build():
        return _build(path, fmt, read_interactions_csv if is_csv else read_steam_reviews,
                      lambda users, items, times: build_interactions(
                          users, items, times, min_item_interactions=min_item_interactions,
                          name="steam"), skip_bad_lines)

    return _load(path, fmt, params, build, use_cache)


def load_dataset(name: str, data_dir: Optional[str] = None, *, needs_timestamps: bool = False,
                 fmt: Optional[str] = None, skip_bad_lines: bool = False,
                 download_ok: bool = True, use_cache: bool = True,
                 min_item_interactions: int = 5) -> Interactions:
    """``ml-1m`` or ``steam``, resolved as the module docstring says, and logged (the
    file, its format and the rows read) to the ``tfrs_logq.data`` logger.

    Args:
      name: one of `DATASETS`.
      data_dir: the data directory (``--data-dir``). Defaults to
        ``$TFRS_LOGQ_DATA_DIR``, else the download cache.
      needs_timestamps: only sources with timestamps qualify (the temporal split).
        Defaults to False.
      fmt: ML-1M's source format, one of `ML1M_FORMATS` (``--data-format``).
        Defaults to None: whichever the data directory holds.
      skip_bad_lines, download_ok, use_cache, min_item_interactions: as in
        `load_movielens_1m`.
    """
    if name == "ml-1m":
        path, fmt = resolve_ml1m(data_dir, fmt, needs_timestamps=needs_timestamps,
                                 download_ok=download_ok)
        interactions = _load_ml1m(path, fmt, min_item_interactions, skip_bad_lines, use_cache)
    elif name == "steam":
        if fmt is not None:
            raise ValueError(f"--data-format chooses between ML-1M's files {ML1M_FORMATS}; "
                             f"steam has no such choice (received {fmt!r}).")
        interactions = load_steam(data_dir, min_item_interactions=min_item_interactions,
                                  skip_bad_lines=skip_bad_lines, download_ok=download_ok,
                                  use_cache=use_cache)
    else:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}.")
    log.info("%s", describe(interactions, skip_bad_lines))
    return interactions


def load_split(dataset: str, split: str, data_dir: Optional[str] = None, *,
               data_format: Optional[str] = None, temporal_fraction: Optional[float] = None,
               **load_options) -> Split:
    """`load_dataset` then `make_split`, with the dataset's default temporal fraction
    (`DEFAULT_TEMPORAL_FRACTION`) when ``temporal_fraction`` is None; ``load_options``
    go to `load_dataset` (``skip_bad_lines``, ``download_ok``, ``use_cache``)."""
    interactions = load_dataset(dataset, data_dir, needs_timestamps=split == "temporal",
                                fmt=data_format, **load_options)
    split_kwargs = {}
    if split == "temporal":
        split_kwargs["fraction"] = temporal_fraction or DEFAULT_TEMPORAL_FRACTION[dataset]
    return make_split(interactions, split, **split_kwargs)
