"""Warmup records are read with their CRCs checked: a damaged file fails the load, clearly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import tensorflow as tf

from modelserver.errors import ServingError
from modelserver.warmup import read_tfrecords


@pytest.fixture()
def records(tmp_path: Path) -> Path:
    path = tmp_path / "tf_serving_warmup_requests"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for payload in (b"first record", b"second record" * 20):
            writer.write(payload)
    return path


def test_intact_records_are_read_in_order(records: Path) -> None:
    assert list(read_tfrecords(records)) == [b"first record", b"second record" * 20]


def flip(at: int, bit: int = 0x01) -> Callable[[bytes], bytes]:
    """Return a damage that flips ``bit`` of byte ``at``."""
    return lambda data: data[:at] + bytes([data[at] ^ bit]) + data[at + 1 :]


def masked_crc32c(data: bytes) -> int:
    """Return TFRecord's masked CRC-32C of ``data`` (to craft a length whose CRC matches)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-7], id="truncated"),
        # The first record is bytes 0-27: length 0-7, its CRC 8-11, data 12-23, data CRC 24-27.
        pytest.param(flip(15), id="data-flip"),
        pytest.param(flip(9), id="length-crc-flip"),  # the length still fits: only its CRC tells
        pytest.param(flip(30), id="length-flip"),
        pytest.param(lambda data: b"\xff" * 8 + data[8:], id="bogus-length"),
    ],
)
def test_a_damaged_file_is_data_loss_not_garbage(records: Path, damage: object) -> None:
    records.write_bytes(damage(records.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ServingError) as info:
        list(read_tfrecords(records))
    assert info.value.code == grpc.StatusCode.DATA_LOSS
    assert str(records) in info.value.message and "{{" not in info.value.message


def test_a_length_past_the_end_is_data_loss_even_when_its_crc_matches(tmp_path: Path) -> None:
    # TensorFlow's reader would allocate the claimed 2**50 bytes first and crash the process.
    head = (1 << 50).to_bytes(8, "little")
    path = tmp_path / "tf_serving_warmup_requests"
    path.write_bytes(head + masked_crc32c(head).to_bytes(4, "little") + b"x" * 100)

    with pytest.raises(ServingError) as info:
        list(read_tfrecords(path))

    assert info.value.code == grpc.StatusCode.DATA_LOSS
    assert "past the end of the file" in info.value.message
