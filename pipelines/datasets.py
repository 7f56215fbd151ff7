"""MovieLens-1M and Steam loaders: local files first, official download otherwise.

Where the files are looked for, in order:

1. ``data_dir`` (the ``--data-dir`` flag), else the ``TFRS_LOGQ_DATA_DIR`` variable;
2. the download cache ``~/.cache/tfrs_logq`` (``TFRS_LOGQ_CACHE_DIR``), where an
   official archive is downloaded with a progress bar and checked against its
   published checksum when the machine is online.

Offline with no local copy, the error names the file to fetch and where to put it.
Every source is parsed streamed, line by line, and the preprocessed result is
cached (``interactions.npz`` + ``manifest.json``, written atomically) so a
second run starts in about a second.

Data terms: MovieLens and Steam are licensed for research use and may not be
redistributed; nothing here ships any of it.
"""

from __future__ import annotations

import array
import ast
import csv
import datetime
import glob
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from typing import Optional

import numpy as np
from tfrs_logq.pipelines.interactions import (
    Interactions,
    ParseReport,
    build_interactions,
    cache_key,
    load_cache,
    open_text,
    parse_lines,
    save_cache,
)

DATASETS = ("ml-1m", "steam")
ML1M_URL = "https://files.grouplens.org/datasets/movielens/ml-1m.zip"
ML1M_SHA256 = "a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20"
STEAM_URL = "https://cseweb.ucsd.edu/~wckang/steam_reviews.json.gz"
STEAM_SHA256 = "40c6343deedf488689987749c5f8435233da48c163fbaa2a7766c215d584bc61"


class DataNotFoundError(FileNotFoundError):
    """No local copy and no way to download one; the message says what to fetch."""


def cache_dir() -> str:
    return os.environ.get(
        "TFRS_LOGQ_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "tfrs_logq")
    )


def _candidates(data_dir: Optional[str], patterns: list[str]) -> list[str]:
    roots = [d for d in (data_dir, os.environ.get("TFRS_LOGQ_DATA_DIR"), cache_dir()) if d]
    found = []
    for root in roots:
        for pattern in patterns:
            found.extend(sorted(glob.glob(os.path.join(root, pattern))))
        if found:
            break  # the first root with a match wins (a local path beats the cache)
    return found


def download(url: str, sha256: str, destination: str) -> str:
    """Downloads ``url`` to ``destination`` with a progress bar, verifying sha256;
    the file appears only once complete and verified."""
    from tqdm import tqdm

    os.makedirs(os.path.dirname(destination), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(destination), prefix=".download-")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=30) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=os.path.basename(url)) as bar:
                for block in iter(lambda: response.read(1 << 20), b""):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
        if digest.hexdigest() != sha256:
            raise OSError(f"checksum mismatch for {url}: got {digest.hexdigest()}, "
                          f"expected {sha256}")
        os.replace(tmp, destination)
        return destination
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _fetch_or_explain(url: str, sha256: str, filename: str, what: str, download_ok: bool) -> str:
    destination = os.path.join(cache_dir(), filename)
    hint = (f"{what} not found. Put {filename} (from {url}) in a directory and pass "
            f"--data-dir DIR (or set TFRS_LOGQ_DATA_DIR=DIR), or place it at {destination}.")
    if not download_ok:
        raise DataNotFoundError(hint)
    try:
        return download(url, sha256, destination)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
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
    report = report if report is not None else ParseReport()

    def parse(row_text: str):
        if not row_text.strip():
            return None
        fields = next(csv.reader([row_text]))
        if fields[:3] == ["user", "item", "timestamp"]:
            return None
        if len(fields) != 3:
            raise ValueError(f"expected user,item,timestamp, got {len(fields)} fields")
        return fields[0], fields[1], int(fields[2])

    return tuple(_read(path, parse, 3, skip_bad_lines=skip_bad_lines, report=report,
                       encoding="utf-8"))


# ---------------------------------------------------------------------------- loaders


def _cached(source: str, params: dict, build) -> Interactions:
    directory = os.path.join(cache_dir(), "preprocessed", cache_key(source, params))
    cached = load_cache(directory)
    if cached is not None:
        return cached
    interactions = build()
    save_cache(interactions, directory, {"source": os.path.abspath(source), "params": params})
    return interactions


def find_ml1m(data_dir: Optional[str], fmt: str, download_ok: bool = True) -> str:
    """Path of the ML-1M file of format ``ratings`` or ``sasrec``."""
    if fmt == "sasrec":
        found = _candidates(data_dir, ["ml-1m.txt", "ml-1m.txt.gz", "ml-1m-sasrec/ml-1m.txt*",
                                       "*/ml-1m.txt", "*/ml-1m.txt.gz"])
        if not found:
            raise DataNotFoundError(
                "SASRec's ml-1m.txt not found: put ml-1m.txt (from the SASRec repository, "
                "data/ml-1m.txt) in DIR and pass --data-dir DIR (or set TFRS_LOGQ_DATA_DIR).")
        return found[0]
    found = _candidates(data_dir, ["ml-1m.zip", "ratings.dat", "ratings.dat.gz",
                                   "ml-1m/ratings.dat", "ml-1m/ratings.dat.gz",
                                   "*/ratings.dat", "*/ratings.dat.gz"])
    if found:
        return found[0]
    return _fetch_or_explain(ML1M_URL, ML1M_SHA256, "ml-1m.zip", "MovieLens-1M ratings.dat",
                             download_ok)


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
        ``fmt="sasrec"``) ``ml-1m.txt[.gz]``.
      fmt: ``"ratings"`` (the official file, with timestamps) or ``"sasrec"``
        (SASRec's preprocessed ``ml-1m.txt``: its ids and order kept, no times;
        the file gSASRec and BERT4Rec results were produced on).
      min_item_interactions: items with fewer interactions are removed.
        Defaults to 5 (SASRec's preprocessing; a no-op on ``ml-1m.txt``).
      skip_bad_lines: skip and count malformed lines instead of failing.
      download_ok: download the official archive when no local copy exists.
      use_cache: read/write the preprocessed cache.
    """
    if fmt not in ("ratings", "sasrec"):
        raise ValueError(f"`fmt` must be 'ratings' or 'sasrec', received {fmt!r}.")
    path = find_ml1m(data_dir, fmt, download_ok)
    params = {"dataset": "ml-1m", "fmt": fmt, "min_item": min_item_interactions,
              "skip": skip_bad_lines}

    def build():
        if fmt == "sasrec":
            users, items = read_sasrec_txt(path, skip_bad_lines=skip_bad_lines)
            return build_interactions(users, items, None, reindex=False,
                                      min_item_interactions=min_item_interactions,
                                      name="ml-1m (SASRec ml-1m.txt)")
        users, items, times = read_ratings_dat(path, skip_bad_lines=skip_bad_lines)
        return build_interactions(users, items, times,
                                  min_item_interactions=min_item_interactions, name="ml-1m")

    return _cached(path, params, build) if use_cache else build()


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


def load_steam(
    data_dir: Optional[str] = None,
    *,
    min_item_interactions: int = 5,
    skip_bad_lines: bool = False,
    download_ok: bool = True,
    use_cache: bool = True,
) -> Interactions:
    """Steam (Kang & McAuley 2018) from ``steam_reviews.json.gz`` or a
    ``user,item,timestamp`` CSV (``steam.csv``) in ``data_dir``."""
    found = _candidates(data_dir, ["steam_reviews.json.gz", "steam_reviews.json",
                                   "steam.csv", "steam.csv.gz", "*/steam_reviews.json.gz"])
    path = found[0] if found else _fetch_or_explain(
        STEAM_URL, STEAM_SHA256, "steam_reviews.json.gz", "Steam steam_reviews.json.gz",
        download_ok)
    params = {"dataset": "steam", "min_item": min_item_interactions, "skip": skip_bad_lines}

    def build():
        reader = read_interactions_csv if ".csv" in os.path.basename(path) else \
            read_steam_reviews
        users, items, times = reader(path, skip_bad_lines=skip_bad_lines)
        return build_interactions(users, items, times,
                                  min_item_interactions=min_item_interactions, name="steam")

    return _cached(path, params, build) if use_cache else build()


def load_dataset(name: str, data_dir: Optional[str] = None, *, needs_timestamps: bool = False,
                 **kwargs) -> Interactions:
    """``ml-1m`` or ``steam``. For ML-1M without timestamps needed, the SASRec file is
    used when it is the one present."""
    if name == "ml-1m":
        fmt = kwargs.pop("fmt", None)
        if fmt is None:
            fmt = "ratings"
            if not needs_timestamps:
                try:
                    find_ml1m(data_dir, "ratings", download_ok=False)
                except DataNotFoundError:
                    fmt = "sasrec"
        return load_movielens_1m(data_dir, fmt=fmt, **kwargs)
    if name == "steam":
        return load_steam(data_dir, **kwargs)
    raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}.")
