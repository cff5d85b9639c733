"""The multi-vector kind: per text, one vector per kept token (ColBERT, BGE-M3's colbert_vecs).

Which positions a text keeps (model.json ``rows``):
- ``after_cls`` (BGE-M3): positions 1 .. n-1 of its n tokens: CLS out, the final EOS in
  (FlagEmbedding's ``_process_colbert_vecs``);
- ``attention`` (PyLate / Stanford ColBERT): a document keeps its real tokens whose id is not in
  ``skiplist_ids`` (punctuation, dropped after encoding); a query keeps every real token, and
  with query expansion all ``query.length`` positions, the [MASK] expansions included.

ColBERT's query and document tokenization (``mark``): the text cut to the side's length less
one, the side's marker id put at position 1 after CLS (attention 1, type 0), and a query with
expansion padded to its length with the expansion id, attention 0 there unless
``attend_to_expansion`` (PyLate's ``ColBERT.tokenize``). Each kept vector is L2-normalized.
MaxSim of a query against a document: per query row the best dot product with any document
row, reduced over the query rows by ``score``: ``mean`` (BGE-M3) or ``sum`` (ColBERT).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from backend.outputs.base import Options, encoded, number_bytes
from backend.postprocessing import l2_normalize
from backend.tokenization import Encoded
from modelformat.outputs import TOKEN_VECTORS_OUTPUT, MarkerSide, MultiVectorOutput

NAME = "multivector"


def side_of(spec: MultiVectorOutput, is_query: bool) -> MarkerSide | None:
    """Return the ColBERT side a text is encoded as (None: the model has no sides)."""
    return spec.query if is_query else spec.document


def max_tokens(side: MarkerSide | None, max_seq_len: int) -> int:
    """Return how many tokens (specials included, the marker not) a text of ``side`` keeps."""
    if side is None or side.length <= 0:
        return max_seq_len
    length = min(side.length, max_seq_len)
    return length - 1 if side.prefix_id is not None else length


def mark(encoded: Sequence[Encoded], side: MarkerSide, is_query: bool) -> list[Encoded]:
    """Return texts cut to ``max_tokens`` with the side's marker after CLS and, for queries with
    expansion, padded to the query length with the expansion id (see the module's doc)."""
    out = []
    for e in encoded:
        ids, types = e.ids, e.type_ids
        if side.prefix_id is not None:
            ids = np.insert(ids, 1, side.prefix_id).astype(np.int32)
            types = None if types is None else np.insert(types, 1, 0).astype(np.int32)
        attention = None
        if is_query and side.expansion_id is not None:
            real = ids.shape[0]
            extra = max(0, side.length - real)
            ids = np.concatenate([ids, np.full(extra, side.expansion_id, dtype=np.int32)])
            if types is not None:
                types = np.concatenate([types, np.zeros(extra, dtype=np.int32)])
            if not side.attend_to_expansion:
                attention = np.r_[np.ones(real, np.int32), np.zeros(extra, np.int32)]
        out.append(Encoded(ids, e.truncated, e.full_length + (side.prefix_id is not None),
                           types, attention))  # fmt: skip
    return out


def positions(spec: MultiVectorOutput, encoded: Encoded, is_query: bool) -> np.ndarray:
    """Return the positions of ``encoded`` whose vectors a text keeps (``rows``)."""
    n = encoded.ids.shape[0]
    if spec.rows == "after_cls":
        return np.arange(1, n)
    if is_query:
        query = spec.query
        if query is not None and query.expansion_id is not None:
            return np.arange(n)  # every query position, the expansions included
        mask = np.ones(n, bool) if encoded.attention is None else encoded.attention.astype(bool)
        return np.flatnonzero(mask)
    mask = np.ones(n, bool) if encoded.attention is None else encoded.attention.astype(bool)
    if spec.skiplist_ids:
        mask &= ~np.isin(encoded.ids, np.asarray(spec.skiplist_ids))
    return np.flatnonzero(mask)


def extract(
    spec: MultiVectorOutput,
    outputs: Mapping[str, np.ndarray],
    encoded: Sequence[Encoded],
    is_query: Sequence[bool],
) -> list[np.ndarray]:
    """Return each text's kept vectors [rows, dim] (float32, unit rows); KeyError when the
    model returned no ``token_vectors``."""
    matrix = outputs[TOKEN_VECTORS_OUTPUT]
    out = []
    for row, e, query in zip(matrix, encoded, is_query, strict=True):
        kept = np.asarray(row[positions(spec, e, query)], dtype=np.float32)
        out.append(np.ascontiguousarray(l2_normalize(kept)))
    return out


def merge(vectors: Sequence[np.ndarray], owners: Sequence[int], texts: int) -> list[np.ndarray]:
    """Return one matrix per text: its windows' rows concatenated, in window order."""
    parts: list[list[np.ndarray]] = [[] for _ in range(texts)]
    for owner, matrix in zip(owners, vectors, strict=True):
        parts[owner].append(matrix)
    return [np.concatenate(p) if p else np.zeros((0, 0), np.float32) for p in parts]


def maxsim(query: np.ndarray, document: np.ndarray, score: str) -> float:
    """Return MaxSim of ``query`` [q, dim] against ``document`` [d, dim]: each query row's
    best dot product with a document row, summed (``sum``) or averaged (``mean``)."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    best = (query @ document.T).max(axis=1)
    return float(best.mean() if score == "mean" else best.sum())


def expected_rows(spec: MultiVectorOutput, tokens: int, is_query: bool) -> int:
    """Return the most rows a text of ``tokens`` tokens (as sent) keeps."""
    if spec.rows == "after_cls":
        return max(0, tokens - 1)
    return tokens


def answer_bytes(spec: MultiVectorOutput, rows: Sequence[int], options: Options) -> int:
    """Return the answer bytes of texts of ``rows`` tokens each: rows x dims numbers, in each
    output type asked."""
    per_row = number_bytes(spec.dim or 1, options.types, options.encoding)
    return sum(expected_rows(spec, n, options.is_query) for n in rows) * per_row


def answer(
    matrix: np.ndarray, types: Sequence[str], quantize: Any, encoding: str = "float"
) -> dict[str, Any]:
    """Return one text's answer: its row count and vectors (float, and each other type asked
    under ``vectors_by_type``; ``quantize`` is embeddings.quantize): each type's rows as the
    array itself (JSON numbers, written by orjson straight from numpy) or, with ``encoding``
    base64, one string of the [rows, dim] matrix's little-endian bytes, row after row."""
    item: dict[str, Any] = {"rows": int(matrix.shape[0])}
    if "float" in types:
        item["vectors"] = encoded(matrix, encoding)
    others = [t for t in types if t != "float"]
    if others:
        item["vectors_by_type"] = {t: encoded(quantize(matrix, t), encoding) for t in others}
    return item


def _rows(matrix: np.ndarray) -> np.ndarray:
    """Return the unit rows of one text's [seq, dim] output that are not all zero (padding)."""
    norms = np.linalg.norm(matrix, axis=1)
    keep = norms > 1e-6
    return matrix[keep] / norms[keep][:, None]


def agreement(
    served: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return per text the MaxSim agreement of two versions' token vectors ({} without them):
    the mean of each row's best cosine with the other version's rows, both ways averaged
    (1.0: the same vectors)."""
    a = served.get(TOKEN_VECTORS_OUTPUT)
    if a is None:
        return {}
    b = shadow.get(TOKEN_VECTORS_OUTPUT)
    if b is None or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        return {"maxsim": [0.0] * len(a)}
    values = []
    for x, y in zip(a, b, strict=True):
        rx, ry = _rows(x), _rows(y)
        values.append((maxsim(rx, ry, "mean") + maxsim(ry, rx, "mean")) / 2.0)
    return {"maxsim": [float(np.clip(v, -1.0, 1.0)) for v in values]}
