"""Classification figures from label ids: accuracy, macro-F1, confusion matrix (pure numpy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def confusion(truth: Sequence[int], predicted: Sequence[int], n: int) -> np.ndarray:
    """Return the ``[n, n]`` confusion matrix: rows are true labels, columns predictions."""
    matrix = np.zeros((n, n), dtype=np.int64)
    np.add.at(matrix, (np.asarray(truth, dtype=np.int64), np.asarray(predicted, dtype=np.int64)), 1)
    return matrix


def macro_f1(matrix: np.ndarray) -> float:
    """Return the unweighted mean of the per-label F1 scores (0 for a label never hit)."""
    hits = np.diag(matrix).astype(np.float64)
    denominator = matrix.sum(axis=0) + matrix.sum(axis=1)  # predicted + true, per label
    f1 = np.divide(2 * hits, denominator, out=np.zeros_like(hits), where=denominator > 0)
    return float(f1.mean())


def scores(truth: Sequence[int], predicted: Sequence[int], labels: Sequence[str]) -> dict[str, Any]:
    """Return accuracy, macro-F1 and the confusion matrix (with its label order) as plain JSON."""
    matrix = confusion(truth, predicted, len(labels))
    total = int(matrix.sum())
    return {
        "examples": total,
        "accuracy": float(np.trace(matrix) / total) if total else 0.0,
        "macro_f1": macro_f1(matrix),
        "confusion_matrix": {
            "labels": list(labels),
            "rows_true_columns_predicted": matrix.tolist(),
        },
    }
