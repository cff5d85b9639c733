"""Softmax, top-k with labels and L2 normalization."""

from __future__ import annotations

import numpy as np
import pytest

from backend.postprocessing import classifications, l2_normalize, softmax, top_k


def test_softmax_rows_sum_to_one_and_survive_large_logits() -> None:
    probs = softmax(np.array([[1000.0, 1000.0], [0.0, np.log(3.0)]], dtype=np.float32))

    np.testing.assert_allclose(probs, [[0.5, 0.5], [0.25, 0.75]], rtol=1e-6)


def test_top_k_is_best_first_and_breaks_ties_by_index() -> None:
    indices, scores = top_k(np.array([[0.2, 0.4, 0.4]]), 2)

    assert indices.tolist() == [[1, 2]]
    np.testing.assert_allclose(scores, [[0.4, 0.4]])


def test_classifications_name_labels_and_rank_top_k() -> None:
    outputs = {
        "probabilities": np.array([[0.1, 0.7, 0.2]], np.float32),
        "logits": np.array([[0.0, 2.0, 1.0]], np.float32),
    }

    [item] = classifications(outputs, ["neg", "neu", "pos"], 2, with_logits=True)

    assert item["label"] == "neu" and abs(item["score"] - 0.7) < 1e-6
    assert [t["label"] for t in item["top_k"]] == ["neu", "pos"]
    assert item["logits"] == [0.0, 2.0, 1.0]


def test_classifications_use_softmax_when_only_logits_come_back() -> None:
    [item] = classifications({"logits": np.array([[0.0, 0.0]], np.float32)}, ["a", "b"], 1)

    assert item["label"] == "a" and abs(item["score"] - 0.5) < 1e-6


def test_l2_normalize_gives_unit_rows_and_keeps_zero_rows() -> None:
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]], np.float32))

    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_classifier_outputs_without_scores_are_a_502_naming_what_came() -> None:
    from backend.errors import UpstreamError

    with pytest.raises(UpstreamError, match=r"neither 'probabilities' nor 'logits'.*embedding"):
        classifications({"embedding": np.zeros((1, 4), np.float32)}, ["a", "b"], 1)
