"""The dense kind: one vector per text (``embedding [batch, dim]``), pooled by the graph."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from backend.outputs.base import Options, encoded, number_bytes
from backend.postprocessing import l2_normalize
from modelformat.outputs import DENSE_OUTPUT, DenseOutput

NAME = "dense"
OUTPUTS = (DENSE_OUTPUT,)


def answer_bytes(spec: DenseOutput, rows: Sequence[int], options: Options) -> int:
    """Return the answer bytes of one vector per text (``rows``: each text's token count)."""
    return len(rows) * number_bytes(spec.dim or 1024, options.types, options.encoding)


def encode_answer(answer: dict[str, Any], encoding: str) -> None:
    """Put ``answer``'s vectors (``embeddings``, ``embeddings_by_type``) in ``encoding``: with
    base64 each vector one string (OpenAI's ``encoding_format``)."""
    if encoding == "float":
        return
    if "embeddings" in answer:
        answer["embeddings"] = [encoded(v, encoding) for v in answer["embeddings"]]
    by_type = answer.get("embeddings_by_type")
    if by_type is not None:
        answer["embeddings_by_type"] = {
            kind: [encoded(v, encoding) for v in vectors] for kind, vectors in by_type.items()
        }


def vectors(embeddings: np.ndarray, normalize: bool) -> np.ndarray:
    """Return the float32 vectors [texts, dim], L2-normalized when ``normalize``."""
    if normalize:
        embeddings = l2_normalize(embeddings)
    return np.ascontiguousarray(embeddings, dtype=np.float32)


def pool(vectors: np.ndarray, owners: Sequence[int], weights: np.ndarray, texts: int) -> np.ndarray:
    """Return each text's windows' vectors averaged, weighted by ``weights`` (their tokens)."""
    pooled = np.zeros((texts, vectors.shape[1]), dtype=np.float32)
    np.add.at(pooled, np.asarray(owners), vectors * weights[:, None])
    totals = np.bincount(owners, weights=weights, minlength=texts)
    return pooled / np.maximum(totals, 1.0)[:, None].astype(np.float32)


def agreement(
    served: dict[str, np.ndarray], shadow: dict[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return the per-text cosine of two versions' dense vectors ({} without them)."""
    a, b = served.get(DENSE_OUTPUT), shadow.get(DENSE_OUTPUT)
    if a is None:
        return {}
    if b is None or a.shape != b.shape:
        return {"cosine": [0.0] * len(a)}  # another dimension: nothing in common
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.sum(a * b, axis=1) / np.maximum(norms, 1e-12)
    return {"cosine": [float(c) for c in np.clip(cosine, -1.0, 1.0)]}
