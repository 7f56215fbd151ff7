"""A request's inputs checked against a signature: one set of rules for REST and gRPC.

Each input must arrive in its signature's kind, whatever the protocol:

- an integer input (``history`` of ids, ``k``) takes integers: JSON integers, or an
  integer tensor; a float (``101.0`` or a float32 tensor), a boolean or a string is
  INVALID_ARGUMENT, and values outside the dtype's range are refused, never wrapped;
- a boolean input (``exclude_history``) takes JSON ``true``/``false`` or a bool tensor;
  ``"false"`` (a string), ``null`` or ``0`` is INVALID_ARGUMENT naming the input;
- a string input takes strings: item ids, trimmed of the white space around them
  (`tfrs_logq.pipelines.ids.normalize_id`, the training log's rule) and sent to the
  model as UTF-8; kept one object a cell, so a request's memory follows its bytes
  whatever the ids' widths.

TF Serving's JSON parser applies the same rules (``json_tensor.cc``: an int64 input
refuses a JSON double); gRPC's tensors carry their dtype, checked the same way, and a
tensor's values must sit in its dtype's field (an int64 tensor carrying ``float_val`` is
refused: TensorFlow would read it as zeros).

Shapes are checked before anything is built (`check_shape`, on a gRPC tensor's declared
shape and on a JSON list's lengths): at most ``max_request_rows`` rows, and the history
at most the export's ``max_length`` wide. A 39-byte tensor declaring ``[1024, 200000]``
with one value is refused at once, never filled in.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from tfrs_logq.pipelines.ids import normalize_id
from tfrs_logq.serving.errors import ServingError, shorten

DEFAULT_MAX_WIDTH = 4096  # an input's width when the export does not say (no max_length)


@dataclasses.dataclass(frozen=True)
class ShapeLimits:
    """The largest shapes a servable takes.

    Args:
        rows: int. Most rows (the first dimension): ``max_request_rows``.
        width: int. Widest an input's other free dimensions may be: the export's
            ``max_length`` (the history). Defaults to `DEFAULT_MAX_WIDTH`.
    """

    rows: int
    width: int = DEFAULT_MAX_WIDTH


def check_shape(key: str, shape, spec, limits: ShapeLimits) -> None:
    """Refuses a shape ``spec`` does not take, or larger than ``limits``, before anything
    of that shape is built: INVALID_ARGUMENT naming the input, the shape and the limit."""
    shape = [int(d) for d in shape]
    if spec.shape.rank is not None and len(shape) != spec.shape.rank:
        raise ServingError("INVALID_ARGUMENT",
                           f"input {key!r} must have rank {spec.shape.rank} (shape "
                           f"{spec.shape}), received shape {shape[:8]}")
    if any(d < 0 for d in shape):
        raise ServingError("INVALID_ARGUMENT", f"input {key!r} declares shape {shape[:8]}: "
                                               "sizes must be at least 0")
    if not shape:
        return
    if shape[0] > limits.rows:
        raise ServingError("INVALID_ARGUMENT",
                           f"input {key!r} has {shape[0]} rows (shape {shape[:8]}); at most "
                           f"{limits.rows} rows in one request (max_request_rows)")
    if shape[0] == 0:
        raise ServingError("INVALID_ARGUMENT", f"input {key!r} has no rows")
    static = spec.shape.as_list() if spec.shape.rank is not None else [None] * len(shape)
    for axis, (size, fixed) in enumerate(zip(shape[1:], static[1:]), start=1):
        if fixed is not None and size != fixed:
            raise ServingError("INVALID_ARGUMENT", f"input {key!r} must have size {fixed} on "
                                                   f"axis {axis}, received shape {shape[:8]}")
        if fixed is None and size > limits.width:
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} has {size} items a row (shape {shape[:8]}); "
                               f"the model takes at most {limits.width}")


def check_inputs(fn, signature_name: str, inputs: dict, *, defaults: dict,
                 k_range: Optional[tuple] = None,
                 limits: Optional[ShapeLimits] = None) -> dict:
    """``inputs`` as the arrays signature ``fn`` takes (``defaults`` fill what is absent).

    Raises `ServingError` INVALID_ARGUMENT naming the input for a missing or unknown
    input, a value of the wrong kind or shape (`check_shape` with ``limits``), or
    (``k``) a value outside ``k_range``.
    """
    specs = fn.structured_input_signature[1]
    inputs = {**{k: v for k, v in defaults.items() if k in specs}, **inputs}
    missing = sorted(set(specs) - set(inputs))
    extra = sorted(set(inputs) - set(specs))
    signature = shorten(signature_name)
    if missing:
        raise ServingError("INVALID_ARGUMENT", f"input(s) {missing} missing for signature "
                                               f"{signature}, which takes {sorted(specs)}")
    if extra:
        names = ", ".join(shorten(name) for name in extra[:4])
        raise ServingError("INVALID_ARGUMENT", f"unknown input(s) [{names}] for signature "
                                               f"{signature}, which takes {sorted(specs)}")
    out = {}
    for key, spec in specs.items():
        value = np.asarray(inputs[key])
        if limits is not None:
            check_shape(key, value.shape, spec, limits)
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
        except TypeError as exc:
            if value.ndim < 2:
                raise ServingError("INVALID_ARGUMENT",
                                   f"input {key!r} must be {spec.dtype.name}: {exc}") from None
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} must be {spec.dtype.name}: its rows must be "
                               f"lists of {_NOUNS.get(_value_kind(spec.dtype), spec.dtype.name)}"
                               f", got {_describe(value)}") from None
        except ValueError as exc:
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} must be {spec.dtype.name}: {exc}") from None
        if spec.shape.rank is not None and value.ndim != spec.shape.rank:
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} must have rank {spec.shape.rank} (shape "
                               f"{spec.shape}), received shape {list(value.shape)}")
        out[key] = value
    return out


# The TensorProto field each dtype's values live in (TensorFlow's tensor.proto).
_VALUE_FIELDS = {
    tf.float32: "float_val", tf.float64: "double_val", tf.int32: "int_val",
    tf.int16: "int_val", tf.int8: "int_val", tf.uint8: "int_val", tf.uint16: "int_val",
    tf.int64: "int64_val", tf.uint32: "uint32_val", tf.uint64: "uint64_val",
    tf.bool: "bool_val", tf.string: "string_val", tf.float16: "half_val",
    tf.bfloat16: "half_val",
}
_PROTO_HEADER = {"dtype", "tensor_shape", "version_number"}


def array_from_tensor_proto(key: str, proto, spec, limits: ShapeLimits) -> np.ndarray:
    """A gRPC ``TensorProto`` as an array, checked before it is built.

    The declared shape goes through `check_shape` first (nothing is allocated for a
    shape the servable refuses); the values must sit in the dtype's own field (or
    ``tensor_content`` of exactly the declared size), at most one a declared element
    (fewer are padded with the last, TensorFlow's rule). Raises `ServingError`
    INVALID_ARGUMENT naming the input.
    """
    try:
        dtype = tf.dtypes.as_dtype(proto.dtype)
    except TypeError:
        raise ServingError("INVALID_ARGUMENT",
                           f"input {key!r} has an unknown dtype ({proto.dtype})") from None
    field = _VALUE_FIELDS.get(dtype)
    if field is None:
        raise ServingError("INVALID_ARGUMENT", f"input {key!r}: dtype {dtype.name} is not "
                                               f"supported; send {spec.dtype.name}")
    if proto.tensor_shape.unknown_rank:
        raise ServingError("INVALID_ARGUMENT", f"input {key!r} declares an unknown rank")
    shape = [d.size for d in proto.tensor_shape.dim]
    check_shape(key, shape, spec, limits)
    present = {fd.name for fd, _ in proto.ListFields()} - _PROTO_HEADER
    wrong = sorted(present - {field, "tensor_content"})
    if wrong:
        raise ServingError("INVALID_ARGUMENT",
                           f"input {key!r} is {dtype.name} but carries {', '.join(wrong)}: "
                           f"its values belong in {field}")
    size = int(np.prod(shape, dtype=np.int64))
    if "tensor_content" in present:
        if field in present or dtype == tf.string:
            raise ServingError("INVALID_ARGUMENT", f"input {key!r} carries both "
                                                   f"tensor_content and {field}")
        expected = size * dtype.size
        if len(proto.tensor_content) != expected:
            raise ServingError("INVALID_ARGUMENT",
                               f"input {key!r} declares shape {shape} of {dtype.name}: "
                               f"tensor_content must be {expected} bytes, received "
                               f"{len(proto.tensor_content)}")
    elif len(getattr(proto, field)) > size:
        raise ServingError("INVALID_ARGUMENT",
                           f"input {key!r} declares shape {shape} ({size} values) but "
                           f"carries {len(getattr(proto, field))} in {field}")
    try:
        return tf.make_ndarray(proto)
    except Exception as exc:  # noqa: BLE001  what numpy refuses, said in one line
        raise ServingError("INVALID_ARGUMENT",
                           f"malformed input tensor {key!r}: {str(exc)[:200]}") from None


_NOUNS = {"string": "strings", "integer": "integers", "bool": "booleans (true or false)",
          "float": "numbers"}


def _value_kind(dtype: tf.DType) -> str:
    """``"string"``, ``"integer"``, ``"bool"`` or ``"float"``: what values ``dtype`` takes."""
    if dtype == tf.string:
        return "string"
    if dtype.is_integer:
        return "integer"
    return "bool" if dtype == tf.bool else "float"


def _describe(value: np.ndarray) -> str:
    if value.dtype.kind == "O":
        kinds = sorted({"null" if x is None else type(x).__name__ for x in value.flat})
        return ", ".join(kinds) or "nothing"
    if value.dtype.kind in ("U", "S"):
        return "strings"
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
    """Strings (JSON text, or bytes from a tensor proto) as an object array of UTF-8
    ``bytes`` for a tf.string input: one object a cell, each as long as its own string
    (numpy's fixed-width ``S``/``U`` arrays make every cell as wide as the longest),
    each an id through `normalize_id` (the string inputs are item ids)."""
    if not value.size:  # ``[[]]`` has no element type to check
        return np.zeros(value.shape, object)
    if value.dtype.kind not in ("U", "S", "O"):
        raise TypeError(f"expected strings, got {value.dtype}")
    encoded = np.empty(value.shape, dtype=object)
    for index, item in np.ndenumerate(value):
        if isinstance(item, (bytes, np.bytes_)):
            encoded[index] = normalize_id(bytes(item))
        elif isinstance(item, str):
            # a lone surrogate raises UnicodeEncodeError
            encoded[index] = normalize_id(item).encode("utf-8")
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


__all__ = ["DEFAULT_MAX_WIDTH", "ShapeLimits", "array_from_tensor_proto", "check_inputs",
           "check_shape"]
