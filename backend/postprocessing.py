"""Post-processing of model outputs: scores per head, top-k with labels, L2 normalization.

Pure numpy. A classifier's scores are its head's activation of the logits (model.json's
``score_activation``: softmax, sigmoid, or none for regression); exports give them as the
``probabilities`` output, older ones as a softmax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from backend.errors import UpstreamError
from modelformat.heads import Head

# Up to this many scores in a batch, classifications() reads them all with one tolist() rather
# than gathering the picked ones with numpy (~10 µs of fixed cost, cheaper on big batches).
_SMALL_BATCH = 256


def softmax(logits: np.ndarray) -> np.ndarray:
    """Return the row-wise softmax of ``logits`` [batch, n] in float32."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """Return the element-wise logistic of ``logits`` in float32."""
    return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)


def activate(logits: np.ndarray, activation: str) -> np.ndarray:
    """Return a head's scores from its logits: ``softmax``, ``sigmoid`` or ``none`` (as is)."""
    if activation == "sigmoid":
        return sigmoid(logits)
    if activation == "none":
        return logits.astype(np.float32)
    return softmax(logits)


def head_scores(outputs: dict[str, np.ndarray], activation: str = "softmax") -> np.ndarray:
    """Return a classifier's scores [batch, labels]: its ``probabilities`` output (the export
    applies the head's activation), else ``activation`` of its ``logits``; 502 if neither."""
    probabilities = outputs.get("probabilities")
    if probabilities is not None:
        return probabilities
    if "logits" not in outputs:
        raise UpstreamError(
            "the model returned neither 'probabilities' nor 'logits' "
            f"(outputs: {sorted(outputs)}): is it a classifier?"
        )
    return activate(outputs["logits"], activation)


def top_k_indices(probabilities: np.ndarray, k: int) -> np.ndarray:
    """Return each row's ``k`` best indices, best first; ties by index (NaN scores last)."""
    k = max(1, min(k, probabilities.shape[-1]))
    # A stable sort on the negated scores keeps the lower label index first on ties.
    return np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]


def top_k(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (indices, scores) of each row's ``k`` largest values, best first; ties by index."""
    order = top_k_indices(probabilities, k)
    return order, np.take_along_axis(probabilities, order, axis=-1)


def classifications(
    outputs: dict[str, np.ndarray],
    labels: Sequence[str],
    k: int,
    *,
    with_logits: bool = False,
    head: Head | None = None,
    with_scores: bool = False,
) -> list[dict[str, Any]]:
    """Return one ``{"label", "score", "top_k": [...]}`` per row of a classifier's outputs.

    Sigmoid heads (multi-label, one-logit) add ``labels``: every label whose score is at or
    over its threshold, best first; ``with_scores`` adds ``scores``: every label's score in
    the model's label order.
    """
    head = head or Head()
    probabilities = head_scores(outputs, head.activation)
    width = probabilities.shape[-1]
    names = list(labels)
    if len(names) != width:
        # No labels, or a labels.txt that disagrees with the model: name the classes by index.
        names = [str(i) for i in range(width)]
    best = top_k_indices(probabilities, k)
    picked = best.tolist()
    # The picked scores as Python floats from one numpy call, not a numpy scalar per value.
    if probabilities.size <= _SMALL_BATCH:
        full = probabilities.tolist()
        scores = [[row[i] for i in top] for row, top in zip(full, picked, strict=True)]
    else:
        scores = np.take_along_axis(probabilities, best, axis=-1).tolist()
    logits = outputs["logits"].tolist() if with_logits and "logits" in outputs else None
    rows = []
    for row, (indices, row_scores) in enumerate(zip(picked, scores, strict=True)):
        ranked = [{"label": names[i], "score": s} for i, s in zip(indices, row_scores, strict=True)]
        item: dict[str, Any] = {
            "label": ranked[0]["label"],
            "score": ranked[0]["score"],
            "top_k": ranked,
        }
        if logits is not None:
            item["logits"] = logits[row]
        rows.append(item)
    if head.activation == "sigmoid" or with_scores:
        every = probabilities.tolist()
        thresholds = [head.threshold(name) for name in names]
        for item, row_scores in zip(rows, every, strict=True):
            if head.activation == "sigmoid":
                over = [i for i, s in enumerate(row_scores) if s >= thresholds[i]]
                over.sort(key=lambda i: -row_scores[i])
                item["labels"] = [{"label": names[i], "score": row_scores[i]} for i in over]
            if with_scores:
                item["scores"] = [
                    {"label": name, "score": s} for name, s in zip(names, row_scores, strict=True)
                ]
    return rows


# Label names that mean "relevant" when a cross-encoder has several labels (case-insensitive).
POSITIVE_LABELS = ("1", "yes", "true", "relevant", "positive", "entailment", "duplicate",
                   "paraphrase", "match", "similar", "label_1")  # fmt: skip


def positive_index(labels: Sequence[str]) -> int | None:
    """Return the column a cross-encoder ranks by: 0 for one logit; else the one label named
    as positive (``POSITIVE_LABELS``); else, with two labels, 1 (transformers' binary
    convention: 0 negative, 1 positive); else None."""
    if len(labels) <= 1:
        return 0
    named = [i for i, label in enumerate(labels) if label.strip().lower() in POSITIVE_LABELS]
    if len(named) == 1:
        return named[0]
    return 1 if len(labels) == 2 else None


def l2_normalize(embeddings: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Return each row scaled to unit L2 norm (all-zero rows stay zero)."""
    values = embeddings.astype(np.float32)
    norms = np.linalg.norm(values, axis=-1, keepdims=True)
    return values / np.maximum(norms, eps)
