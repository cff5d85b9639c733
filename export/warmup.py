"""Warmup records: ``assets.extra/tf_serving_warmup_requests`` in TF Serving's PredictionLog format.

TF Serving replays these once at load time so the first real request does not pay for kernel
selection and memory allocation; the modelserver replays them the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modelformat.buckets import buckets, signature_name
from modelformat.layout import WARMUP_FILE

DEFAULT_SIGNATURE = "serving_default"
BATCH_SIZES = (1, 8, 32)
SEQ_LENS = (16, 32, 64, 128)
MAX_RECORDS = 1000  # TF Serving refuses to load a version with more warmup records


def warmup_shapes(max_seq_len: int) -> list[tuple[int, int]]:
    """Return the (batch, seq) shapes to warm up: batch 1/8/32 at 16/32/64/128 up to max_seq_len."""
    lens = [n for n in SEQ_LENS if n <= max_seq_len] or [max_seq_len]
    return [(b, n) for b in BATCH_SIZES for n in lens]


def warmup_plan(max_seq_len: int) -> list[tuple[str, int, int]]:
    """Return (signature, batch, seq) for every warmup record.

    ``serving_default`` at :func:`warmup_shapes`, then each ``seq_<L>`` bucket signature at
    batch 1/8/32: TF Serving warms (and batches) each signature separately.
    """
    plan = [(DEFAULT_SIGNATURE, b, n) for b, n in warmup_shapes(max_seq_len)]
    plan += [(signature_name(n), b, n) for n in buckets(max_seq_len) for b in BATCH_SIZES]
    return plan[:MAX_RECORDS]


def token_batch(
    batch: int,
    seq: int,
    vocab_size: int,
    cls_id: int,
    sep_id: int,
    seed: int = 0,
    speed: float | None = None,
) -> dict[str, np.ndarray]:
    """Return a deterministic batch of ``[CLS] random tokens [SEP]`` rows of varied lengths.

    ``speed`` adds the early-exit graph's ``speed`` input (that value for every row).
    """
    rng = np.random.default_rng(seed)
    low = min(5, vocab_size - 1)  # skip the usual special ids at the start of BERT vocabularies
    ids = rng.integers(low, vocab_size, size=(batch, seq), dtype=np.int64).astype(np.int32)
    lengths = rng.integers(max(2, seq // 2), seq + 1, size=batch)
    lengths[0] = seq  # at least one full-length row
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = cls_id
    ids[np.arange(batch), lengths - 1] = sep_id
    ids = ids * mask  # padding id 0
    out = {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": np.zeros((batch, seq), dtype=np.int32),
    }
    if speed is not None:
        out["speed"] = np.full(batch, speed, dtype=np.float32)
    return out


def write_warmup(
    version_path: str | Path,
    model_name: str,
    batches: Sequence[dict[str, np.ndarray]],
    signature_names: Sequence[str] | None = None,
) -> Path:
    """Write one PredictionLog record per batch (for its signature) and return the file's path."""
    import tensorflow as tf
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    path = Path(version_path) / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        names = signature_names or [DEFAULT_SIGNATURE] * len(batches)
        for inputs, signature in zip(batches, names, strict=True):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature)
            )
            for name in sorted(inputs):  # the token inputs, and speed for early-exit graphs
                request.inputs[name].CopyFrom(tf.make_tensor_proto(inputs[name]))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request)
            )
            writer.write(log.SerializeToString())
    return path


def read_warmup_inputs(version_dir: str | Path) -> list[dict[str, np.ndarray]]:
    """Return the inputs of every Predict warmup record of a version ([] when it has none)."""
    return [inputs for _, inputs in read_warmup_records(version_dir)]


def read_warmup_records(version_dir: str | Path) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Return (signature name, inputs) of every Predict warmup record ([] when it has none)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = Path(version_dir) / WARMUP_FILE
    if not path.is_file():
        return []
    out = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        if log.WhichOneof("log_type") != "predict_log":
            continue  # classify/regress/multi-inference records do not apply to this signature
        request = log.predict_log.request
        inputs = {name: tf.make_ndarray(request.inputs[name]) for name in request.inputs}
        out.append((request.model_spec.signature_name or DEFAULT_SIGNATURE, inputs))
    return out
