"""An inference-free SPLADE model's query side: its IDF table and the rule that encodes a query.

OpenSearch's doc-only models (sentence-transformers' ``SparseStaticEmbedding``) encode a query
without a model call: each token id present in the query (attention mask 1, each id once however
often it occurs) weighs its stored IDF value; ids whose value is 0 are left out. The table stores
0 for the specials the tokenizer adds around a text ([CLS]/[SEP], <s>/</s>): the query side
tokenizes without them, so ids tokenized with them (the gateway's tokenizer) answer the same.
Export writes the table as ``assets/sparse_idf.json``, a JSON object
``{"<token id>": weight}`` of the non-zero weights (model.json's
``outputs.sparse.query.asset``); the gateway reads it with ``read_idf`` and answers queries with
``encode_queries``. Numpy only (the gateway imports it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

IDF_ASSET = "sparse_idf.json"


def idf_entry(weights: np.ndarray) -> dict[str, float]:
    """Return the asset's JSON object for ``weights`` [vocab]: the non-zero ones by token id."""
    ids = np.flatnonzero(np.asarray(weights))
    return {str(int(i)): float(weights[i]) for i in ids}


def read_idf(source: str | Path | Mapping[str, Any], vocab_size: int) -> np.ndarray:
    """Return the weights per token id ``[vocab_size]`` float32 of an asset (a path or its
    parsed object); ValueError naming what is wrong (an id outside the vocabulary, a weight that
    is not a finite number)."""
    table = source if isinstance(source, Mapping) else json.loads(
        Path(source).read_text(encoding="utf-8")
    )  # fmt: skip
    if not isinstance(table, Mapping):
        raise ValueError(f"{IDF_ASSET} must be an object {{token id: weight}}")
    weights = np.zeros(vocab_size, np.float32)
    for key, value in table.items():
        index = int(key)
        if not 0 <= index < vocab_size:
            raise ValueError(f"{IDF_ASSET}: token id {key} outside the vocabulary ({vocab_size})")
        if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
            raise ValueError(f"{IDF_ASSET}: weight of {key} must be a finite number")
        weights[index] = value
    return weights


def encode_queries(
    input_ids: Sequence[Sequence[int]] | np.ndarray,
    attention_mask: Sequence[Sequence[int]] | np.ndarray,
    weights: np.ndarray,
    top_k: int | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Return, per query, ``(indices int32, values float32)``: every id present (mask 1) once,
    weighing ``weights[id]``, zeros left out, values descending (ties by id), the first ``top_k``
    when given: sentence-transformers' ``SparseStaticEmbedding`` with ``max_active_dims``."""
    out = []
    for ids, mask in zip(input_ids, attention_mask, strict=True):
        present = np.unique(np.asarray(ids, np.int64)[np.asarray(mask) > 0])
        values = weights[present]
        keep = values != 0
        present, values = present[keep], values[keep]
        order = np.lexsort((present, -values))[: top_k if top_k is not None else None]
        out.append((present[order].astype(np.int32), values[order].astype(np.float32)))
    return out
