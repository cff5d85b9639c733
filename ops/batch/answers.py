"""What a batch job writes for each item: the route's own answer, or its error, as output lines.

The OpenAI Batch output line is ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error": null}``, ``body`` the answer the route gives over HTTP (built
by the same helpers: backend/api/openai.py, backend/service.py); a failed item's line has the
route's error body and status; a row of id and text written as OpenAI Batch output is answered
as ``/v1/embeddings`` answers one input. Parquet keeps the vectors; its errors use the same line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from backend.api.openai import _encode, _shortened
from backend.service import typed_embeddings
from ops.batch.inputs import Bad, Item


def request_id(job: str, index: int) -> str:
    """Return the stable id of the input line ``index`` of job ``job`` (the same on a rerun)."""
    return f"batch_req_{job[:16]}_{index}"


def error_line(job: str, bad: Bad) -> dict[str, Any]:
    """Return the error file's line for a bad input line."""
    rid = request_id(job, bad.index)
    return {
        "id": rid,
        "custom_id": bad.custom_id,
        "response": {"status_code": bad.status, "request_id": rid, "body": bad.body},
        "error": None,
    }


def answer_line(
    job: str, item: Item, vectors: np.ndarray, truncated: list[bool], tokens: int, version: int
) -> dict[str, Any]:
    """Return the output line of ``item``: its route's answer to its vectors."""
    name = item.spec.partition("@")[0].partition(":")[0]
    if item.route in ("rows", "openai"):  # a row: as /v1/embeddings answers one input
        body = _openai_body(item, vectors, tokens, f"{name}@{version}")
    else:
        body = _embed_body(item, vectors, truncated, name, version)
    return embed_line(job, item, body)


def embed_line(job: str, item: Item, answer: dict[str, Any]) -> dict[str, Any]:
    """Return the output line of ``item`` whose answer body is ``answer`` (an :embed item's:
    ``Gateway.embed``'s, its slice)."""
    rid = request_id(job, item.index)
    return {
        "id": rid,
        "custom_id": item.custom_id,
        "response": {"status_code": 200, "request_id": rid, "body": answer},
        "error": None,
    }


def _openai_body(item: Item, vectors: np.ndarray, tokens: int, model: str) -> dict[str, Any]:
    """Return /v1/embeddings' answer (backend/api/openai.py's ``embeddings``); a row (no
    request): float vectors as they are."""
    req = item.request
    if req is not None and req.dimensions is not None:
        vectors = _shortened(vectors, req.dimensions)
    kind = req.embedding_type if req is not None else "float"
    typed = typed_embeddings(vectors, [kind])[kind]
    encoding = req.encoding_format if req is not None else "float"
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(vector, encoding)}
        for i, vector in enumerate(typed)
    ]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}  # fmt: skip


def _embed_body(
    item: Item, vectors: np.ndarray, truncated: list[bool], name: str, version: int
) -> dict[str, Any]:
    """Return :embed's answer (backend/service.py's ``Gateway.embed``)."""
    answer: dict[str, Any] = {
        "model": {"name": name, "version": version},
        "embeddings": vectors,
        "dim": int(vectors.shape[-1]),
        "truncated": truncated,
    }
    types = item.request.embedding_types
    if types is not None:
        answer["embeddings_by_type"] = typed_embeddings(vectors, types)
        if "float" not in types:
            del answer["embeddings"]
    return answer
