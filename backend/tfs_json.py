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
import json
import math
import re
from typing import Any

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
_KEY = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?')
_COLON_ESCAPE = re.compile(rb"\\u003[aA]")
_LONG_DIGITS = re.compile(r"[0-9]{20}")
_BIG_EXPONENT = re.compile(r"[0-9][eE]\+?0*[1-9][0-9]{2}|[0-9]{309}")


def parse_body(body: bytes) -> Any:
    """Return a request body's JSON as TF Serving's rapidjson reads it (NaN, Inf, -Inf and
    Infinity tokens, integers past 64 bits as doubles, trailing bytes ignored); a 400 for what
    it would refuse, for nesting deeper than MAX_DEPTH and for a key given twice in one object
    (TF Serving reads its first copy, a parse here keeps the last: the body counted must be the
    body served). Parsing and every walk are iterative: no depth reaches Python's stack."""
    try:
        doc = orjson.loads(body)  # the common case, ~5x faster than the json module
        region = body
    except orjson.JSONDecodeError:
        # NaN/Inf, trailing bytes, a number past double's range, or an error to word as rapidjson
        doc, region = _parse_slowly(body)
    keys = _check_walk(doc)
    if keys and _raw_keys(region, doc, keys) != keys:
        raise TfsError(
            "JSON Parse error: the body repeats a member name in one object (TF Serving reads its "
            "first copy): give each name once"
        )
    return doc


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


def _check_walk(doc: Any) -> int:
    """Return how many object members ``doc`` holds, walking it a level at a time (no
    recursion, no record per container); a 400 past MAX_DEPTH."""
    members = 0
    level = [doc]
    for _ in range(MAX_DEPTH):
        below: list[Any] = []
        for value in level:
            if type(value) is dict:
                members += len(value)
                value = value.values()
            if value and not set(map(type, value)) <= _SCALARS:
                below.extend(item for item in value if type(item) in (list, dict))
        if not below:
            return members
        level = below
    raise TfsError(_too_deep())


def _raw_keys(region: bytes, doc: Any, parsed: int) -> int:
    """Return how many member names the JSON text ``region`` spells (``parsed``: those its
    parse kept): every ':' outside a string follows one, so no more ':' than that is the
    common case."""
    colons = region.count(b":")
    if colons == parsed:
        return parsed
    if _COLON_ESCAPE.search(region) is None:
        return colons - _colons_in_strings(doc)
    found = _KEY.findall(region)
    return len(found) - found.count(b"")


def _colons_in_strings(doc: Any) -> int:
    """Return the ':' characters in ``doc``'s strings, member names included."""
    count = 0
    stack = [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            count += "".join(value).count(":")
            items: Any = value.values()
        elif isinstance(value, list):
            items = value
        else:
            count += value.count(":") if isinstance(value, str) else 0
            continue
        texts = [item for item in items if type(item) is str]
        count += "".join(texts).count(":")
        stack.extend(item for item in items if type(item) in (list, dict))
    return count


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
            if not value:
                continue
            if set(map(type, value)) <= _SCALARS:
                count += len(value)
                continue
            for item in value:
                if type(item) in (list, dict):
                    below.append(item)
                else:
                    count += 1
        level = below
    return count


def request_size(doc: Any) -> tuple[int, int]:
    """Return (rows, elements) of a predict/classify/regress body: rows are ``instances`` or
    ``examples`` entries (columnar ``inputs``: the first input's first dimension)."""
    if not isinstance(doc, dict):
        return 0, 0
    for key in ("instances", "examples"):
        if isinstance(doc.get(key), list):
            context = count_elements(doc["context"]) if "context" in doc else 0
            return len(doc[key]), count_elements(doc[key]) + context
    inputs = doc.get("inputs")
    first = next(iter(inputs.values()), None) if isinstance(inputs, dict) else inputs
    rows = len(first) if isinstance(first, list) else 1
    return rows, count_elements(inputs)


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


def to_array(value: Any, dtype: int) -> np.ndarray:
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
    leaves = _checked_leaves(value, shape, dtype)
    if dtype == DT.DT_STRING:
        array = np.empty(len(leaves), dtype=object)
        array[:] = [v.encode("utf-8") if isinstance(v, str) else _b64(v) for v in leaves]
    elif dtype in _FLOATS:  # rapidjson's GetFloat is the double cast to float
        array = np.array(leaves, dtype=np.float64).astype(np_dtype)
    elif dtype in _INT32_WIDE:  # an int32 stored in an int8/int16/uint8 tensor: cast, as TF does
        array = np.array(leaves, dtype=np.int64).astype(np_dtype)
    else:
        array = np.array(leaves, dtype=np_dtype)
    return array.reshape(shape)


# The JSON leaves each dtype takes (bools are not numbers, ints are; json_tensor.cc).
_LEAF_TYPES: dict[int, frozenset[type]] = {
    **{dt: frozenset((int, float)) for dt in _FLOATS},
    **{dt: frozenset((int,)) for dt in _INT_RANGES},
    DT.DT_BOOL: frozenset((bool,)),
    DT.DT_STRING: frozenset((str, dict)),
}


def _checked_leaves(value: Any, shape: list[int], dtype: int) -> list[Any]:
    """Return the leaves of ``value`` in row-major order after checking, without recursion,
    that it is a dense tensor of ``shape`` whose leaves ``dtype`` takes; the first fault in
    document order is the error, worded as TF Serving words it."""
    rank = len(shape)
    if rank == 0:
        _check_leaves([value], dtype, 0)
        return [value]
    leaves: list[Any] = []
    stack = [iter((value,))]
    while stack:
        level = len(stack) - 1
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
            continue
        if not isinstance(item, list):
            raise TfsError(
                f"JSON Value: {debug_string(item)} found at incorrect level: {level} in the "
                f"JSON DOM. Expected at level: {rank}"
            )
        if len(item) != shape[level]:
            raise TfsError(
                f"Encountered list at unexpected size: {len(item)} at level: {level} expected "
                f"size: {shape[level]}"
            )
        if level + 1 < rank:
            stack.append(iter(item))
            continue
        _check_leaves(item, dtype, rank)
        leaves.extend(item)
    return leaves


_END = object()


def _check_leaves(items: list[Any], dtype: int, level: int) -> None:
    """Raise TF Serving's error for the first of ``items`` (leaves at ``level``) that ``dtype``
    does not take: their types checked in one pass, values in range by their extremes."""
    allowed = _LEAF_TYPES[dtype]
    fine = set(map(type, items)) <= allowed
    if fine and dtype in _INT_RANGES and items:
        low, high = _INT_RANGES[dtype]
        fine = low <= min(items) and max(items) <= high
    if fine:
        return
    for item in items:
        if isinstance(item, list):
            raise TfsError(
                f"JSON Value: {debug_string(item)} found at incorrect level: {level + 1} in the "
                f"JSON DOM. Expected at level: {level}"
            )
        convert_leaf(item, dtype)  # raises for the first one it does not take


def decode_predict(doc: Any, sig: Any, sig_label: str) -> tuple[dict[str, np.ndarray], bool]:
    """Return (inputs by alias, row_format) of a parsed predict body for a SignatureDef."""
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
        return _decode_instances(doc["instances"], sig), True
    if has_inputs:
        return _decode_inputs(doc["inputs"], sig), False
    raise TfsError("Missing 'inputs' or 'instances' key")


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _decode_instances(instances: Any, sig: Any) -> dict[str, np.ndarray]:
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
                array = to_array(row[name], sig.inputs[name].dtype)
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


def _decode_inputs(inputs: Any, sig: Any) -> dict[str, np.ndarray]:
    names = sorted(sig.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise TfsError(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: to_array(inputs, sig.inputs[names[0]].dtype)}
    out = {}
    for name in names:  # extra keys are ignored, as TF Serving only walks the signature
        if name not in inputs:
            raise TfsError(f"Missing named input: {name} in 'inputs' object.")
        out[name] = to_array(inputs[name], sig.inputs[name].dtype)
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
