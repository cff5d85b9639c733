"""Embedding output types and prompts (backend/embeddings.py), pure functions."""

from __future__ import annotations

import numpy as np
import pytest

from backend.embeddings import EmbeddingInfo, embedding_info, prompt_for, quantize, with_prompt


def _reference(embeddings: np.ndarray, precision: str) -> np.ndarray:
    """sentence-transformers' quantize_embeddings, written out, with ranges [-1, 1]."""
    if precision in ("int8", "uint8"):
        ranges = np.vstack([np.full(embeddings.shape[1], -1.0), np.full(embeddings.shape[1], 1.0)])
        starts = ranges[0, :].astype(np.float32)
        steps = ((ranges[1, :] - ranges[0, :]) / 255).astype(np.float32)
        if precision == "uint8":
            return ((embeddings - starts) / steps).astype(np.uint8)
        return ((embeddings - starts) / steps - 128).astype(np.int8)
    packed = np.packbits(embeddings > 0).reshape(embeddings.shape[0], -1)
    return packed if precision == "ubinary" else (packed - 128).astype(np.int8)


@pytest.fixture
def unit() -> np.ndarray:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(5, 64)).astype(np.float32)
    vectors[0, :3] = 0.0  # zeros are not > 0: bit 0
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["int8", "uint8", "binary", "ubinary"])
def test_output_types_follow_sentence_transformers_quantize_rule(
    unit: np.ndarray, kind: str
) -> None:
    got = quantize(unit, kind)

    want = _reference(unit, kind)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_binary_packs_the_first_component_into_the_highest_bit() -> None:
    vector = np.array([[1, -1, -1, -1, -1, -1, -1, 1, 1, 0.0]], dtype=np.float32)

    assert quantize(vector, "ubinary").tolist() == [[0b10000001, 0b10000000]]
    assert quantize(vector, "binary").tolist() == [[129 - 128, 128 - 128]]


def test_int8_is_refused_for_vectors_that_are_not_unit_vectors() -> None:
    with pytest.raises(ValueError, match="normalize=true"):
        quantize(np.full((1, 4), 3.0, dtype=np.float32), "int8")


def test_the_extremes_map_to_the_ends_of_the_range() -> None:
    vectors = np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=np.float32)

    # 2 / float32(2 / 255) truncates to 254, as in sentence-transformers' own rule
    assert quantize(vectors, "uint8")[:, 0].tolist() == [254, 0]
    assert quantize(vectors, "int8")[:, 0].tolist() == [126, -128]


INFO = embedding_info({"sentence_transformers": {
    "prompts": {"query": "query: ", "passage": "passage: ", "clustering": "cluster: "},
    "default_prompt_name": "query", "normalize": True, "include_prompt": True,
}})  # fmt: skip


@pytest.mark.parametrize(
    ("prompt_name", "input_type", "want"),
    [
        (None, None, "query: "),  # the default prompt
        ("passage", None, "passage: "),
        (None, "search_query", "query: "),
        (None, "search_document", "passage: "),  # no 'document': 'passage'
        (None, "clustering", "cluster: "),
        (None, "classification", ""),  # the model has none: the text as it is
    ],
)
def test_prompts_and_cohere_input_types_pick_the_models_prompt(
    prompt_name: str | None, input_type: str | None, want: str
) -> None:
    assert prompt_for(INFO, prompt_name, input_type) == want


def test_an_unknown_prompt_name_is_refused_with_the_models_prompts() -> None:
    with pytest.raises(ValueError, match=r"no prompt 'doc' \(its prompts: \['clustering'"):
        prompt_for(INFO, "doc", None)


def test_a_model_that_pools_without_its_prompt_is_refused_a_prompt() -> None:
    info = EmbeddingInfo(prompts={"query": "q: "}, include_prompt=False)

    assert prompt_for(info, None, None) == ""
    with pytest.raises(ValueError, match="include_prompt false"):
        prompt_for(info, "query", None)


def test_older_versions_have_no_prompts_and_normalize_by_default() -> None:
    info = embedding_info({"task": "embed"})

    assert info.normalize_by_default and prompt_for(info, None, "search_query") == ""
    assert with_prompt(["a", "b"], "query: ") == ["query: a", "query: b"]
