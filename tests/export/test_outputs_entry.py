"""model.json's ``outputs`` (modelformat/outputs.py) reads every embed version export writes."""

from __future__ import annotations

import pytest

from modelformat.outputs import parse_outputs


@pytest.mark.parametrize("outputs", [None, ["embedding"]])
def test_a_version_exported_before_the_entry_answers_dense(outputs: list[str] | None) -> None:
    # export wrote the signature's output names there before the entry, and "embedding_dim"
    info = {"task": "embed", "embedding_dim": 32, **({"outputs": outputs} if outputs else {})}
    parsed = parse_outputs(info)
    assert parsed is not None and parsed.kinds == ("dense",)
    assert parsed.dense is not None and parsed.dense.dim == 32


def test_a_classifier_has_no_output_kinds() -> None:
    assert parse_outputs({"task": "classify", "outputs": ["logits", "probabilities"]}) is None
