"""TensorProto <-> numpy conversion, both encodings (``tensor_content`` and typed ``*_val``)."""

from __future__ import annotations

from typing import Any

import numpy as np
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

from modelserver.errors import invalid

# dtype enum -> (numpy dtype, typed repeated field, TF's short dtype name used in error messages)
_DTYPES: dict[int, tuple[Any, str, str]] = {
    types_pb2.DT_FLOAT: (np.float32, "float_val", "float"),
    types_pb2.DT_DOUBLE: (np.float64, "double_val", "double"),
    types_pb2.DT_INT32: (np.int32, "int_val", "int32"),
    types_pb2.DT_UINT8: (np.uint8, "int_val", "uint8"),
    types_pb2.DT_INT16: (np.int16, "int_val", "int16"),
    types_pb2.DT_INT8: (np.int8, "int_val", "int8"),
    types_pb2.DT_UINT16: (np.uint16, "int_val", "uint16"),
    types_pb2.DT_INT64: (np.int64, "int64_val", "int64"),
    types_pb2.DT_BOOL: (np.bool_, "bool_val", "bool"),
    types_pb2.DT_STRING: (np.object_, "string_val", "string"),
    types_pb2.DT_HALF: (np.float16, "half_val", "half"),
    types_pb2.DT_UINT32: (np.uint32, "uint32_val", "uint32"),
    types_pb2.DT_UINT64: (np.uint64, "uint64_val", "uint64"),
}
_ENUM_BY_NUMPY = {np.dtype(v[0]): k for k, v in _DTYPES.items() if v[0] is not np.object_}


def dtype_name(dtype_enum: int) -> str:
    """Return TF's short name for a DataType enum (``float``, ``int32``...)."""
    if dtype_enum in _DTYPES:
        return _DTYPES[dtype_enum][2]
    return types_pb2.DataType.Name(dtype_enum).removeprefix("DT_").lower()


def numpy_dtype(dtype_enum: int) -> Any:
    """Return the numpy dtype for a DataType enum, or None when unsupported."""
    entry = _DTYPES.get(dtype_enum)
    return None if entry is None else entry[0]


def dtype_enum_of(array: np.ndarray) -> int:
    """Return the DataType enum of a numpy array (object/bytes arrays are DT_STRING)."""
    if array.dtype.kind in "OSU":
        return int(types_pb2.DT_STRING)
    return int(_ENUM_BY_NUMPY.get(array.dtype, types_pb2.DT_INVALID))


def to_numpy(proto: tensor_pb2.TensorProto, alias: str) -> np.ndarray:
    """Return the numpy array a TensorProto holds; raise ``tensor parsing error: <alias>``."""
    entry = _DTYPES.get(proto.dtype)
    if entry is None or proto.tensor_shape.unknown_rank:
        raise invalid(f"tensor parsing error: {alias}")
    np_dtype, field, _ = entry
    shape = [d.size for d in proto.tensor_shape.dim]
    if any(s < 0 for s in shape):
        raise invalid(f"tensor parsing error: {alias}")
    count = int(np.prod(shape, dtype=np.int64))
    try:
        if proto.tensor_content and np_dtype is not np.object_:
            flat = np.frombuffer(proto.tensor_content, dtype=np_dtype)
        elif np_dtype is np.object_:
            flat = np.array(list(proto.string_val), dtype=object)
        elif field == "half_val":
            flat = np.array(proto.half_val, dtype=np.uint16).view(np.float16)
        else:
            flat = np.array(getattr(proto, field), dtype=np_dtype)
    except ValueError:
        raise invalid(f"tensor parsing error: {alias}") from None
    if flat.size == count:
        return flat.reshape(shape)
    # Tensor::FromProto broadcasts a single typed value (and zero values mean zeros).
    if flat.size == 1 and not proto.tensor_content:
        return np.full(shape, flat[0], dtype=flat.dtype)
    if flat.size == 0 and not proto.tensor_content and np_dtype is not np.object_:
        return np.zeros(shape, dtype=np_dtype)
    raise invalid(f"tensor parsing error: {alias}")


def to_proto(array: np.ndarray, as_content: bool = False) -> tensor_pb2.TensorProto:
    """Return a TensorProto for ``array``: typed ``*_val`` fields like TF's AsProtoField.

    ``as_content`` packs little-endian bytes into ``tensor_content`` instead
    (``--enable_serialization_as_tensor_content``).
    """
    array = np.asarray(array)
    dtype_enum = dtype_enum_of(array)
    proto = tensor_pb2.TensorProto(dtype=dtype_enum)
    proto.tensor_shape.CopyFrom(shape_proto(array.shape))
    if dtype_enum == types_pb2.DT_STRING:
        proto.string_val.extend(
            v if isinstance(v, bytes) else str(v).encode() for v in array.ravel()
        )
        return proto
    entry = _DTYPES.get(dtype_enum)
    if entry is None:
        raise invalid(f"Unsupported output dtype: {array.dtype}")
    if as_content:
        proto.tensor_content = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        return proto
    field = entry[1]
    packed = _PACKED_FIXED.get(field)
    if packed is not None and array.size:
        # the same packed field extend() writes, from the array's bytes in one C parse (an
        # [8, 32, 384] float tensor: ~0.1 ms against 8 ms through Python floats)
        number, wire = packed
        raw = np.ascontiguousarray(array, dtype=wire).tobytes()
        proto.MergeFromString(_varint((number << 3) | 2) + _varint(len(raw)) + raw)
        return proto
    if field == "half_val":
        proto.half_val.extend(array.ravel().view(np.uint16).tolist())
    else:
        getattr(proto, field).extend(array.ravel().tolist())
    return proto


_PACKED_FIXED = {"float_val": (5, "<f4"), "double_val": (6, "<f8")}  # field number, wire type


def _varint(value: int) -> bytes:
    """Return ``value`` as a protobuf varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def shape_proto(shape: tuple[int | None, ...] | None) -> tensor_shape_pb2.TensorShapeProto:
    """Return a TensorShapeProto (None dims become -1, a None shape is unknown rank)."""
    proto = tensor_shape_pb2.TensorShapeProto()
    if shape is None:
        proto.unknown_rank = True
        return proto
    for size in shape:
        proto.dim.add(size=-1 if size is None else int(size))
    return proto
