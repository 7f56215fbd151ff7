"""What a raw id is: one normalisation for every place a log's text id is read.

A text id is its characters without the white space around it: ``" SKU-000280 "``,
``"SKU-000280\\t"`` and ``"SKU-000280"`` are one id. The white space is Unicode's
``White_Space`` property (`ID_WHITESPACE`: ASCII's space, tab, line breaks, and the
no-break and typographic spaces); what is inside an id is kept as it is (case,
inner spaces, leading zeros). An id that is nothing but white space is empty: a
malformed row in a log, padding in a served history.

The same rule, written once here, runs in each layer that reads ids:

- the log readers (`tfrs_logq.pipelines.user_log`), on a pyarrow column
  (`normalize_id_column`);
- `tfrs_logq.pipelines.vocabulary.Vocabulary.to_internal`, on numpy arrays
  (`normalize_id`);
- the export's serving signatures, in the SavedModel graph (`normalize_id_tensor`),
  so a stock TF Serving answers as ``tfrs-logq serve`` does;
- ``tfrs-logq serve`` on every string id of a request (`normalize_id`), also for
  exports made before the graph did it.

    >>> normalize_id(" SKU-000280 ")
    'SKU-000280'
    >>> normalize_id("\\u00a0m 1\\t")
    'm 1'

Integer ids need no normalisation: a typed column holds numbers, and a CSV's text
ids are trimmed by this rule before they are read as numbers.

A text id is at most `MAX_ID_CHARS` characters (1,024) once trimmed: a log's row with a
longer id is malformed (`too_long_ids`). The bound keeps what a vocabulary holds in
proportion to the log: numpy keeps text ids in a fixed-width array, every id as wide as
the longest, so one 5,000,000-character id among 100,000 ids would take 2 TB.
"""

from __future__ import annotations

from typing import Union

__all__ = ["ID_WHITESPACE", "MAX_ID_CHARS", "normalize_id", "normalize_id_column",
           "normalize_id_tensor", "too_long_ids"]

# The most characters of a text id (after trimming); a longer one makes a log's row malformed.
MAX_ID_CHARS = 1024

# Unicode's White_Space property (PropList.txt), every character of it.
ID_WHITESPACE = ("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                 "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def normalize_id(raw: Union[str, bytes]) -> Union[str, bytes]:
    """``raw`` without the white space around it (`ID_WHITESPACE`).

    UTF-8 ``bytes`` (a gRPC string tensor's values) come back as UTF-8 bytes; bytes
    that are not UTF-8 come back unchanged (no text id equals them).
    """
    if isinstance(raw, str):
        return raw.strip(ID_WHITESPACE)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
    stripped = text.strip(ID_WHITESPACE)
    return raw if len(stripped) == len(text) else stripped.encode("utf-8")


def normalize_id_column(column):
    """A pyarrow string column of ids, each through `normalize_id` (in Arrow)."""
    import pyarrow.compute as pc

    return pc.utf8_trim(column, characters=ID_WHITESPACE)


def too_long_ids(column):
    """`[n]` numpy bool: which ids of a pyarrow column are longer than `MAX_ID_CHARS`
    characters (all False for a column that is not text)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return np.zeros(len(column), bool)
    longer = pc.greater(pc.utf8_length(column), MAX_ID_CHARS).fill_null(False)
    return np.asarray(longer.to_numpy(zero_copy_only=False), bool)


def _re2_class() -> str:
    return "[" + "".join(f"\\x{{{ord(c):x}}}" for c in ID_WHITESPACE) + "]"


def normalize_id_tensor(ids):
    """A ``tf.string`` tensor of UTF-8 ids, each through `normalize_id` (in the graph:
    one ``RegexReplace``, a stock TensorFlow op)."""
    import tensorflow as tf

    space = _re2_class()
    return tf.strings.regex_replace(ids, f"^{space}+|{space}+$", "")
