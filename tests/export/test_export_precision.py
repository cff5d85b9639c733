"""FP16/BF16 exports: measured against FP32, smaller on disk, same signature dtypes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from export.build import Tolerance, build
from export.errors import ExportError
from export.inspection import inspect_version
from export.predictor import PersistentPredictor
from export.warmup import token_batch
from modelformat.publish import tree_size


@pytest.fixture(scope="module")
def low_precision(hf_classify: Path, models: Path) -> dict[str, object]:
    """``hf_classify`` built in fp16 and bf16 (versions 2 and 3 of models/cls)."""
    return {
        p: build(
            hf_classify, "lowp", models, task="classify", precision=p, max_seq_len=64, warmup=False
        )
        for p in ("fp16", "bf16")
    }


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_low_precision_is_measured_and_within_default_tolerance(
    low_precision: dict, precision: str
) -> None:
    conversion = low_precision[precision].conversion
    assert 0 < conversion["max_abs_prob_diff"] <= 1e-2
    assert conversion["reference"] == "fp32"
    assert low_precision[precision].model_info["precision"] == precision


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_signature_stays_int32_in_float32_out(low_precision: dict, precision: str) -> None:
    signature = inspect_version(low_precision[precision].path)["signature"]
    assert set(signature["inputs"].values()) == {"int32[?, ?]"}
    assert signature["outputs"] == {"logits": "float32[?, 3]", "probabilities": "float32[?, 3]"}
    out = PersistentPredictor(low_precision[precision].path).predict(token_batch(2, 16, 303, 2, 3))
    assert out["probabilities"].dtype == np.float32


def test_fp16_variables_at_most_055_of_fp32(low_precision: dict, classify_v1) -> None:  # type: ignore[no-untyped-def]
    fp32 = tree_size(classify_v1.path / "variables")
    fp16 = tree_size(low_precision["fp16"].path / "variables")
    assert fp16 <= 0.55 * fp32, (fp16, fp32)


def test_embedding_bf16_cosine_is_recorded(hf_embed: Path, tmp_path: Path) -> None:
    result = build(
        hf_embed, "e", tmp_path, task="embed", precision="bf16", max_seq_len=32, warmup=False
    )
    assert result.conversion["min_cosine"] >= 0.999


def test_conversion_beyond_tolerance_publishes_nothing(hf_classify: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="beyond tolerance"):
        build(
            hf_classify,
            "strict",
            tmp_path,
            precision="bf16",
            max_seq_len=32,
            warmup=False,
            tolerance=Tolerance(max_prob_diff=1e-9),
        )
    assert not (tmp_path / "strict").exists()
