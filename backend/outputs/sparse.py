"""The sparse kind: per text, vocabulary ids with their weights (lexical / SPLADE vectors).

Three sources, one answer:
- ``token_weights`` (BGE-M3): each position's weight [batch, seq]; per text the max weight per
  token id, the model's ``drop_ids`` (CLS/EOS/PAD/UNK) and weights <= 0 left out
  (FlagEmbedding's ``_process_token_weights``);
- ``topk`` (SPLADE): the graph's top-k ids and values [batch, k]; zero values left out;
- an IDF table (inference-free SPLADE queries; modelformat/sparse_idf.py reads the asset):
  each token id present in the text weighs its stored value once, special tokens included
  (sentence-transformers' ``SparseStaticEmbedding``); no model call.

A text's entries are sorted by weight, largest first (ties: smaller id first); a request may
keep only its ``top_k`` largest and those at or over ``min_weight``. Windows of one text
(long_text=chunk) merge by the max weight per id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend.outputs.base import FLOAT_BYTES, INT_BYTES, Options
from modelformat.outputs import SPARSE_INDICES_OUTPUT, SPARSE_VALUES_OUTPUT, TOKEN_WEIGHTS_OUTPUT

NAME = "sparse"
OVERLAP_K = 10  # the shadow's measure: overlap of the 10 largest entries' ids
TOKEN_BYTES = 24  # a token string in the answer's tokens map, quoted, at most (estimate)


@dataclass(frozen=True, slots=True)
class SparseVector:
    """One text's entries: ids (int64) and weights (float32), largest weight first."""

    indices: np.ndarray
    values: np.ndarray


def _by_text(
    text: np.ndarray, ids: np.ndarray, values: np.ndarray, texts: int
) -> list[SparseVector]:
    """Return one vector per text of a batch's entries (``text``: each entry's text): those
    weighing > 0, largest first (ties: smaller id first). One sort for the whole batch."""
    keep = values > 0
    text, ids, values = text[keep], ids[keep].astype(np.int64), values[keep].astype(np.float32)
    order = np.lexsort((ids, -values, text))
    text, ids, values = text[order], ids[order], values[order]
    bounds = np.searchsorted(text, np.arange(1, texts))
    return [SparseVector(i, v) for i, v in zip(np.split(ids, bounds), np.split(values, bounds),
                                               strict=True)]  # fmt: skip


def _max_per_id(
    text: np.ndarray, ids: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return a batch's distinct (text, id) pairs and each one's max weight: one sort of the
    pairs as int64 keys (text above bit 32), ``np.maximum.reduceat`` over each run."""
    if ids.size == 0:
        return text, ids.astype(np.int64), values.astype(np.float32)
    key = (text.astype(np.int64) << 32) | ids.astype(np.int64)
    order = np.argsort(key, kind="stable")
    key, values = key[order], values[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    key = key[starts]
    return key >> 32, key & 0xFFFFFFFF, np.maximum.reduceat(values, starts)


def max_per_id(ids: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the distinct ids and each one's max weight."""
    _, ids, weights = _max_per_id(np.zeros(ids.shape, np.int64), ids, weights)
    return ids, weights


def from_token_weights(
    weights: np.ndarray, rows: Sequence[np.ndarray], drop_ids: Sequence[int]
) -> list[SparseVector]:
    """Return each text's vector from per-position weights [texts, seq] and its token ids:
    the batch's positions flattened, the specials and weights <= 0 dropped, the max per
    (text, id) and the ranking each done once for all texts (no loop over texts)."""
    texts = len(rows)
    if texts == 0:
        return []
    lengths = np.asarray([r.shape[0] for r in rows], dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float32)
    lengths = np.minimum(lengths, weights.shape[1])
    values = weights[np.arange(weights.shape[1]) < lengths[:, None]]  # row-major: text order
    ids = np.concatenate([r[:n] for r, n in zip(rows, lengths.tolist(), strict=True)])
    ids = ids.astype(np.int64)
    text = np.repeat(np.arange(texts, dtype=np.int64), lengths)
    keep = values > 0
    for drop in drop_ids:  # a handful of special ids: cheaper than np.isin
        keep &= ids != drop
    return _by_text(*_max_per_id(text[keep], ids[keep], values[keep]), texts)


def from_topk(indices: np.ndarray, values: np.ndarray) -> list[SparseVector]:
    """Return each text's vector from the graph's top-k ids and values [texts, k]."""
    indices, values = np.asarray(indices), np.asarray(values, dtype=np.float32)
    texts, k = indices.shape[0], indices.shape[1] if indices.ndim == 2 else 0
    text = np.repeat(np.arange(texts, dtype=np.int64), k)
    return _by_text(text, indices.reshape(-1), values.reshape(-1), texts)


def from_idf(rows: Sequence[np.ndarray], idf: np.ndarray) -> list[SparseVector]:
    """Return each text's vector of the IDF weights of the distinct ids in it."""
    out = []
    for ids in rows:
        distinct = np.unique(ids.astype(np.int64))
        distinct = distinct[(distinct >= 0) & (distinct < idf.shape[0])]
        out.extend(_by_text(np.zeros(distinct.shape, np.int64), distinct, idf[distinct], 1))
    return out


def extract(
    spec: Any, outputs: Mapping[str, np.ndarray], rows: Sequence[np.ndarray]
) -> list[SparseVector]:
    """Return each text's vector from a model's outputs (``spec``: model.json's sparse entry;
    ``rows``: each text's token ids as sent); KeyError naming a missing output."""
    if spec.form == "topk":
        return from_topk(outputs[SPARSE_INDICES_OUTPUT], outputs[SPARSE_VALUES_OUTPUT])
    return from_token_weights(outputs[TOKEN_WEIGHTS_OUTPUT], rows, spec.drop_ids)


def limit(vector: SparseVector, top_k: int | None, min_weight: float) -> SparseVector:
    """Return ``vector``'s entries at or over ``min_weight``, at most ``top_k`` of them."""
    keep = vector.values >= min_weight if min_weight > 0 else slice(None)
    indices, values = vector.indices[keep], vector.values[keep]
    if top_k is not None:
        indices, values = indices[:top_k], values[:top_k]
    return SparseVector(indices, values)


def merge(vectors: Sequence[SparseVector], owners: Sequence[int], texts: int) -> list[SparseVector]:
    """Return one vector per text: its windows' entries merged by the max weight per id."""
    if not vectors:
        return [SparseVector(np.zeros(0, np.int64), np.zeros(0, np.float32))] * texts
    sizes = [v.indices.shape[0] for v in vectors]
    text = np.repeat(np.asarray(owners, dtype=np.int64), sizes)
    ids = np.concatenate([v.indices for v in vectors])
    values = np.concatenate([v.values for v in vectors])
    return _by_text(*_max_per_id(text, ids, values), texts)


def lexical(a: SparseVector, b: SparseVector) -> float:
    """Return the lexical match of two vectors: the shared ids' weights multiplied, summed
    (FlagEmbedding's ``compute_lexical_matching_score``; SPLADE's dot product)."""
    _, left, right = np.intersect1d(a.indices, b.indices, assume_unique=True, return_indices=True)
    return float(np.dot(a.values[left].astype(np.float64), b.values[right]))


def answer(vector: SparseVector, tokens: Sequence[str] | None) -> dict[str, Any]:
    """Return one text's answer: indices and values (largest first), and with ``tokens`` (the
    vocabulary's token per index) the ``tokens`` map {token: weight} Elasticsearch's
    sparse_vector and OpenSearch's rank_features take."""
    item: dict[str, Any] = {"indices": vector.indices, "values": vector.values}
    if tokens is not None:
        item["tokens"] = dict(zip(tokens, vector.values.tolist(), strict=True))
    return item


def tei_answer(vector: SparseVector) -> list[dict[str, Any]]:
    """Return one text's entries as TEI's /embed_sparse answers them: [{index, value}] by id."""
    order = np.argsort(vector.indices, kind="stable")
    pairs = zip(vector.indices[order].tolist(), vector.values[order].tolist(), strict=True)
    return [{"index": i, "value": v} for i, v in pairs]


def answer_bytes(spec: Any, rows: Sequence[int], options: Options) -> int:
    """Return the most answer bytes a text's sparse vector takes: one entry per token (or the
    graph's k, or the request's top_k, the fewest), an index and a value each."""
    per_entry = INT_BYTES * 2 + FLOAT_BYTES + (TOKEN_BYTES + FLOAT_BYTES if options.with_tokens
                                               else 0)  # fmt: skip
    total = 0
    for tokens in rows:
        entries = spec.top_k if spec.form == "topk" else tokens
        if options.top_k is not None:
            entries = min(entries, options.top_k)
        total += entries * per_entry
    return total


def overlap(a: np.ndarray, b: np.ndarray, k: int = OVERLAP_K) -> float:
    """Return the share of the ``k`` largest-weight ids of ``a`` also among ``b``'s (1.0 when
    both are empty); a and b are [ids, weights] pairs of one text as rows."""
    top_a, top_b = set(a[:k].tolist()), set(b[:k].tolist())
    if not top_a and not top_b:
        return 1.0
    return len(top_a & top_b) / max(len(top_a), len(top_b))


def _ranked(indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Return one row's ids ranked by weight (weights > 0 only)."""
    keep = values > 0
    order = np.lexsort((indices[keep], -values[keep]))
    return indices[keep][order]


def agreement(
    served: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return the per-text top-10 overlap of two versions' sparse outputs ({} without them).

    ``token_weights`` rank positions (the same text tokenized alike: a position stands for its
    token); the top-k form ranks the graph's ids."""
    if SPARSE_INDICES_OUTPUT in served:
        key_s = (served[SPARSE_INDICES_OUTPUT], served[SPARSE_VALUES_OUTPUT])
        if SPARSE_INDICES_OUTPUT not in shadow:
            return {"sparse_overlap": [0.0] * len(key_s[0])}
        key_h = (shadow[SPARSE_INDICES_OUTPUT], shadow[SPARSE_VALUES_OUTPUT])
        return {"sparse_overlap": [
            overlap(_ranked(i, v), _ranked(j, w))
            for i, v, j, w in zip(*key_s, *key_h, strict=True)
        ]}  # fmt: skip
    if TOKEN_WEIGHTS_OUTPUT in served:
        a = served[TOKEN_WEIGHTS_OUTPUT]
        b = shadow.get(TOKEN_WEIGHTS_OUTPUT)
        if b is None or a.shape[0] != b.shape[0]:
            return {"sparse_overlap": [0.0] * len(a)}
        positions = np.arange(max(a.shape[1], b.shape[1]))
        return {"sparse_overlap": [
            overlap(_ranked(positions[: x.shape[0]], x), _ranked(positions[: y.shape[0]], y))
            for x, y in zip(a, b, strict=True)
        ]}  # fmt: skip
    return {}
