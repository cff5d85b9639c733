"""Warmup records are TF Serving PredictionLogs covering the batch/length grid and run as-is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.build import build
from export.predictor import PersistentPredictor
from export.warmup import read_warmup_inputs, read_warmup_records, warmup_shapes
from modelformat.layout import WARMUP_FILE


def test_warmup_records_cover_batches_and_lengths_and_run(classify_v1) -> None:  # type: ignore[no-untyped-def]
    records = read_warmup_records(classify_v1.path)
    shapes = [r["input_ids"].shape for sig, r in records if sig == "serving_default"]
    assert shapes == [(b, n) for b in (1, 8, 32) for n in (16, 32, 64)]
    predictor = PersistentPredictor(classify_v1.path)
    for signature, inputs in records:
        assert {k: v.dtype for k, v in inputs.items()} == dict.fromkeys(inputs, np.int32)
        out = predictor.predict(inputs, signature)
        assert out["probabilities"].shape == (inputs["input_ids"].shape[0], 3)
        assert np.isfinite(out["logits"]).all()


def test_records_are_prediction_logs_naming_the_signature(classify_v1) -> None:  # type: ignore[no-untyped-def]
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    raw = next(iter(tf.data.TFRecordDataset(str(classify_v1.path / WARMUP_FILE))))
    log = prediction_log_pb2.PredictionLog.FromString(raw.numpy())
    assert log.predict_log.request.model_spec.signature_name == "serving_default"
    assert set(log.predict_log.request.inputs) == {"input_ids", "attention_mask", "token_type_ids"}


@pytest.mark.parametrize(
    ("max_seq_len", "lens"), [(128, [16, 32, 64, 128]), (512, [16, 32, 64, 128]), (8, [8])]
)
def test_warmup_lengths_stop_at_max_seq_len(max_seq_len: int, lens: list[int]) -> None:
    assert sorted({n for _, n in warmup_shapes(max_seq_len)}) == lens


def test_no_warmup_writes_no_records(hf_classify: Path, tmp_path: Path) -> None:
    result = build(hf_classify, "nw", tmp_path, max_seq_len=16, warmup=False)
    assert not (result.path / WARMUP_FILE).exists()
    assert read_warmup_inputs(result.path) == []
