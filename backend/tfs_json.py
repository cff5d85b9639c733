"""TF Serving's REST JSON without TensorFlow: predict bodies ↔ numpy, and its answers' bytes.

The passthrough routes (``backend/api/tfs.py``) speak TF Serving's own REST API. Over the REST
upstream the body goes on unchanged; over gRPC this module turns it into tensors and the reply
back into the JSON TF Serving would have written (docs/guides/coming-from-other-servers.md): the
rules of its ``util/json_tensor.cc`` (the same ones modelserver/rest_json.py and rest_encode.py
follow, which import TensorFlow and so can't be used here). Pure functions; errors are
``TfsError`` carrying the HTTP status TF Serving answers them with.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
from typing import Any, NoReturn

import numpy as np
import orjson
from google.protobuf import json_format

from modelformat.protos import serving_pb2, tensor_pb2

DT = tensor_pb2.DataType
# What JSON integers each dtype takes: int8, int16 and uint8 take any int32 (rapidjson's IsInt)
# and TF casts it into the tensor; uint16 is not converted at all (json_tensor.cc
# AddValueToTensor: Unimplemented, 501).
_INT32 = (-(2**31), 2**31 - 1)
_INT32_WIDE = (DT.DT_INT8, DT.DT_INT16, DT.DT_UINT8)
_INT_RANGES: dict[int, tuple[int, int]] = {
    DT.DT_INT8: _INT32,
    DT.DT_UINT8: _INT32,
    DT.DT_INT16: _INT32,
    DT.DT_INT32: _INT32,
    DT.DT_UINT32: (0, 2**32 - 1),
    DT.DT_INT64: (-(2**63), 2**63 - 1),
    DT.DT_UINT64: (0, 2**64 - 1),
}
_FLOATS: dict[int, Any] = {DT.DT_FLOAT: np.float32, DT.DT_DOUBLE: np.float64}
_NUMPY: dict[int, Any] = {
    **_FLOATS,
    DT.DT_INT8: np.int8,
    DT.DT_UINT8: np.uint8,
    DT.DT_INT16: np.int16,
    DT.DT_INT32: np.int32,
    DT.DT_UINT32: np.uint32,
    DT.DT_INT64: np.int64,
    DT.DT_UINT64: np.uint64,
    DT.DT_BOOL: np.bool_,
    DT.DT_STRING: np.object_,
}
_RAPIDJSON_MESSAGES = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
}


# TF Serving's HTTP status for each TF / gRPC code (http_server.cc ToHTTPStatusCode).
HTTP_STATUS = {
    "OK": 200, "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504, "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}  # fmt: skip


class TfsError(Exception):
    """An error TF Serving would answer ``{"error": message}`` with, at ``status`` (400 unless
    said)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def dtype_name(dtype: int) -> str:
    """Return TF's short dtype name (``float``, ``int32``, ``string``) for error messages."""
    name = str(DT.Name(dtype)) if dtype in DT.values() else "invalid"
    return {"DT_FLOAT": "float", "DT_DOUBLE": "double"}.get(name, name.removeprefix("DT_").lower())


# Nesting deeper than this is refused (400) before any walk of the body: TF's tensors have at
# most 254 dimensions, and the body's own levels (object, instances, row, named input) sit above.
MAX_DEPTH = 260
# rapidjson's kParseNanAndInfFlag tokens that Python's json lacks (it reads NaN, Infinity and
# -Infinity itself); strings are matched whole so that a token inside one is left alone.
_TOKENS = re.compile(r'("(?:[^"\\]|\\.)*")|-?Inf(?:inity)?|-NaN')
_TOKEN_TEXT = {"Inf": "Infinity", "-Inf": "-Infinity", "-NaN": "NaN"}
_LONG_DIGITS = re.compile(r"[0-9]{20}")
_BIG_EXPONENT = re.compile(r"[0-9][eE]\+?0*[1-9][0-9]{2}|[0-9]{309}")


def parse_body(body: bytes, most_values: int | None = None) -> Any:
    """Return a request body's JSON as TF Serving's rapidjson reads it (NaN, Inf, -Inf and
    Infinity tokens, integers past 64 bits as doubles, trailing bytes ignored); a 400 for what
    it would refuse, for nesting deeper than MAX_DEPTH and for a key given twice in one object
    (TF Serving reads its first copy, a parse here keeps the last: the body counted must be the
    body served). Parsing and every walk are iterative: no depth reaches Python's stack.

    ``most_values``: the strings, lists and objects the body may hold (GATEWAY_TFS_MAX_VALUES),
    counted in its bytes before it is parsed: a 413 past it (each costs the parser tens of bytes
    and every walk a step; numbers cost it a few bytes and are counted as elements)."""
    return read_body(body, most_values)[0]


def read_body(body: bytes, most_values: int | None = None) -> tuple[Any, tuple[int, int]]:
    """Return (``parse_body``'s JSON, its (rows, elements) as ``request_size`` counts them),
    both from one walk of the parsed body: each leaf's type is looked at once, in C."""
    if most_values is not None:
        _check_values(body, most_values)
    try:
        doc = orjson.loads(body)  # the common case, ~5x faster than the json module
        region = body
    except orjson.JSONDecodeError:
        # NaN/Inf, trailing bytes, a number past double's range, or an error to word as rapidjson
        doc, region = _parse_slowly(body)
    if type(doc) is not dict:  # TF Serving's first check of a parsed body; nothing to walk
        raise TfsError(f"JSON Value: {debug_string(doc)} Is not object")
    keys, elements = _walk(doc, region.count(b"[") + region.count(b"{"))
    if keys and _raw_keys(region, keys) != keys:
        raise TfsError(
            "JSON Parse error: the body repeats a member name in one object (TF Serving reads its "
            "first copy): give each name once"
        )
    return doc, _size(doc, lambda key: elements.get(key, 1))  # 1: count_elements(None)


def _check_values(body: bytes, most: int) -> None:
    """Raise a 413 when ``body`` holds more than ``most`` strings, lists and objects (a 400 when
    it nests deeper than MAX_DEPTH): three ``bytes.count`` calls when it holds fewer quotes and
    brackets than that, else counted outside its strings (numpy, a few ms a MiB)."""
    quick = body.count(b'"') // 2 + body.count(b"[") + body.count(b"{")
    if quick <= most:
        return
    chars, quotes, inside = _strings(body)
    opens = ((chars == ord("[")) | (chars == ord("{"))) & ~inside
    closes = ((chars == ord("]")) | (chars == ord("}"))) & ~inside
    values = int(np.count_nonzero(quotes & inside)) + int(np.count_nonzero(opens))
    if values <= most:
        return
    steps = opens.view(np.int8) - closes.view(np.int8)
    if int(np.cumsum(steps, dtype=np.int32).max()) > MAX_DEPTH:
        raise TfsError(_too_deep())
    raise TfsError(
        f"the body has {values} strings, lists and objects, over the limit of {most} "
        "(GATEWAY_TFS_MAX_VALUES)",
        413,
    )


def _strings(text: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (``text``'s bytes, where its quotes are, what is inside its strings: their
    opening quotes too), escapes taken into account."""
    if b"\\" in text:  # an escaped backslash or quote: two bytes that are neither
        text = text.replace(b"\\\\", b"__").replace(b'\\"', b"__")
    chars = np.frombuffer(text, dtype=np.uint8)
    quotes = chars == ord('"')
    inside = np.bitwise_xor.accumulate(quotes.view(np.uint8)).view(bool)
    return chars, quotes, inside


def _parse_slowly(body: bytes) -> tuple[Any, bytes]:
    """Return (the first JSON value of ``body``, the bytes it spans) with Python's json module,
    after rewriting rapidjson's extra tokens; TF Serving's words for what it can't read."""
    text = body.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    if not stripped:
        raise TfsError("JSON Parse error: The document is empty")
    offset = len(text) - len(stripped)
    if "Inf" in stripped or "-NaN" in stripped:
        stripped = _TOKENS.sub(lambda m: m.group(1) or _TOKEN_TEXT.get(m.group(), m.group()),
                               stripped)  # fmt: skip
    parse_float = _finite_float if _BIG_EXPONENT.search(stripped) else float
    parse_int = _int64_or_double if _LONG_DIGITS.search(stripped) else int
    try:
        decoder = json.JSONDecoder(parse_float=parse_float, parse_int=parse_int)
        value, end = decoder.raw_decode(stripped)
    except json.JSONDecodeError as exc:
        message = _RAPIDJSON_MESSAGES.get(exc.msg, exc.msg + ".")
        if exc.msg.startswith("Expecting ','"):
            message = (
                "Missing a comma or '}' after an object member."
                if _innermost_open(stripped[: exc.pos]) == "{"
                else "Missing a comma or ']' after an array element."
            )
        raise TfsError(f"JSON Parse error: {message} at offset: {exc.pos + offset}") from None
    except RecursionError:  # the json module recurses per level: over MAX_DEPTH anyway
        raise TfsError(_too_deep()) from None
    return value, stripped[:end].encode("utf-8", errors="replace")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise TfsError("JSON Parse error: Number too big to be stored in double.")
    return value


def _int64_or_double(text: str) -> int | float:
    """Return a JSON integer as rapidjson holds it: past int64 and uint64, a double."""
    value = int(text)
    return value if -(2**63) <= value < 2**64 else float(value)


def _too_deep() -> str:
    return f"JSON Parse error: the body is nested deeper than {MAX_DEPTH} levels"


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _containers(values: Any, most: int) -> list[Any]:
    """Return the lists and objects among ``values`` (a list, or an object's values) in their
    order, ``most`` of them at most (no more are left in the body); the leaves' types are
    looked at in C (a list of 500,000 numbers and one list costs a pass of ``map(type)`` and
    one or two of ``list.index``, no Python step per number)."""
    items = values if type(values) is list else list(values)
    types = list(map(type, items))
    found: list[int] = []
    for kind in (list, dict):
        if len(types) <= 64:  # no exception for a short list's last search
            at = -1
            for _ in range(types.count(kind) if kind in types else 0):
                at = types.index(kind, at + 1)
                found.append(at)
            continue
        at = -1
        try:
            while len(found) < most:
                at = types.index(kind, at + 1)
                found.append(at)
        except ValueError:
            pass
    if not found:
        return found
    found.sort()
    return [items[at] for at in found]


def _walk(doc: Any, brackets: int) -> tuple[int, dict[str, int]]:
    """Return (how many object members ``doc`` holds, the elements of each of its top-level
    members as ``count_elements`` counts them), walking it a level at a time (no recursion; a
    step per list and object, the leaves' types looked at in C); a 400 past MAX_DEPTH.

    ``brackets``: the '[' and '{' of its text, so at least its lists and objects: once that
    many are found, the lists left hold none, and their leaves are not looked at."""
    members = 0
    elements: dict[str, int] = {}
    level: list[tuple[Any, str | None]] = [(doc, None)]  # a value, the member it counts for
    found = 1 if type(doc) in (list, dict) else 0
    for depth in range(MAX_DEPTH):
        if found >= brackets and depth > 0:  # every list and object is in this level or above
            for value, member in level:
                size = len(value)
                if type(value) is dict:
                    members += size
                    if size == 1 and "b64" in value:
                        size = 1  # one leaf (what it holds is not counted)
                if member is not None:
                    elements[member] += size
            return members, elements
        below: list[tuple[Any, str | None]] = []
        groups: dict[str | None, list[Any]] = {}  # each member's lists and objects' values
        for value, member in level:
            if type(value) is dict:
                members += len(value)
                if depth == 0:  # the body's own members, each counted on its own
                    for key, item in value.items():
                        elements[key] = 0 if type(item) in (list, dict) else 1
                    below.extend((item, key) for key, item in value.items() if elements[key] == 0)
                    continue
                if member is not None and len(value) == 1 and "b64" in value:
                    elements[member] += 1  # one leaf: what it holds is not counted
                    member = None
                value = value.values()
            groups.setdefault(member, []).append(value)
        for member, parts in groups.items():  # the level's items of a member: one list, in C
            items = parts[0] if len(parts) == 1 and type(parts[0]) is list else (
                list(itertools.chain.from_iterable(parts))
            )  # fmt: skip
            left = brackets - found - len(below)  # lists and objects not found yet, at most
            inner = _containers(items, left) if left > 0 and items else []
            if member is not None:
                elements[member] += len(items) - len(inner)
            below.extend([(item, member) for item in inner])
        found += len(below)
        if not below:
            return members, elements
        level = below
    raise TfsError(_too_deep())


def _raw_keys(region: bytes, parsed: int) -> int:
    """Return how many member names the JSON text ``region`` spells (``parsed``: those its
    parse kept): every ':' outside a string follows one, so no more ':' than that is the
    common case, and the others are counted outside its strings (numpy)."""
    colons = region.count(b":")
    if colons == parsed:
        return parsed
    chars, _, inside = _strings(region)
    return int(np.count_nonzero((chars == ord(":")) & ~inside))


def _innermost_open(text: str) -> str:
    """Return the innermost ``[`` or ``{`` still open at the end of ``text`` ('' if none)."""
    depth: list[str] = []
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped = not escaped and char == "\\"
            if char == '"' and not escaped:
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth.append(char)
        elif char in "]}" and depth:
            depth.pop()
    return depth[-1] if depth else ""


def debug_string(value: Any) -> str:
    """Return a compact dump of a JSON value for error messages (cut at 256 bytes)."""
    return json.dumps(value, separators=(",", ":"))[:256]


def json_type(value: Any) -> str:
    """Return rapidjson's type name of a parsed JSON value."""
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    return "String" if isinstance(value, str) else "Number"


def count_elements(value: Any) -> int:
    """Return how many leaves (numbers, strings, b64 objects, nulls) a JSON value holds,
    walking it a level at a time without recursion: what a predict body's tensors will hold,
    known before any is built."""
    count = 0
    level = [value]
    while level:
        below: list[Any] = []
        for value in level:
            kind = type(value)
            if kind is dict:
                if len(value) == 1 and "b64" in value:
                    count += 1
                    continue
                value = value.values()
            elif kind is not list:
                count += 1
                continue
            inner = _containers(value, len(value)) if value else []
            count += len(value) - len(inner)
            below.extend(inner)
        level = below
    return count


def request_size(doc: Any) -> tuple[int, int]:
    """Return (rows, elements) of a predict/classify/regress body: rows are ``instances`` or
    ``examples`` entries (columnar ``inputs``: the first input's first dimension)."""
    return _size(doc, lambda key: count_elements(doc.get(key)))


def _size(doc: Any, elements_of: Any) -> tuple[int, int]:
    """``request_size``, ``elements_of(key)`` counting the elements of the member ``key``."""
    if not isinstance(doc, dict):
        return 0, 0
    for key in ("instances", "examples"):
        if isinstance(doc.get(key), list):
            context = elements_of("context") if "context" in doc else 0
            return len(doc[key]), elements_of(key) + context
    inputs = doc.get("inputs")
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else inputs
    rows = len(first) if isinstance(first, list) else 1
    return rows, elements_of("inputs")


# -- JSON → numpy (json_tensor.cc FillPredictRequestFromJson) ---------------------------------


def _type_error(value: Any, dtype: int) -> TfsError:
    return TfsError(
        f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not of expected type: "
        f"{dtype_name(dtype)}"
    )


def convert_leaf(value: Any, dtype: int) -> Any:
    """Return one JSON leaf as a value of ``dtype``; raise TF Serving's type errors."""
    if dtype in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(value, dtype)
        return float(value)
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _type_error(value, dtype)
        return value
    if dtype == DT.DT_BOOL:
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        return value
    if dtype == DT.DT_STRING:
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, dict):
            return _b64(value)
        raise _type_error(value, dtype)
    raise TfsError(
        f"Conversion of JSON Value: {debug_string(value)} to type: {dtype_name(dtype)}", 501
    )


def _b64(value: dict[str, Any]) -> bytes:
    if list(value) != ["b64"] or not isinstance(value["b64"], str):
        raise TfsError(f"JSON Value: {debug_string(value)} not formatted correctly for base64 data")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise TfsError(f"Unable to base64 decode: {value['b64'][:64]}") from None


def _shape_of(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def to_array(value: Any, dtype: int, ranged: frozenset[int] | None = None) -> np.ndarray:
    """Return a JSON value (scalar, nested list, b64 object) as a numpy array of ``dtype``:
    its shape and every leaf's type checked first, in TF Serving's order, then one array of
    that dtype built (numpy never infers a dtype from the client's JSON)."""
    np_dtype = _NUMPY.get(dtype)
    if np_dtype is None:  # TF Serving refuses any leaf of these (json_tensor.cc AddValueToTensor)
        leaf = value
        while isinstance(leaf, list) and leaf:
            leaf = leaf[0]
        raise TfsError(
            f"Conversion of JSON Value: {debug_string(leaf)} to type: {dtype_name(dtype)}", 501
        )
    shape = _shape_of(value)
    rows = _checked_rows(value, shape, dtype, _INT_DTYPES if ranged is None else ranged)
    if dtype == DT.DT_STRING:
        leaves = list(itertools.chain.from_iterable(rows))
        array = np.empty(len(leaves), dtype=object)
        array[:] = [v.encode("utf-8") if isinstance(v, str) else _b64(v) for v in leaves]
        return array.reshape(shape)
    size = math.prod(shape)

    def built(kind: Any) -> np.ndarray:  # the checked leaves, row-major, as ``kind``
        return np.fromiter(itertools.chain.from_iterable(rows), dtype=kind, count=size)

    if dtype in _FLOATS:  # rapidjson's GetFloat is the double cast to float
        return built(np.float64).astype(np_dtype).reshape(shape)
    if dtype not in _INT_RANGES:  # bool
        return built(np_dtype).reshape(shape)
    try:  # every leaf is an int: built wide, then held to the dtype's range
        wide = built(np.uint64 if dtype == DT.DT_UINT64 else np.int64)
    except OverflowError:  # past the wide type's range, so past the dtype's
        wide = None
    low, high = _INT_RANGES[dtype]
    if wide is None:
        _check_range(rows, dtype)
        raise AssertionError("no int was found past the range its array is past")
    if wide.size and (int(wide.min()) < low or int(wide.max()) > high):
        at = int(np.flatnonzero((wide < low) | (wide > high))[0])
        width = len(rows[0])  # every row has as many (a scalar: one row of itself)
        raise _type_error(rows[at // width][at % width], dtype)
    # an int32 stored in an int8/int16/uint8 tensor is cast, as TF does
    return wide.astype(np_dtype).reshape(shape)


# The JSON leaves each dtype takes (bools are not numbers, ints are; json_tensor.cc).
_LEAF_TYPES: dict[int, frozenset[type]] = {
    **{dt: frozenset((int, float)) for dt in _FLOATS},
    **{dt: frozenset((int,)) for dt in _INT_RANGES},
    DT.DT_BOOL: frozenset((bool,)),
    DT.DT_STRING: frozenset((str, dict)),
}


def _checked_rows(
    value: Any, shape: list[int], dtype: int, ranged: frozenset[int]
) -> list[list[Any]]:
    """Return the innermost lists of ``value`` in row-major order (a scalar: one of itself)
    after checking, without recursion, that it is a dense tensor of ``shape`` whose leaves
    ``dtype`` takes; the first fault in document order is the error, worded as TF Serving
    words it. Leaves' types are checked in C, a list at a time; ints' range only before a
    fault here (the array built after this checks the others' at once)."""
    rank = len(shape)
    if rank == 0:
        _check_leaves([value], dtype, 0, [], ranged)
        return [[value]]
    rows: list[list[Any]] = []
    stack = [iter((value,))]
    while stack:
        level = len(stack) - 1
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        if not isinstance(item, list):
            _check_range(rows, dtype, ranged)
            raise TfsError(
                f"JSON Value: {debug_string(item)} found at incorrect level: {level} in the "
                f"JSON DOM. Expected at level: {rank}"
            )
        if len(item) != shape[level]:
            _check_range(rows, dtype, ranged)
            raise TfsError(
                f"Encountered list at unexpected size: {len(item)} at level: {level} expected "
                f"size: {shape[level]}"
            )
        if level + 2 == rank:  # its items are rows: checked together, in C
            _check_rows(item, level + 1, shape, dtype, rows, ranged)
            continue
        if level + 1 < rank:
            stack.append(iter(item))
            continue
        _check_leaves(item, dtype, rank, rows, ranged)
        rows.append(item)
    return rows


def _check_rows(
    items: list[Any], level: int, shape: list[int], dtype: int, rows: list[list[Any]],
    ranged: frozenset[int],
) -> None:  # fmt: skip
    """Check ``items`` (at ``level``: rows of ``shape[level]`` leaves each, by the shape) as
    ``_checked_rows`` would one at a time, and add them to ``rows``: the first that is not a
    list of that many leaves, every row before it checked first, is the error."""
    size = shape[level]
    if len(items) <= 64:  # a few rows: one at a time (a fault in a row's head is found there)
        for row in items:
            if not isinstance(row, list) or len(row) != size:
                _bad_row(row, level, shape, dtype, rows, ranged)
            _check_leaves(row, dtype, level + 1, rows, ranged)
            rows.append(row)
        return
    kinds = list(map(type, items))
    stop = len(items) if kinds.count(list) == len(kinds) else _first_not(kinds, _LIST)
    if stop:
        sizes = list(map(len, items[:stop]))
        if sizes.count(size) != stop:
            stop = _first_not_equal(sizes, size)
    good = items[:stop]
    leaves = list(itertools.chain.from_iterable(good))
    allowed = _LEAF_TYPES[dtype]
    types = list(map(type, leaves))
    if sum(map(types.count, allowed)) != len(types):
        at = _first_not(types, allowed) // size
        rows.extend(good[:at])
        _check_leaves(good[at], dtype, level + 1, rows, ranged)
        raise AssertionError("a row's fault was not found again")
    rows.extend(good)
    if stop < len(items):
        _bad_row(items[stop], level, shape, dtype, rows, ranged)


def _bad_row(
    item: Any, level: int, shape: list[int], dtype: int, rows: list[list[Any]],
    ranged: frozenset[int],
) -> NoReturn:  # fmt: skip
    """Raise the error for ``item``, at ``level`` where a row of ``shape[level]`` leaves is
    expected, after the range of ``rows``' ints (checked before it)."""
    _check_range(rows, dtype, ranged)
    if not isinstance(item, list):
        raise TfsError(
            f"JSON Value: {debug_string(item)} found at incorrect level: {level} in the "
            f"JSON DOM. Expected at level: {len(shape)}"
        )
    raise TfsError(
        f"Encountered list at unexpected size: {len(item)} at level: {level} expected size: "
        f"{shape[level]}"
    )


_LIST = frozenset((list,))


def _first_not_equal(values: list[int], value: int) -> int:
    """Return the index of the first of ``values`` (one is) that is not ``value``."""
    low, high = 0, len(values)
    while high - low > 32:
        middle = (low + high) // 2
        if values[low:middle].count(value) == middle - low:
            low = middle
        else:
            high = middle
    return next(at for at in range(low, high) if values[at] != value)


_END = object()


def _check_leaves(
    items: list[Any], dtype: int, level: int, before: list[list[Any]], ranged: frozenset[int]
) -> None:
    """Raise TF Serving's error for the first of ``items`` (leaves at ``level``) that ``dtype``
    does not take, their types checked in C (``before``: the rows checked so far, whose ints'
    range is checked first when one of these is a fault and ``dtype`` is in ``ranged``)."""
    allowed = _LEAF_TYPES[dtype]
    head = items if len(items) <= 16 else items[:16]
    if set(map(type, head)) <= allowed:  # else the fault is found in those
        if head is items:
            return
        types = list(map(type, items))
        if sum(map(types.count, allowed)) == len(types):  # in C, at a pointer's compare each
            return
        first = _first_not(types, allowed)
    else:
        first = 0
    if dtype == DT.DT_STRING:  # a malformed b64 object before the fault is the error
        first = 0  # (strings are few: GATEWAY_TFS_MAX_VALUES)
    else:
        _check_range([*before, items[:first]], dtype, ranged)
    for item in items[first:]:
        if isinstance(item, list):
            raise TfsError(
                f"JSON Value: {debug_string(item)} found at incorrect level: {level + 1} in the "
                f"JSON DOM. Expected at level: {level}"
            )
        convert_leaf(item, dtype)  # raises for the first one ``dtype`` does not take
    raise AssertionError(f"no leaf of {items[:8]!r}... was refused as {dtype_name(dtype)}")


def _first_not(types: list[type], allowed: frozenset[type]) -> int:
    """Return the index of the first of ``types`` not in ``allowed`` (one is), halving the
    span that holds it: ``list.count`` on a slice (a pointer's compare each, in C)."""
    low, high = 0, len(types)
    while high - low > 32:
        middle = (low + high) // 2
        part = types[low:middle]
        if sum(map(part.count, allowed)) == len(part):
            low = middle
        else:
            high = middle
    return next(at for at in range(low, high) if types[at] not in allowed)


def _check_range(rows: list[list[Any]], dtype: int, ranged: frozenset[int] | None = None) -> None:
    """Raise the error for the first int of ``rows`` (of ints) past ``dtype``'s range, looked
    for in numpy: as int64s, or past that as doubles (exact within 2**53; one at a bound past
    that is checked as the int it is)."""
    if dtype not in (_INT_DTYPES if ranged is None else ranged) or not rows:
        return
    low, high = _INT_RANGES[dtype]
    leaves = list(itertools.chain.from_iterable(rows))
    try:
        wide = np.fromiter(leaves, dtype=np.int64, count=len(leaves))
        if not len(wide) or (int(wide.min()) >= low and int(wide.max()) <= high):
            return
        bad = (wide < low) | (wide > high)
    except OverflowError:  # past int64: as doubles (ints under 2**64 fit)
        doubles = np.fromiter(leaves, dtype=np.float64, count=len(leaves))
        bad = doubles < low if -low <= 2**53 else doubles <= low
        bad |= doubles > high if high <= 2**53 else doubles >= high
    for at in np.flatnonzero(bad).tolist():
        if not low <= leaves[at] <= high:
            raise _type_error(leaves[at], dtype)


_INT_DTYPES = frozenset(_INT_RANGES)
_DIGITS = bytes(ord("0") if ord("0") <= byte <= ord("9") else ord(" ") for byte in range(256))


def int_ranges_to_check(text: bytes | None) -> frozenset[int]:
    """Return the int dtypes whose range an int of the JSON ``text`` may be past (each, when
    the text is not known): one needs 10 digits, or a '-' for the unsigned ones (in C)."""
    if text is None or text.translate(_DIGITS).find(b"0" * 10) >= 0:
        return _INT_DTYPES
    return frozenset((DT.DT_UINT32, DT.DT_UINT64)) if b"-" in text else frozenset()


def decode_predict(
    doc: Any, sig: Any, sig_label: str, text: bytes | None = None
) -> tuple[dict[str, np.ndarray], bool]:
    """Return (inputs by alias, row_format) of a parsed predict body for a SignatureDef
    (``text``: the body, if known: its ints' range is checked only where it may be past)."""
    if not isinstance(doc, dict):
        raise TfsError(f"JSON Value: {debug_string(doc)} Is not object")
    if not sig.inputs:
        raise TfsError(f"Failed to get input map for signature: {sig_label}")
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise TfsError(
            f"JSON Value: {debug_string(doc)} Not formatted correctly expecting only one of "
            "'inputs' or 'instances' keys to exist "
        )
    if has_instances:
        return _decode_instances(doc["instances"], sig, int_ranges_to_check(text)), True
    if has_inputs:
        return _decode_inputs(doc["inputs"], sig, int_ranges_to_check(text)), False
    raise TfsError("Missing 'inputs' or 'instances' key")


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _decode_instances(instances: Any, sig: Any, ranged: frozenset[int]) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise TfsError("Expecting 'instances' to be an list/array")
    if not instances:
        raise TfsError("No values in 'instances' array")
    names = sorted(sig.inputs)
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if len(names) > 1 and not objects:
        raise TfsError(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map"
        )
    columns: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for index, element in enumerate(instances):
        is_object = isinstance(element, dict) and not _is_b64(element)
        if objects and not is_object:
            raise TfsError(f"Expecting object but got list at item {index} of input list")
        if not objects and is_object:
            raise TfsError(f"Expecting value/list but got object at item {index} of input list")
        row = element if objects else {names[0]: element}
        for key in row:
            if key not in sig.inputs:
                raise TfsError(
                    f"Failed to process element: {index} key: {key} of 'instances' list. Error: "
                    f"INVALID_ARGUMENT: JSON object: does not have named input: {key}"
                )
        if set(row) != set(names):
            raise TfsError(
                f"Failed to process element: {index} of 'instances' list. JSON object: "
                f"{debug_string(element)} keys must be equal to: {','.join(names)}"
            )
        for name in names:
            where = f"{index} key: {name}" if objects else f"{index}"
            try:
                array = to_array(row[name], sig.inputs[name].dtype, ranged)
                if columns[name] and array.shape != columns[name][0].shape:
                    first = columns[name][0]
                    if array.size != first.size:
                        raise TfsError(f"Expecting tensor size: {first.size} but got: {array.size}")
                    raise TfsError(
                        f"Expecting shape [{','.join(map(str, first.shape))}] but got: "
                        f"[{','.join(map(str, array.shape))}]"
                    )
            except TfsError as exc:
                if exc.status != 400:
                    raise
                raise TfsError(
                    f"Failed to process element: {where} of 'instances' list. Error: "
                    f"INVALID_ARGUMENT: {exc.message}"
                ) from None
            columns[name].append(array)
    return {name: np.stack(parts) for name, parts in columns.items()}


def _decode_inputs(inputs: Any, sig: Any, ranged: frozenset[int]) -> dict[str, np.ndarray]:
    names = sorted(sig.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise TfsError(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: to_array(inputs, sig.inputs[names[0]].dtype, ranged)}
    out = {}
    for name in names:  # extra keys are ignored, as TF Serving only walks the signature
        if name not in inputs:
            raise TfsError(f"Missing named input: {name} in 'inputs' object.")
        out[name] = to_array(inputs[name], sig.inputs[name].dtype, ranged)
    return out


# -- numpy → JSON (json_tensor.cc MakeJsonFromTensors, WriteDecimal) ---------------------------

_NON_FINITE = {"nan": "NaN", "-nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def format_float(value: float, double: bool = False) -> str:
    """Return a float as TF Serving's WriteDecimal does (%.6g, else 9/17 digits, ``.0``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = f"{value:.6g}"
    if double:
        if float(text) != value:
            text = f"{value:.17g}"
    elif np.float32(float(text)) != np.float32(value):
        text = f"{value:.9g}"
    return text if ("." in text or "e" in text) else text + ".0"


def format_floats(array: np.ndarray) -> list[str]:
    """Return every element of a float array formatted like ``format_float``."""
    double = array.dtype == np.float64
    texts = [format_float(v, double) for v in array.ravel().tolist()]
    return [_NON_FINITE.get(t, t) for t in texts]


def _leaves(array: np.ndarray, as_b64: bool) -> list[str]:
    kind = array.dtype.kind
    if kind == "f":
        return format_floats(array)
    if kind == "b":
        return ["true" if v else "false" for v in array.ravel().tolist()]
    if kind in "iu":
        return [str(v) for v in array.ravel().tolist()]
    if kind in "OSU":
        out = []
        for value in array.ravel().tolist():
            raw = value if isinstance(value, bytes) else str(value).encode()
            if as_b64:
                out.append('{"b64": ' + json.dumps(base64.b64encode(raw).decode()) + "}")
            else:
                out.append(json.dumps(raw.decode("utf-8", errors="replace"), ensure_ascii=False))
        return out
    raise TfsError(f"Failed to write JSON value for tensor type: {array.dtype}")


def _nest(leaves: list[str], shape: tuple[int, ...]) -> str:
    """Return the single-line JSON array of ``shape`` over row-major ``leaves``."""
    if not shape:
        return leaves[0]
    if len(shape) == 1:
        return "[" + ", ".join(leaves) + "]"
    step = len(leaves) // shape[0] if shape[0] else 0
    parts = (_nest(leaves[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0]))
    return "[" + ", ".join(parts) + "]"


def _rows(array: np.ndarray, as_b64: bool) -> list[str]:
    leaves = _leaves(array, as_b64)
    step = len(leaves) // array.shape[0] if array.shape[0] else 0
    return [
        _nest(leaves[i * step : (i + 1) * step], array.shape[1:]) for i in range(array.shape[0])
    ]


def predict_body(outputs: dict[str, np.ndarray], row_format: bool) -> str:
    """Return the predict answer: ``predictions`` (rows) or ``outputs`` (columns); an output
    whose name ends in ``_bytes`` as ``{"b64": ...}``."""
    if not outputs:
        raise TfsError("Cannot convert empty tensor map to JSON")
    names = list(outputs)
    b64 = {name: name.endswith("_bytes") for name in names}
    if not row_format:
        if len(names) == 1:
            array = outputs[names[0]]
            body = _nest(_leaves(array, b64[names[0]]), array.shape)
        else:
            members = [
                f"        {json.dumps(n)}: {_nest(_leaves(outputs[n], b64[n]), outputs[n].shape)}"
                for n in names
            ]
            body = "{\n" + ",\n".join(members) + "\n    }"
        return '{\n    "outputs": ' + body + "\n}"
    batch = None
    for name, array in outputs.items():
        if array.ndim == 0:
            raise TfsError(f"Tensor name: {name} has no shape information ")
        if batch is not None and array.shape[0] != batch:
            raise TfsError(
                f"Tensor name: {name} has inconsistent batch size: {array.shape[0]} "
                f"expecting: {batch}"
            )
        batch = array.shape[0]
    if len(names) == 1:
        rows = _rows(outputs[names[0]], b64[names[0]])
    else:
        columns = {n: _rows(outputs[n], b64[n]) for n in names}
        rows = [
            "{" + ", ".join(f"{json.dumps(n)}: {columns[n][i]}" for n in names) + "}"
            for i in range(batch or 0)
        ]
    return '{\n    "predictions": [' + ", ".join(rows) + "\n    ]\n}"


def error_body(message: str) -> str:
    """Return ``{"error": message}`` with rapidjson's pretty printing, as TF Serving does."""
    return '{\n    "error": ' + json.dumps(message, ensure_ascii=False) + "\n}"


def proto_json(message: Any) -> str:
    """Return a proto as TF Serving's REST API prints it (1-space indent, defaults printed)."""
    return json_format.MessageToJson(
        message,
        indent=1,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def status_body(response: Any) -> str:
    """Return a GetModelStatusResponse as TF Serving's REST status JSON."""
    return proto_json(response) + "\n"


def metadata_body(response: Any, signature_map: Any) -> str:
    """Return TF Serving's hand-concatenated metadata JSON (model_spec + signature_def map)."""
    return (
        '{\n"model_spec":' + proto_json(response.model_spec) + ",\n"
        '"metadata": {"signature_def": ' + proto_json(signature_map) + "}\n}\n"
    )


# -- classify / regress (json_tensor.cc FillClassifyRegressRequestFromJson) -------------------


def input_from_json(doc: Any) -> Any:
    """Return the serving ``Input`` (tf.Examples, with context) of a classify/regress body."""
    if not isinstance(doc, dict):
        raise TfsError(f"JSON Value: {debug_string(doc)} Is not object")
    if "examples" not in doc:  # TF Serving says "classify" here for regress too
        raise TfsError(
            f"JSON Value: {debug_string(doc)} When method is classify, key 'examples' "
            "is expected and was not found"
        )
    examples = doc["examples"]
    if not isinstance(examples, list):
        raise TfsError(
            f"JSON Value: {debug_string(doc)} Expecting 'examples' value to be an list/array"
        )
    if not examples:
        raise TfsError(f"JSON Value: {debug_string(doc)} 'examples' value is an empty array")
    request_input = serving_pb2.Input()
    if "context" in doc:
        target: Any = request_input.example_list_with_context
        _fill_example(target.context, doc["context"])
    else:
        target = request_input.example_list
    for value in examples:
        _fill_example(target.examples.add(), value)
    return request_input


def _fill_example(example: Any, value: Any) -> None:
    """Fill a tf.Example from a JSON object: the JSON token decides each feature's type."""
    if not isinstance(value, dict):
        raise TfsError(f"Example must be JSON object but got JSON {json_type(value)}")
    for name, raw in value.items():
        feature = example.features.feature[name]
        values = raw if isinstance(raw, list) else [raw]
        kinds = [_feature_kind(name, v) for v in values]
        kind = kinds[0] if kinds else "bytes"
        if any(other != kind for other in kinds):
            raise TfsError(f"Unexpected element type in feature: {name} expecting type: {kind}")
        if kind == "int64":
            if any(not isinstance(v, bool) and v >= 2**63 for v in values):
                raise TfsError(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
            feature.int64_list.value.extend(int(v) for v in values)
        elif kind == "float":
            feature.float_list.value.extend(float(v) for v in values)
        else:
            feature.bytes_list.value.extend(convert_leaf(v, DT.DT_STRING) for v in values)


def _feature_kind(name: str, value: Any) -> str:
    if isinstance(value, bool | int):
        return "int64"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str) or _is_b64(value):
        return "bytes"
    raise TfsError(f"Feature: {name} has element with unexpected JSON type: {json_type(value)}")


def regress_body(result: Any) -> str:
    """Return ``{"results": [v, ...]}`` for a RegressionResult (single-line array)."""
    values = np.array([r.value for r in result.regressions], dtype=np.float32)
    return '{\n    "results": [' + ", ".join(format_floats(values)) + "\n    ]\n}"


def classify_body(result: Any) -> str:
    """Return ``{"results": [[[label, score], ...], ...]}`` for a ClassificationResult."""
    rows = []
    for classifications in result.classifications:
        pairs = [
            f"[{json.dumps(c.label, ensure_ascii=False)}, {format_float(c.score)}]"
            for c in classifications.classes
        ]
        rows.append("[" + ", ".join(pairs) + "]")
    return '{\n    "results": [' + ", ".join(rows) + "\n    ]\n}"
