"""TF Serving's REST JSON: predict request decoding and response encoding (reference §1.5–1.10).

Pure functions over parsed JSON and numpy arrays; the HTTP handler does the I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import grpc
import numpy as np
from tensorflow.core.framework import types_pb2

from modelserver.errors import ServingError, invalid
from modelserver.tensors import dtype_name, numpy_dtype

_INT_RANGES = {
    types_pb2.DT_INT8: (-(2**7), 2**7 - 1),
    types_pb2.DT_UINT8: (0, 2**8 - 1),
    types_pb2.DT_INT16: (-(2**15), 2**15 - 1),
    types_pb2.DT_UINT16: (0, 2**16 - 1),
    types_pb2.DT_INT32: (-(2**31), 2**31 - 1),
    types_pb2.DT_UINT32: (0, 2**32 - 1),
    types_pb2.DT_INT64: (-(2**63), 2**63 - 1),
    types_pb2.DT_UINT64: (0, 2**64 - 1),
}
_FLOATS = {types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE}
MAX_RANK = 64  # numpy's most dimensions (numpy 2); no model's input comes near it

_RAPIDJSON_MESSAGES = {
    "Expecting value": "Invalid value.",
    "Expecting property name enclosed in double quotes": "Missing a name for object member.",
    "Expecting ':' delimiter": "Missing a colon after a name of object member.",
    "Unterminated string starting at": "Missing a closing quotation mark in string.",
    "Invalid control character at": "Invalid encoding in string.",
    "Invalid \\escape": "Invalid escape character in string.",
}


def parse_body(body: bytes) -> Any:
    """Parse a request body like rapidjson with kParseStopWhenDone and NaN/Inf tokens."""
    text = body.decode("utf-8", errors="replace")
    stripped = text.lstrip()
    if not stripped:
        raise invalid("JSON Parse error: The document is empty")
    offset = len(text) - len(stripped)
    try:
        # raw_decode stops after the first complete value: trailing garbage is ignored.
        value, _ = json.JSONDecoder().raw_decode(stripped)
    except RecursionError:  # rapidjson parses iteratively; no tensor nests ~1,000 deep
        raise invalid(
            "JSON Parse error: the document nests deeper than this server reads "
            f"(a tensor has at most {MAX_RANK} dimensions)"
        ) from None
    except json.JSONDecodeError as exc:
        message = _RAPIDJSON_MESSAGES.get(exc.msg)
        if message is None and exc.msg.startswith("Expecting ','"):
            before = stripped[: exc.pos].rstrip()
            message = (
                "Missing a comma or '}' after an object member."
                if _innermost_open(before) == "{"
                else "Missing a comma or ']' after an array element."
            )
        raise invalid(
            f"JSON Parse error: {message or exc.msg + '.'} at offset: {exc.pos + offset}"
        ) from None
    return value


def _innermost_open(text: str) -> str:
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


DEBUG_BYTES = 256  # kMaxJsonDebugStringBytes
_END = object()


def debug_string(value: Any) -> str:
    """Return a compact dump of a JSON value for error messages, cut at 256 bytes: written
    only up to them (a 1 MiB value costs what its first 256 bytes do) and without recursion
    (a value nested 900 deep is 256 bytes of brackets)."""
    out: list[str] = []
    size = 0
    stack: list[tuple[str, Any, bool]] = []  # (closer, the items' iterator, whether an object)
    pending: list[Any] = [value]
    while size < DEBUG_BYTES:
        if pending:
            current = pending.pop()
            if isinstance(current, list):
                text = "["
                stack.append(("]", iter(current), False))
            elif isinstance(current, dict):
                text = "{"
                stack.append(("}", iter(current.items()), True))
            elif isinstance(current, str):
                text = json.dumps(current[:DEBUG_BYTES])
            else:
                text = json.dumps(current)
        elif stack:
            closer, items, is_object = stack[-1]
            item: Any = next(items, _END)
            if item is _END:
                text = closer
                stack.pop()
            else:
                text = "" if out[-1] in ("[", "{") else ","
                if is_object:
                    text += json.dumps(item[0][:DEBUG_BYTES]) + ":"
                    item = item[1]
                pending.append(item)
        else:
            break
        out.append(text)
        size += len(text)
    return "".join(out)[:DEBUG_BYTES]


def json_type(value: Any) -> str:
    """Return rapidjson's type name for a parsed JSON value."""
    if value is None:
        return "Null"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, dict):
        return "Object"
    if isinstance(value, list):
        return "Array"
    if isinstance(value, str):
        return "String"
    return "Number"


def _type_error(value: Any, dtype: int) -> ServingError:
    return invalid(
        f"JSON Value: {debug_string(value)} Type: {json_type(value)} is not of expected type: "
        f"{dtype_name(dtype)}"
    )


def convert_leaf(value: Any, dtype: int) -> Any:
    """Return one JSON leaf as a value of ``dtype``; raise TF Serving's type errors."""
    if dtype in _FLOATS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _type_error(value, dtype)
        try:
            return float(value)
        except OverflowError:  # an integer past a double's range: rapidjson reads it as inf
            return math.inf if value > 0 else -math.inf
    if dtype in _INT_RANGES:
        low, high = _INT_RANGES[dtype]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _type_error(value, dtype)
        return value
    if dtype == types_pb2.DT_BOOL:
        if not isinstance(value, bool):
            raise _type_error(value, dtype)
        return value
    if dtype == types_pb2.DT_STRING:
        if isinstance(value, str):
            return value.encode("utf-8")
        if isinstance(value, dict):
            return _b64(value)
        raise _type_error(value, dtype)
    raise ServingError(
        grpc.StatusCode.UNIMPLEMENTED,
        f"Conversion of JSON Value: {debug_string(value)} to type: {dtype_name(dtype)}",
    )


def _b64(value: dict[str, Any]) -> bytes:
    if list(value) != ["b64"] or not isinstance(value["b64"], str):
        raise invalid(f"JSON Value: {debug_string(value)} not formatted correctly for base64 data")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"Unable to base64 decode: {value['b64'][:64]}") from None


def _shape_of(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def to_array(value: Any, dtype: int) -> np.ndarray:
    """Return a JSON value (scalar, nested list, b64 object) as a numpy array of ``dtype``, as
    json_tensor.cc fills a TensorProto: the shape from the first path, each list's size and each
    leaf's level and type checked in order (the first bad one is the error), then built with
    the signature's dtype. numpy never infers a dtype from the client's JSON (a list of N
    numbers and one long string was an N x 4·len unicode array), and the walk is iterative."""
    np_dtype = numpy_dtype(dtype)
    shape = _shape_of(value)
    if len(shape) > MAX_RANK:  # TF Serving's TensorShape would refuse it past 254
        raise invalid(f"Too many dimensions in tensor: {len(shape)}, over {MAX_RANK}")
    leaves, kinds = _flatten(value, shape, dtype)
    if np_dtype is None:
        raise invalid(f"Unsupported dtype: {dtype_name(dtype)}")
    return _typed(leaves, dtype, np_dtype, kinds).reshape(shape)


def _typed(
    leaves: list[Any], dtype: int, np_dtype: Any, kinds: set[type] | None = None
) -> np.ndarray:
    """Return ``leaves`` as an array of ``np_dtype``: at C speed when their types (``kinds``,
    read first, never inferred) are what ``dtype`` takes, else leaf by leaf, the first bad one
    raising TF Serving's type error."""
    if kinds is None:
        kinds = set(map(type, leaves))
    if dtype in _FLOATS and kinds <= {int, float}:
        try:
            return np.array(leaves, dtype=np_dtype)
        except OverflowError:  # an integer past a double's range: leaf by leaf (an inf)
            pass
    elif dtype in _INT_RANGES and kinds <= {int}:
        try:
            wide = np.array(leaves, dtype=np.int64)
        except OverflowError:  # past int64 (a uint64's top half, or out of range): leaf by leaf
            pass
        else:
            low, high = _INT_RANGES[dtype]
            if not wide.size or (low <= wide.min() and wide.max() <= high):
                return wide.astype(np_dtype, copy=False)
    elif dtype == types_pb2.DT_BOOL and kinds <= {bool}:
        return np.array(leaves, dtype=np_dtype)
    converted = [convert_leaf(leaf, dtype) for leaf in leaves]
    if np_dtype is np.object_:
        array = np.empty(len(converted), dtype=object)  # bytes stay bytes, never a bytes_ dtype
        array[:] = converted
        return array
    return np.array(converted, dtype=np_dtype)


def _check_types(leaves: list[Any], dtype: int) -> None:
    """Raise TF Serving's error for the first of ``leaves`` that ``dtype`` does not take."""
    _typed(leaves, dtype, np.object_)


def _flatten(value: Any, shape: list[int], dtype: int) -> tuple[list[Any], set[type]]:
    """Return the leaves of ``value`` in order and their types, checking each list's size
    against ``shape`` and each leaf's level (an explicit stack: nesting depth costs no
    recursion). A structural error is raised after the leaves before it are type-checked, so
    the first error is the one TF Serving's in-order walk meets."""
    rank = len(shape)
    out: list[Any] = []
    kinds: set[type] = set()
    if rank == 0:
        return [value], {type(value)}
    stack: list[list[Any]] = [[value, 0]]  # a list being read, the index of its next item
    while stack:
        top = stack[-1]
        items, index = top
        level = len(stack)  # the level of the items of ``items``
        if level == rank:  # leaves: the whole list at once
            types = set(map(type, items))
            if list in types:
                first = next(i for i, item in enumerate(items) if isinstance(item, list))
                out.extend(items[:first])
                _check_types(out, dtype)
                raise invalid(
                    f"JSON Value: {debug_string(items[first])} found at incorrect level: "
                    f"{level + 1} in the JSON DOM. Expected at level: {level}"
                )
            out.extend(items)
            kinds |= types
            stack.pop()
            continue
        if index == len(items):
            stack.pop()
            continue
        top[1] = index + 1
        item = items[index]
        if not isinstance(item, list):
            _check_types(out, dtype)
            raise invalid(
                f"JSON Value: {debug_string(item)} found at incorrect level: {level} in the "
                f"JSON DOM. Expected at level: {rank}"
            )
        if len(item) != shape[level]:
            _check_types(out, dtype)
            raise invalid(
                f"Encountered list at unexpected size: {len(item)} at level: {level} expected "
                f"size: {shape[level]}"
            )
        stack.append([item, 0])
    return out, kinds


def decode_predict(doc: Any, sig: Any, sig_label: str) -> tuple[dict[str, np.ndarray], bool]:
    """Return (inputs by alias, row_format) for a parsed predict body against a SignatureDef."""
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {debug_string(doc)} Is not object")
    if not sig.inputs:
        raise invalid(f"Failed to get input map for signature: {sig_label}")
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances and has_inputs:
        raise invalid(
            f"JSON Value: {debug_string(doc)} Not formatted correctly expecting only one of "
            "'inputs' or 'instances' keys to exist "
        )
    if has_instances:
        return _decode_instances(doc["instances"], sig), True
    if has_inputs:
        return _decode_inputs(doc["inputs"], sig), False
    raise invalid("Missing 'inputs' or 'instances' key")


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _decode_instances(instances: Any, sig: Any) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid("Expecting 'instances' to be an list/array")
    if not instances:
        raise invalid("No values in 'instances' array")
    names = sorted(sig.inputs)
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if len(names) > 1 and not objects:
        raise invalid(
            "instances is a plain list, but expecting list of objects as multiple input "
            "tensors required as per tensorinfo_map"
        )
    columns: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for index, element in enumerate(instances):
        is_object = isinstance(element, dict) and not _is_b64(element)
        if objects and not is_object:
            raise invalid(f"Expecting object but got list at item {index} of input list")
        if not objects and is_object:
            raise invalid(f"Expecting value/list but got object at item {index} of input list")
        row = element if objects else {names[0]: element}
        for key in row:
            if key not in sig.inputs:
                raise invalid(
                    f"Failed to process element: {index} key: {key} of 'instances' list. Error: "
                    f"INVALID_ARGUMENT: JSON object: does not have named input: {key}"
                )
        if set(row) != set(names):
            raise invalid(
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
                        raise invalid(f"Expecting tensor size: {first.size} but got: {array.size}")
                    raise invalid(
                        f"Expecting shape [{','.join(map(str, first.shape))}] but got: "
                        f"[{','.join(map(str, array.shape))}]"
                    )
            except ServingError as exc:
                if exc.code != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                raise invalid(
                    f"Failed to process element: {where} of 'instances' list. Error: "
                    f"INVALID_ARGUMENT: {exc.message}"
                ) from None
            columns[name].append(array)
    return {name: np.stack(parts) for name, parts in columns.items()}


def _decode_inputs(inputs: Any, sig: Any) -> dict[str, np.ndarray]:
    names = sorted(sig.inputs)
    if not isinstance(inputs, dict) or _is_b64(inputs):
        if len(names) > 1:
            raise invalid(
                "inputs is a plain value/list, but expecting an object as multiple input "
                "tensors required as per tensorinfo_map"
            )
        return {names[0]: to_array(inputs, sig.inputs[names[0]].dtype)}
    out = {}
    for name in names:  # extra keys are ignored, as TF Serving only walks the signature
        if name not in inputs:
            raise invalid(f"Missing named input: {name} in 'inputs' object.")
        out[name] = to_array(inputs[name], sig.inputs[name].dtype)
    return out
