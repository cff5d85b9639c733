"""Rerank: Cohere's and Jina's API (``POST /v1/rerank``, ``POST /v2/rerank``: the paths the
``cohere`` SDK's ``Client`` and ``ClientV2`` post to) and ours (``POST /v1/models/<m>:rerank``).

One translator onto ``Gateway.rerank``, which takes two kinds of model, all inputs in one
inference (the gateway buckets and chunks them):
- an embedding model: the query and the documents embedded together (with the model's query
  and document prompts, if it has them: backend/embeddings.py), ranked by cosine similarity;
  ``relevance_score`` = (1 + cosine) / 2, in [0, 1] like Cohere's scores;
- a cross-encoder (a sentence-pair classifier, model.json ``text_pair``): each (query, document)
  pair scored, ``token_type_ids`` 1 on the document; ``relevance_score`` is the head's score:
  one logit: its activation (sigmoid; raw for a regression head); several labels: the
  positive label's probability (``postprocessing.positive_index``: the one label named
  positive, relevant, yes, 1, entailment, ...; else, with two labels, the second).
- a retrieval model with multi-vectors (ColBERT, BGE-M3: model.json ``outputs``): MaxSim of
  the query's token vectors against each document's, ``relevance_score`` the sum (ColBERT)
  or mean (BGE-M3) of each query row's best match: not within [0, 1]; a ColBERT query and
  documents each tokenized on their side (markers, query expansion). ``weights`` [dense,
  sparse, colbert] on a model with all three: FlagEmbedding's weighted sum
  (w0 * dense + w1 * sparse + w2 * colbert) / (w0 + w1 + w2); a sparse-only model (SPLADE):
  the lexical match (the dot product of the sparse vectors).
Any other model is a 422 naming what it is.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

import numpy as np
from flask import Blueprint, Response

from backend import timing
from backend.api import (
    body_as,
    current_gateway,
    json_response,
    named_model,
    note_served,
)
from backend.errors import ERROR_SHAPES, GatewayError
from backend.schemas import RerankFields, RerankRequest

bp = Blueprint("rerank", __name__)
RerankT = TypeVar("RerankT", bound=RerankFields)


def cohere_error(error: GatewayError) -> dict[str, Any]:
    """Return ``error`` as Cohere's error body (the SDK raises by status; it reads ``message``)."""
    return {"message": error.message, "code": error.code}


ERROR_SHAPES[bp.name] = cohere_error


def rank(
    model: str, body: RerankFields, version: int | None, label: str | None
) -> tuple[int, list[dict[str, Any]], int]:
    """Return (version, results best first, tokens) for a rerank request whose body passed
    ``validate`` (stage ``answer`` orders the results)."""
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    done, scores = current_gateway().rerank(
        model, body.query, texts, version, label, direction=body.truncation_direction,
        weights=body.weights,
    )  # fmt: skip
    note_served(model, done.assets.version)
    with timing.stage("answer"):
        order = np.argsort(-scores, kind="stable")[: body.top_n]
        results = []
        for index in order.tolist():
            item: dict[str, Any] = {"index": index, "relevance_score": float(scores[index])}
            if body.return_documents:
                item["document"] = {"text": texts[index]}
            results.append(item)
    return done.assets.version, results, int(sum(done.token_counts))


def checked_body(kind: type[RerankT]) -> RerankT:
    """Return a rerank request's body as ``kind``, its query and documents checked against the
    limits every route shares (the view's ``validate`` stage)."""
    return body_as(kind)


def _standard(api_version: str) -> Response:
    with timing.stage("validate"):
        body = checked_body(RerankRequest)
        name, version, label = named_model(body.model)
    served, results, tokens = rank(name, body, version, label)
    with timing.stage("answer"):
        return json_response({
            "id": str(uuid.uuid4()), "results": results, "model": f"{name}@{served}",
            "usage": {"total_tokens": tokens},
            "meta": {"api_version": {"version": api_version}, "billed_units": {"search_units": 1}},
        })  # fmt: skip


@bp.post("/v1/rerank")
def rerank_v1() -> Response:
    """Rerank documents against a query (Cohere v1 / Jina request and answer)."""
    return _standard("1")


@bp.post("/v2/rerank")
def rerank_v2() -> Response:
    """Rerank documents against a query (Cohere v2 request and answer)."""
    return _standard("2")
