"""modelformat/outputs.py reads what export writes into model.json's ``outputs``."""

from __future__ import annotations

from modelformat.outputs import (
    DenseOutput,
    MarkerSide,
    MultiVectorOutput,
    Outputs,
    SparseOutput,
    parse_outputs,
)


def test_a_plain_embedders_output_names_read_as_dense() -> None:
    # every embed export writes the signature's names there: ["embedding"], and embedding_dim
    info = {"task": "embed", "outputs": ["embedding"], "embedding_dim": 384}
    assert parse_outputs(info) == Outputs(dense=DenseOutput(dim=384))
    assert parse_outputs({"task": "classify", "outputs": ["logits", "probabilities"]}) is None


def test_kinds_round_trip() -> None:
    kinds = Outputs(
        dense=DenseOutput(dim=32, normalized=True),
        sparse=SparseOutput(form="token_weights", drop_ids=(0, 1, 2, 3)),
        multivector=MultiVectorOutput(
            dim=16, rows="attention", score="sum", skiplist_ids=(5, 6),
            query=MarkerSide(prefix_id=7, length=32, expansion_id=4),
            document=MarkerSide(prefix_id=8, length=180),
        ),
    )  # fmt: skip
    assert parse_outputs({"task": "embed", "outputs": kinds.to_info()}) == kinds
