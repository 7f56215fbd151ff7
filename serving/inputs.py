"""A request's inputs checked against a signature: one set of rules for REST and gRPC.

Each input must arrive in its signature's kind, whatever the protocol:

- an integer input (``history`` of ids, ``k``) takes integers: JSON integers, or an
  integer tensor; a float (``101.0`` or a float32 tensor), a boolean or a string is
  INVALID_ARGUMENT, and values outside the dtype's range are refused, never wrapped;
- a boolean input (``exclude_history``) takes JSON ``true``/``false`` or a bool tensor;
  ``"false"`` (a string), ``null`` or ``0`` is INVALID_ARGUMENT naming the input;
- a string input takes strings (sent to the model as UTF-8).

TF Serving's JSON parser applies the same rules (``json_tensor.cc``: an int64 input
refuses a JSON double); gRPC's tensors carry their dtype, checked the same way.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf
from tfrs_logq.serving.errors import ServingError


def check_inputs(fn, signature_name: str, inputs: dict, *, defaults: dict,
                 k_range: Optional[tuple] = None) -> dict:
    """``inputs`` as the arrays signature ``fn`` takes (``defaults`` fill what is absent).

    Raises `ServingError` INVALID_ARGUMENT naming the input for a missing or unknown
    input, a value of the wrong kind or rank, or (``k``) a value outside ``k_range``.
    """
    specs = fn.structured_input_signature[1]
    inputs = {**{k: v for k, v in defaults.items() if k in specs}, **inputs}
    missing = sorted(set(specs) - set(inputs))
    extra = sorted(set(inputs) - set(specs))
    if missing:
        raise ServingError("INVALID_ARGUMENT", f"input(s) {missing} missing for signature "
                                               f"{signature_name!r}, which takes {sorted(specs)}")
    if extra:
        raise ServingError("INVALID_ARGUMENT", f"unknown input(s) {extra} for signature "
                                               f"{signature_name!r}, which takes {sorted(specs)}")
    out = {}
    for key, spec in specs.items():
        value = np.asarray(inputs[key])
        try:
            if spec.dtype == tf.string:
                value = _utf8_strings(value)
            elif spec.dtype.is_integer:
                value = _integers(key, value, spec.dtype.as_numpy_dtype,
                                  k_range if key == "k" else None)
            elif spec.dtype == tf.bool:
                value = _booleans(value)
            else:
                value = _floats(value, spec.dtype.as_numpy_dtype)
        except (TypeError, ValueError) as exc:
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} must be {spec.dtype.name}: {exc}") from None
        if spec.shape.rank is not None and value.ndim != spec.shape.rank:
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} must have rank {spec.shape.rank} (shape "
                               f"{spec.shape}), received shape {list(value.shape)}")
        out[key] = value
    return out


def _describe(value: np.ndarray) -> str:
    if value.dtype.kind == "O":
        kinds = sorted({"null" if x is None else type(x).__name__ for x in value.flat})
        return ", ".join(kinds) or "nothing"
    return str(value.dtype)


def _booleans(value: np.ndarray) -> np.ndarray:
    """Booleans only: a string such as ``"false"`` (which ``astype`` makes True), a null
    or a number is refused."""
    if value.dtype.kind != "b":
        sample = repr(value.flat[0])[:40] if value.size else ""
        raise TypeError(f"expected a boolean (JSON true or false), got {_describe(value)} "
                        f"{sample}".rstrip())
    return value


def _floats(value: np.ndarray, dtype) -> np.ndarray:
    if value.dtype.kind not in ("i", "u", "f"):
        raise TypeError(f"expected numbers, got {_describe(value)}")
    return value.astype(dtype)


def _utf8_strings(value: np.ndarray) -> np.ndarray:
    """Strings (JSON text, or bytes from a tensor proto) as UTF-8 bytes for a tf.string input."""
    kind = value.dtype.kind
    if kind not in ("U", "S", "O"):
        raise TypeError(f"expected strings, got {value.dtype}")
    if kind == "S":
        return value
    if kind == "U":
        return np.char.encode(value, "utf-8")  # numpy's astype(bytes) would be ASCII only
    encoded = np.empty(value.shape, dtype=object)
    for index, item in np.ndenumerate(value):
        if isinstance(item, (bytes, np.bytes_)):
            encoded[index] = bytes(item)
        elif isinstance(item, str):
            encoded[index] = item.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
        else:
            raise TypeError(f"expected strings, got {type(item).__name__} {item!r:.40}")
    return encoded


def _integers(key: str, value: np.ndarray, dtype, k_range: Optional[tuple] = None) -> np.ndarray:
    """``value`` as the integer ``dtype``, refusing floats and what ``astype`` would wrap.

    Python ints too large for int64 arrive as an object array and are range-checked
    like the rest. ``k_range`` replaces the dtype's range for the scalar ``k``.
    """
    if not value.size:  # ``[[]]`` in JSON has no element type to check
        return value.astype(dtype)
    kind = value.dtype.kind
    if kind == "O":
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                   for x in value.flat):
            raise TypeError(f"expected integers, got {_describe(value)}")
    elif kind not in ("i", "u"):
        raise TypeError(f"expected integers, got {_describe(value)}")
    lowest, highest = value.min(), value.max()
    if k_range is not None:
        if lowest < k_range[0] or highest > k_range[1]:
            raise ServingError("INVALID_ARGUMENT",
                               f"k must be in [{k_range[0]}, {k_range[1]}], got "
                               f"{lowest if lowest < k_range[0] else highest}")
    else:
        info = np.iinfo(dtype)
        if lowest < info.min or highest > info.max:
            bad = lowest if lowest < info.min else highest
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} must be {np.dtype(dtype).name}: {bad} is "
                               f"outside its range [{info.min}, {info.max}]")
    return value.astype(dtype)  # in range now: nothing wraps


__all__ = ["check_inputs"]
