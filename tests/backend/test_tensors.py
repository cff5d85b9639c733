"""numpy ↔ TensorProto conversion: both encodings, broadcasting, half and bfloat16."""

from __future__ import annotations

import numpy as np
import pytest

from backend.tensors import TensorConversionError, from_tensor_proto, to_tensor_proto
from modelformat.protos import tensor_pb2

DT = tensor_pb2.DataType


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.int32, np.int64, np.float16, np.bool_, np.uint8]
)
def test_tensor_content_round_trips(dtype: type) -> None:
    array = (np.arange(24).reshape(2, 3, 4) % 3).astype(dtype)

    back = from_tensor_proto(to_tensor_proto(array))

    assert back.dtype == np.dtype(dtype) and back.shape == (2, 3, 4)
    np.testing.assert_array_equal(back, array)


def test_typed_float_val_is_read() -> None:
    proto = tensor_pb2.TensorProto(dtype=DT.DT_FLOAT, float_val=[1.0, 2.0, 3.0, 4.0])
    proto.tensor_shape.dim.add().size = 2
    proto.tensor_shape.dim.add().size = 2

    np.testing.assert_array_equal(from_tensor_proto(proto), [[1, 2], [3, 4]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_typed_float_vals_are_read_from_their_packed_bytes(dtype: type) -> None:
    """Past _PACKED_FROM values a float_val / double_val is read from the packed field's bytes
    (every bit kept: NaN, -0.0, subnormals); other fields of the proto around it skipped."""
    values = np.random.default_rng(0).normal(size=(3, 50, 7)).astype(dtype)
    values.flat[:4] = [np.nan, -0.0, np.finfo(dtype).tiny / 4, np.inf]
    field, dt = ("float_val", DT.DT_FLOAT) if dtype is np.float32 else ("double_val", DT.DT_DOUBLE)
    proto = tensor_pb2.TensorProto(dtype=dt, version_number=3, **{field: values.ravel().tolist()})
    for size in values.shape:
        proto.tensor_shape.dim.add().size = size

    got = from_tensor_proto(proto)

    assert got.dtype == dtype and got.shape == values.shape
    assert got.tobytes() == values.tobytes()


def test_the_model_servers_typed_floats_are_the_packed_field_extend_writes() -> None:
    from modelserver.tensors import to_proto

    values = np.random.default_rng(1).normal(size=(2, 40, 3)).astype(np.float32)
    proto = to_proto(values)
    slow = tensor_pb2.TensorProto(dtype=DT.DT_FLOAT, float_val=values.ravel().tolist())
    assert list(proto.float_val) == list(slow.float_val) and not proto.tensor_content
    assert from_tensor_proto(proto).tobytes() == values.tobytes()


def test_single_typed_value_broadcasts_to_the_shape() -> None:
    proto = tensor_pb2.TensorProto(dtype=DT.DT_INT32, int_val=[7])
    proto.tensor_shape.dim.add().size = 3

    np.testing.assert_array_equal(from_tensor_proto(proto), [7, 7, 7])


def test_half_val_carries_float16_bits() -> None:
    values = np.array([0.5, -2.0], dtype=np.float16)
    proto = tensor_pb2.TensorProto(dtype=DT.DT_HALF, half_val=values.view(np.uint16).tolist())
    proto.tensor_shape.dim.add().size = 2

    np.testing.assert_array_equal(from_tensor_proto(proto), values)


def test_bfloat16_widens_to_float32() -> None:
    values = np.array([1.5, -3.0, 0.15625], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    proto = tensor_pb2.TensorProto(dtype=DT.DT_BFLOAT16, tensor_content=bits.tobytes())
    proto.tensor_shape.dim.add().size = 3

    np.testing.assert_array_equal(from_tensor_proto(proto), values)


def test_wrong_value_count_is_an_error() -> None:
    proto = tensor_pb2.TensorProto(dtype=DT.DT_FLOAT, float_val=[1.0, 2.0])
    proto.tensor_shape.dim.add().size = 3

    with pytest.raises(TensorConversionError):
        from_tensor_proto(proto)


def test_string_tensors_round_trip_in_string_val() -> None:
    # the /tfs passthrough sends models' string inputs (bytes, or text as UTF-8)
    proto = to_tensor_proto(np.array([[b"a\xff", "\u00e9"]], dtype=object))

    assert list(proto.string_val) == [b"a\xff", "\u00e9".encode()] and not proto.tensor_content
    assert from_tensor_proto(proto).tolist() == [[b"a\xff", "\u00e9".encode()]]
