"""numpy ↔ TensorProto conversion (TF-free), for the gRPC client and its tests."""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from modelformat.protos import tensor_pb2

DT = tensor_pb2.DataType

# numpy dtype → TF DataType for what the gateway sends and reads.
_TO_DT: dict[np.dtype[Any], Any] = {
    np.dtype(np.float32): DT.DT_FLOAT,
    np.dtype(np.float64): DT.DT_DOUBLE,
    np.dtype(np.int32): DT.DT_INT32,
    np.dtype(np.int64): DT.DT_INT64,
    np.dtype(np.int16): DT.DT_INT16,
    np.dtype(np.int8): DT.DT_INT8,
    np.dtype(np.uint8): DT.DT_UINT8,
    np.dtype(np.uint16): DT.DT_UINT16,
    np.dtype(np.uint32): DT.DT_UINT32,
    np.dtype(np.uint64): DT.DT_UINT64,
    np.dtype(np.float16): DT.DT_HALF,
    np.dtype(np.bool_): DT.DT_BOOL,
}
_FROM_DT: dict[int, np.dtype[Any]] = {dt: np_dtype for np_dtype, dt in _TO_DT.items()}
# tensor_content is little-endian whatever the host: the dtype to read it with.
_FROM_DT_WIRE = {dt: np_dtype.newbyteorder("<") for dt, np_dtype in _FROM_DT.items()}
_LITTLE_ENDIAN = sys.byteorder == "little"
# The enum values as plain ints: ``DT.DT_HALF`` goes through protobuf's EnumTypeWrapper
# (~2.5 µs a lookup), and the hot path below compares a few of them per tensor.
_HALF, _BFLOAT16, _STRING = int(DT.DT_HALF), int(DT.DT_BFLOAT16), int(DT.DT_STRING)

# Which typed *_val field carries each dtype when tensor_content is empty.
_VAL_FIELD: dict[int, str] = {
    DT.DT_FLOAT: "float_val",
    DT.DT_DOUBLE: "double_val",
    DT.DT_INT32: "int_val",
    DT.DT_INT16: "int_val",
    DT.DT_INT8: "int_val",
    DT.DT_UINT8: "int_val",
    DT.DT_UINT16: "int_val",
    DT.DT_INT64: "int64_val",
    DT.DT_UINT32: "uint32_val",
    DT.DT_UINT64: "uint64_val",
    DT.DT_BOOL: "bool_val",
    DT.DT_HALF: "half_val",
    DT.DT_BFLOAT16: "half_val",
}


class TensorConversionError(ValueError):
    """A TensorProto the gateway cannot turn into a numpy array."""


def to_tensor_proto(array: np.ndarray) -> tensor_pb2.TensorProto:
    """Return a TensorProto carrying ``array`` as little-endian ``tensor_content`` bytes."""
    proto = tensor_pb2.TensorProto()
    fill_tensor_proto(proto, array)
    return proto


def fill_tensor_proto(proto: tensor_pb2.TensorProto, array: np.ndarray) -> None:
    """Write ``array`` into an empty ``proto`` in place (a map entry of a request: no copy)."""
    array = np.asarray(array)
    if array.dtype.kind in "OSU":  # strings: bytes in string_val (tensor_content can't hold them)
        proto.dtype = DT.DT_STRING
        for size in array.shape:
            proto.tensor_shape.dim.add(size=size)
        proto.string_val.extend(
            v if isinstance(v, bytes) else str(v).encode() for v in array.ravel().tolist()
        )
        return
    dtype = _TO_DT.get(array.dtype)
    if dtype is None:
        dtype = _TO_DT.get(array.dtype.newbyteorder("="))
    if dtype is None:
        raise TensorConversionError(f"cannot send numpy dtype {array.dtype}")
    proto.dtype = dtype
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add(size=size)
    # One bytes copy instead of a per-element typed field: ~10 µs for a [32,128] int32 batch.
    if not (_LITTLE_ENDIAN and array.dtype.isnative):
        # a big-endian array, or any array on a big-endian host
        array = array.astype(array.dtype.newbyteorder("<"))
    proto.tensor_content = np.ascontiguousarray(array).tobytes()


def from_tensor_proto(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """Return the numpy array in ``proto``, from ``tensor_content`` or the typed ``*_val`` field."""
    shape = tuple([d.size for d in proto.tensor_shape.dim])
    count = math.prod(shape)
    dtype = proto.dtype
    if dtype == _BFLOAT16:
        return _bfloat16_to_float32(proto, shape, count)
    if dtype == _STRING:
        strings = np.empty(len(proto.string_val), dtype=object)
        strings[:] = list(proto.string_val)
        return _fill(strings, shape, count)
    wire = _FROM_DT_WIRE.get(dtype)
    if wire is None:
        raise TensorConversionError(f"unsupported tensor dtype {DT.Name(dtype)}")
    content = proto.tensor_content
    if content:
        flat = np.frombuffer(content, dtype=wire)
        if flat.size != count:
            raise TensorConversionError(f"tensor_content has {flat.size} values for shape {shape}")
        if not _LITTLE_ENDIAN:
            flat = flat.astype(_FROM_DT[dtype])
        return flat.reshape(shape)
    # TF Serving answers with typed *_val fields unless --enable_serialization_as_tensor_content.
    packed = _PACKED_FIXED.get(dtype)
    if packed is not None and count > _PACKED_FROM:
        flat = _packed_values(proto, *packed)
        if flat is not None:
            return _fill(flat, shape, count)
    # list() first: numpy reads a list in one pass, a repeated field value by value (~2x).
    values = list(getattr(proto, _VAL_FIELD[dtype]))
    if dtype == _HALF:
        flat = np.array(values, dtype=np.uint16).view(np.float16)
    else:
        flat = np.array(values, dtype=_FROM_DT[dtype])
    return _fill(flat, shape, count)


# float_val / double_val: packed on the wire as little-endian fixed-width values, which numpy reads
# as they are: for [8, 32, 384] token vectors 0.04 ms against 7 ms through Python floats.
_PACKED_FIXED: dict[int, tuple[int, np.dtype[Any]]] = {
    int(DT.DT_FLOAT): (5, np.dtype("<f4")),
    int(DT.DT_DOUBLE): (6, np.dtype("<f8")),
}
_PACKED_FROM = 64  # values: below, the repeated field is read as it is


def _varint(buf: bytes, at: int) -> tuple[int, int]:
    """Return (the varint at ``at`` of ``buf``, where the next field starts)."""
    value = shift = 0
    while True:
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _packed_values(proto: tensor_pb2.TensorProto, number: int, wire: np.dtype[Any]) -> Any:
    """Return the values of the packed fixed-width repeated field ``number`` of ``proto`` read
    from its serialized bytes (one C serialization, no Python float per value), or None when
    that field is not packed there (the caller then reads the field)."""
    buf = proto.SerializeToString()
    chunks: list[np.ndarray] = []
    at, end = 0, len(buf)
    while at < end:
        key, at = _varint(buf, at)
        field, kind = key >> 3, key & 7
        if kind == 2:
            length, at = _varint(buf, at)
            if field == number:
                chunks.append(np.frombuffer(buf, wire, length // wire.itemsize, at))
            at += length
        elif field == number:
            return None  # unpacked values: legal, rare; read through the field
        elif kind == 0:
            _, at = _varint(buf, at)
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            return None
    flat = chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else None
    if flat is not None and not _LITTLE_ENDIAN:
        flat = flat.astype(wire.newbyteorder("="))
    return flat


def _fill(flat: np.ndarray, shape: tuple[int, ...], count: int) -> np.ndarray:
    """Return ``flat`` shaped as ``shape``; a single value broadcasts, as in TF's FromProto."""
    if flat.size == count:
        return flat.reshape(shape)
    if flat.size == 1:
        return np.full(shape, flat[0], dtype=flat.dtype)
    if flat.size == 0 and count == 0:
        return flat.reshape(shape)
    raise TensorConversionError(f"tensor has {flat.size} values for shape {shape}")


def _bfloat16_to_float32(
    proto: tensor_pb2.TensorProto, shape: tuple[int, ...], count: int
) -> np.ndarray:
    """Return a DT_BFLOAT16 tensor widened to float32 (bfloat16 is float32's top 16 bits)."""
    if proto.tensor_content:
        bits = np.frombuffer(proto.tensor_content, dtype="<u2")
    else:
        bits = np.asarray(proto.half_val, dtype=np.uint32).astype(np.uint16)
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    return _fill(widened, shape, count)
