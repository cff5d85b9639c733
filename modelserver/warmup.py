"""Warmup replay: run a version's ``assets.extra/tf_serving_warmup_requests`` before serving it."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
from tensorflow_serving.apis import prediction_log_pb2

from modelserver.errors import ServingError, invalid
from modelserver.servable import LoadedVersion
from modelserver.tensors import to_numpy

log = logging.getLogger(__name__)

WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_RECORDS = 1000


def read_tfrecords(path: Path) -> Iterator[bytes]:
    """Yield the records of a TFRecord file, every length and data CRC checked.

    TensorFlow's own reader does the framing (uint64 length, masked crc32c of it, data, masked
    crc32c of the data), as TF Serving's warmup does: a bit flip or a cut file fails the load
    with DataLoss instead of feeding garbage (or a bogus length) to the model. It is the C++
    record reader called directly, not through ``tf.data.TFRecordDataset``, whose pipeline cost
    65 ms of CPU to build at every start for the same records (0.2 ms this way).
    """
    import tensorflow as tf
    from tensorflow.python.lib.io.tf_record import tf_record_random_reader

    _check_lengths(path)
    reader = tf_record_random_reader(str(path))
    offset = 0
    while True:
        try:
            record, offset = reader.read(offset)
        except IndexError:  # the reader's end of file
            return
        except tf.errors.OpError as exc:
            # Keep TF's reason ("corrupted record at 12"), not any op wrapped around it.
            reason = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*", "", exc.message, flags=re.S)
            raise ServingError(
                grpc.StatusCode.DATA_LOSS, f"Corrupt warmup data in {path}: {reason}"
            ) from None
        yield record


def _check_lengths(path: Path) -> None:
    """Raise DATA_LOSS unless each record's claimed length fits in the file.

    TensorFlow's reader allocates a record's claimed length before reading it: a length whose
    CRC matches (a crafted file; a random flip can't do it) of 2**50 bytes kills the process
    with a segmentation fault instead of failing the load. Only MAX_RECORDS + 1 records are
    looked at: the warmup stops there anyway.
    """
    size = path.stat().st_size
    offset = 0
    with path.open("rb") as stream:
        for _ in range(MAX_RECORDS + 1):
            if offset >= size:
                return
            stream.seek(offset)
            header = stream.read(8)
            length = int.from_bytes(header, "little") if len(header) == 8 else size
            end = offset + 12 + length + 4  # length, its CRC, data, data CRC
            if end > size:
                raise ServingError(
                    grpc.StatusCode.DATA_LOSS,
                    f"Corrupt warmup data in {path}: the record at byte {offset} runs past "
                    f"the end of the file ({size} bytes)",
                )
            offset = end


def run_warmup(
    servable: LoadedVersion,
    iterations: int = 1,
    duty_cycle: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Replay the warmup records against ``servable``; return how many ran. Errors fail the load.

    With ``duty_cycle`` < 1 each record is followed by a pause, so replay takes at most that
    share of the wall time (``modelserver.loading``: serving shares TensorFlow's threads).
    """
    path = servable.path / WARMUP_FILE
    if not path.is_file():
        log.info("No warmup data file found at %s", path)
        return 0
    count = 0
    for record in read_tfrecords(path):
        count += 1
        if count > MAX_RECORDS:
            raise invalid(f"Number of warmup records exceeds the maximum ({MAX_RECORDS}) at {path}")
        entry = prediction_log_pb2.PredictionLog.FromString(record)
        kind = entry.WhichOneof("log_type")
        if kind != "predict_log":
            if kind in ("classify_log", "regress_log", "multi_inference_log"):
                log.warning("skipping %s warmup record: only Predict is served here", kind)
                continue
            raise ServingError(
                grpc.StatusCode.UNIMPLEMENTED,
                f"Unsupported log_type for warmup: {kind}",
            )
        request = entry.predict_log.request
        inputs = {alias: to_numpy(t, alias) for alias, t in request.inputs.items()}
        plan = servable.plan(request.model_spec.signature_name, inputs, request.output_filter)
        started = time.perf_counter()
        for _ in range(iterations):
            servable.run(plan)
        if duty_cycle < 1:
            sleep((time.perf_counter() - started) * (1 / duty_cycle - 1))
    log.info(
        "Finished reading warmup data for model at %s. Number of warmup records read: %d.",
        path,
        count,
    )
    return count
