"""Warmup records are read with their CRCs checked: a damaged file fails the load, clearly."""

from __future__ import annotations

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


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:-7], id="truncated"),
        pytest.param(lambda data: data[:30] + bytes([data[30] ^ 0x01]) + data[31:], id="bit-flip"),
        pytest.param(lambda data: b"\xff" * 8 + data[8:], id="bogus-length"),
    ],
)
def test_a_damaged_file_is_data_loss_not_garbage(records: Path, damage: object) -> None:
    records.write_bytes(damage(records.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ServingError) as info:
        list(read_tfrecords(records))
    assert info.value.code == grpc.StatusCode.DATA_LOSS
    assert str(records) in info.value.message
