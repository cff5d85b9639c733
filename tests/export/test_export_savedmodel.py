"""A version directory honours contract 1 of docs/architecture.md, with standard TensorFlow ops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelformat.layout import LABELS_TXT, VOCAB_TXT, list_versions, read_model_info
from tests.export.conftest import tf_serving_bundle

CONTRACT_KEYS = {
    "name", "task", "max_seq_len", "do_lower_case", "precision", "labels", "pooling", "zero_shot",
    "inputs", "outputs", "hidden_size", "vocab_size", "num_layers", "source", "exporter_version",
    "created_at", "conversion",
}  # fmt: skip


def _op_types(version: Path) -> set[str]:
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((version / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0].graph_def
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops |= {node.op for node in function.node_def}
    return ops


@pytest.mark.parametrize("fixture", ["classify_v1", "embed_v1"])
def test_model_json_has_every_contract_key(fixture: str, request: pytest.FixtureRequest) -> None:
    result = request.getfixturevalue(fixture)
    info = read_model_info(result.path)
    assert info is not None and set(info) >= CONTRACT_KEYS
    assert info["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert info["source"]["format"] == "hf" and len(info["source"]["sha256"]) == 64
    vocab = (result.path / VOCAB_TXT).read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocab) == info["vocab_size"]
    if info["task"] == "classify":
        assert (result.path / LABELS_TXT).read_text().split() == info["labels"]
        assert info["outputs"] == ["logits", "probabilities"]
        assert info["pooling"] == "cls"  # a trained head reads the pooled [CLS] vector
    else:
        assert info["labels"] == [] and not (result.path / LABELS_TXT).exists()
        assert info["outputs"] == ["embedding"]
        assert info["pooling"] == "mean"


def test_only_registered_core_ops_no_python_callbacks(classify_v1) -> None:  # type: ignore[no-untyped-def]
    from tensorflow.python.framework import op_def_registry

    ops = _op_types(classify_v1.path)
    assert not ops & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
    assert [op for op in sorted(ops) if op_def_registry.get(op) is None] == []
    assert {"MatMul", "Softmax", "Erfc"} <= ops  # Erfc: the exact (erf) GELU


def test_published_versions_are_listed_by_layout(classify_v1, models: Path) -> None:  # type: ignore[no-untyped-def]
    assert classify_v1.version in list_versions(models / "cls")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_loads_and_runs_through_the_tf1_session_loader_tf_serving_uses(
    precision: str, hf_classify: Path, tmp_path: Path
) -> None:
    """TF Serving loads versions as a SavedModelBundle (graph + session), not as TF2 objects."""
    from export.build import build
    from export.predictor import PersistentPredictor
    from export.warmup import token_batch

    result = build(hf_classify, "m", tmp_path, precision=precision, max_seq_len=32, warmup=False)
    feeds = token_batch(3, 12, 303, cls_id=2, sep_id=3, seed=11)
    with tf_serving_bundle(result.path) as bundle:
        got = bundle.run("serving_default", feeds)
    expected = PersistentPredictor(result.path).predict(feeds)
    np.testing.assert_allclose(got["probabilities"], expected["probabilities"], atol=1e-6)
