"""The OpenAPI 3.1 document, generated from the pydantic request and response models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from backend.schemas import (
    NOT_BLANK,
    ClassifyRequest,
    ClassifyResponse,
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereErrorResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    Health,
    ModelList,
    ModelRerankRequest,
    ModelRerankResponse,
    ModelStatusResponse,
    OpenAIErrorResponse,
    RerankRequest,
    RerankResponse,
    TagRequest,
    TagResponse,
    TeiErrorResponse,
    TeiSparseRequest,
    TeiSparseResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from backend.settings import Settings
from modelformat.names import LABEL_PATTERN, MODEL_NAME_PATTERN

REF = "#/components/schemas/{model}"
_ERRORS = {
    "400": "Malformed JSON, a wrong type or an unknown field.",
    "404": "Unknown model, version or label.",
    "413": "Body over GATEWAY_MAX_BODY_BYTES, more than GATEWAY_MAX_TEXTS texts (or lists "
    "of token ids), more tokens or rows than GATEWAY_MAX_REQUEST_TOKENS / "
    "GATEWAY_MAX_REQUEST_ROWS, or (embeddings) an answer or a model-server reply estimated over "
    "GATEWAY_MAX_ANSWER_BYTES (multi-vectors: rows x dims numbers), checked before the model "
    "runs.",
    "422": "Empty list, empty or non-string text, text over GATEWAY_MAX_TEXT_CHARS, a list "
    "of token ids over GATEWAY_MAX_TOKEN_IDS or with an id outside the vocabulary, "
    "text over max_seq_len with truncate=false, a pair whose first segment alone fills "
    "max_seq_len, the wrong task for the model (texts to a sentence-pair model, pairs to a "
    "single-text one, a tag request to a classifier, ...), a bad "
    "'speed' (not a number in [0, 1], or a list not one per text; wrong types included), "
    "a 'prompt_name' the embedding model lacks, int8/uint8 embeddings of vectors that are "
    "not unit vectors (normalize=false on a model that doesn't normalize), an output kind "
    "the model lacks (the message names those it has), a sparse 'top_k' over a SPLADE "
    "model's own, an 'is_query' contradicting 'input_type', rerank 'weights' on a model "
    "without dense, sparse and multi-vector outputs, or OpenAI's / Cohere's embeddings of a "
    "model without dense vectors.",
    "502": "The model server answered with an error.",
    "503": "The model server is unreachable (with Retry-After).",
    "504": "The model server did not answer within GATEWAY_TIMEOUT_S, or the request ran past "
    "its deadline (GATEWAY_TIMEOUT_S from its start).",
}


def _schemas() -> dict[str, Any]:
    """Return components.schemas for every model the API reads or writes."""
    out: dict[str, Any] = {}
    kinds: list[tuple[type[BaseModel], str]] = [
        (ClassifyRequest, "validation"),
        (TagRequest, "validation"),
        (TagResponse, "serialization"),
        (TeiSparseRequest, "validation"),
        (TeiSparseResponse, "serialization"),
        (EmbedRequest, "validation"),
        (EmbeddingsRequest, "validation"),
        (RerankRequest, "validation"),
        (CohereEmbedRequest, "validation"),
        (CohereEmbedResponse, "serialization"),
        (ModelRerankRequest, "validation"),
        (TokenizeRequest, "validation"),
        (DetokenizeRequest, "validation"),
        (EmbeddingsResponse, "serialization"),
        (ModelList, "serialization"),
        (RerankResponse, "serialization"),
        (ModelRerankResponse, "serialization"),
        (TokenizeResponse, "serialization"),
        (DetokenizeResponse, "serialization"),
        (OpenAIErrorResponse, "serialization"),
        (CohereErrorResponse, "serialization"),
        (TeiErrorResponse, "serialization"),
        (ClassifyResponse, "serialization"),
        (EmbedResponse, "serialization"),
        (ModelStatusResponse, "serialization"),
        (Health, "serialization"),
        (ErrorResponse, "serialization"),
    ]
    for model, mode in kinds:
        schema = model.model_json_schema(ref_template=REF, mode=mode)  # type: ignore[arg-type]
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return _sorted_enums(out)


def _sorted_enums(node: Any) -> Any:
    """Return ``node`` with every ``enum`` of strings sorted. typing caches ``Literal[...]`` by
    its values as a set, so a ``Literal["left", "right"]`` made first by any imported library
    comes back for our ``Literal["right", "left"]``: the document would depend on import order."""
    if isinstance(node, dict):
        return {key: sorted(value) if key == "enum" and all(isinstance(v, str) for v in value)
                else _sorted_enums(value) for key, value in node.items()}  # fmt: skip
    if isinstance(node, list):
        return [_sorted_enums(item) for item in node]
    return node


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=name)}}}


def _responses(
    ok: str, ok_schema: str, errors: list[str], error_schema: str = "ErrorResponse"
) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": ok, "content": _json(ok_schema)}}
    for code in errors:
        out[code] = {"description": _ERRORS[code], "content": _json(error_schema)}
    return out


_ALL_ERRORS = ["400", "404", "413", "422", "502", "503", "504"]


def _inference(
    summary: str, body: str, answer: str, *, in_path: bool = True, errors: str = "ErrorResponse"
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(body)},
        "responses": _responses(
            "The answer, in the order of the request's inputs, naming the serving version.",
            answer,
            _ALL_ERRORS,
            errors,
        ),
    }
    if in_path:
        operation["parameters"] = [_MODEL_PARAM]
    return {"post": operation}


# A served model's name as the naming rules say (a name they allow but no model has is a 404).
_MODEL_PARAM = {
    "name": "model",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": MODEL_NAME_PATTERN, "maxLength": 128},
}


_TFS_ERROR = {
    "application/json": {
        "schema": {
            "type": "object",
            "properties": {"error": {"type": "string"}},
            "required": ["error"],
        }
    }
}
_ANY_JSON = {"application/json": {"schema": {"type": "object"}}}
_TFS_ERRORS = {
    "400": "TF Serving's own 400 (bad JSON, input or signature), passed on.",
    "401": "No API key, or an unknown one (API keys on).",
    "403": "The API key may not use this model, version or label.",
    "404": "TF Serving's own 404: no such model or version.",
    "413": "Body over GATEWAY_MAX_BODY_BYTES or GATEWAY_TFS_MAX_BODY_BYTES, rows over "
    "GATEWAY_MAX_REQUEST_ROWS, tensor elements over GATEWAY_TFS_MAX_ELEMENTS or strings, "
    "lists and objects over GATEWAY_TFS_MAX_VALUES.",
    "429": "The API key is over its rate (Retry-After), or TF Serving's RESOURCE_EXHAUSTED.",
    "500": "TF Serving's own 500 (an error inside the model's graph), passed on.",
    "501": "TF Serving's own 501 (a dtype its JSON can't carry), passed on.",
    "503": "The model server is unreachable or overloaded (Retry-After).",
    "504": "The model server did not answer within GATEWAY_TIMEOUT_S.",
}
_TFS_PARAMS = {
    "model": _MODEL_PARAM,
    "version": {"name": "version", "in": "path", "required": True,
                "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}},
    "label": {"name": "label", "in": "path", "required": True,
              "schema": {"type": "string", "pattern": LABEL_PATTERN, "maxLength": 128}},
    "verb": {"name": "verb", "in": "path", "required": True,
             "schema": {"type": "string", "enum": ["classify", "predict", "regress"]}},
}  # fmt: skip


def _tfs_paths() -> dict[str, Any]:
    """Return the /tfs passthrough's paths: TF Serving's REST API, bodies as TF Serving's."""
    out: dict[str, Any] = {}
    for scope, names in (("", ["model"]), ("/versions/{version}", ["model", "version"]),
                         ("/labels/{label}", ["model", "label"])):  # fmt: skip
        base = "/tfs/v1/models/{model}" + scope

        def operation(summary: str, ok: str, params: list[str], codes: list[str]) -> Any:
            responses: dict[str, Any] = {"200": {"description": ok, "content": _ANY_JSON}}
            for code in codes:
                responses[code] = {"description": _TFS_ERRORS[code], "content": _TFS_ERROR}
            return {
                "summary": summary,
                "parameters": [_TFS_PARAMS[name] for name in params],
                "responses": responses,
            }

        gets = ["400", "401", "403", "404", "429", "503", "504"]
        out[base] = {"get": operation("TF Serving's model status", "Its status JSON", names, gets)}
        out[base + "/metadata"] = {
            "get": operation("TF Serving's model metadata", "Its metadata JSON", names, gets)
        }
        post = operation(
            "TF Serving's :predict, :classify or :regress (its request and answer bodies)",
            "TF Serving's answer",
            [*names, "verb"],
            ["400", "401", "403", "404", "413", "429", "500", "501", "503", "504"],
        )
        post["requestBody"] = {"required": True, "content": _ANY_JSON}
        out[base + ":{verb}"] = {"post": post}
    return out


def openapi_document(settings: Settings) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of the gateway's HTTP API."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bert-gateway",
            "version": "1",
            "description": "BERT-family text models behind TensorFlow Serving. Limits: "
            f"{settings.max_texts_per_request} texts, {settings.max_text_chars} characters "
            f"per text, {settings.max_token_ids} ids per list of token ids, "
            f"{settings.max_body_bytes} bytes per body.",
        },
        "paths": {
            "/v1/models/{model}:classify": _inference(
                "Classify texts", "ClassifyRequest", "ClassifyResponse"
            ),
            "/v1/models/{model}:tag": _inference(
                "Tag texts: entities with character offsets (token-classification models)",
                "TagRequest",
                "TagResponse",
            ),
            "/v1/models/{model}:embed": _inference("Embed texts", "EmbedRequest", "EmbedResponse"),
            "/v1/models/{model}:rerank": _inference(
                "Rank documents against a query (embedding models: cosine; cross-encoders)",
                "ModelRerankRequest",
                "ModelRerankResponse",
            ),
            "/v1/models/{model}:tokenize": _inference(
                "Tokens, ids and character offsets of texts",
                "TokenizeRequest",
                "TokenizeResponse",
            ),
            "/v1/models/{model}:detokenize": _inference(
                "Texts of token ids", "DetokenizeRequest", "DetokenizeResponse"
            ),
            "/v1/embeddings": _inference(
                "Create embeddings (OpenAI's API)",
                "EmbeddingsRequest",
                "EmbeddingsResponse",
                in_path=False,
                errors="OpenAIErrorResponse",
            ),
            "/v1/models": {
                "get": {
                    "summary": "Served models (OpenAI's API)",
                    "responses": _responses("The served models", "ModelList", []),
                }
            },
            "/v1/rerank": _inference(
                "Rerank (Cohere v1 / Jina API)",
                "RerankRequest",
                "RerankResponse",
                in_path=False,
                errors="CohereErrorResponse",
            ),
            "/v2/embed": _inference(
                "Embed texts (Cohere v2 API: embeddings by type)",
                "CohereEmbedRequest",
                "CohereEmbedResponse",
                in_path=False,
                errors="CohereErrorResponse",
            ),
            "/embed_sparse": _inference(
                "Sparse vectors of texts on the default model (text-embeddings-inference's "
                "API; GATEWAY_DEFAULT_MODEL)",
                "TeiSparseRequest",
                "TeiSparseResponse",
                in_path=False,
                errors="TeiErrorResponse",
            ),
            "/v2/rerank": _inference(
                "Rerank (Cohere v2 API)",
                "RerankRequest",
                "RerankResponse",
                in_path=False,
                errors="CohereErrorResponse",
            ),
            "/v1/models/{model}": {
                "get": {
                    "summary": "Versions, states and labels of a model",
                    "parameters": [_MODEL_PARAM],
                    "responses": _responses(
                        "The model's status", "ModelStatusResponse", ["404", "503", "504"]
                    ),
                }
            },
            "/healthz": {
                "get": {"summary": "Liveness", "responses": _responses("Alive", "Health", [])}
            },
            "/readyz": {
                "get": {
                    "summary": (
                        "Readiness: model server reachable, every served model AVAILABLE "
                        "(see below)"
                    ),
                    "responses": _responses("Ready", "Health", ["503"]),
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics of all workers",
                    "responses": {
                        "200": {
                            "description": "Prometheus text exposition",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
            **_tfs_paths(),
        },
        "components": {"schemas": _with_limits(_schemas(), settings)},
    }


def _with_limits(schemas: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Return ``schemas`` with this deployment's limits written in: every text (the ``Text``
    type: its non-blank pattern) at most GATEWAY_MAX_TEXT_CHARS, every list of texts at most
    GATEWAY_MAX_TEXTS (a rerank's documents one less: the query is a text too)."""

    def visit(node: Any, in_list_of_texts: str | None = None) -> None:
        if isinstance(node, dict):
            if node.get("pattern") == NOT_BLANK:
                node["maxLength"] = settings.max_text_chars
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    limits = {
        ("ClassifyRequest", "texts"): settings.max_texts_per_request,
        ("ClassifyRequest", "pairs"): settings.max_texts_per_request,
        ("TagRequest", "texts"): settings.max_texts_per_request,
        ("EmbedRequest", "texts"): settings.max_texts_per_request,
        ("TokenizeRequest", "texts"): settings.max_texts_per_request,
        ("DetokenizeRequest", "ids"): settings.max_texts_per_request,
        ("RerankRequest", "documents"): settings.max_texts_per_request - 1,
        ("CohereEmbedRequest", "texts"): settings.max_texts_per_request,
        ("ModelRerankRequest", "documents"): settings.max_texts_per_request - 1,
    }
    for option in schemas["TeiSparseRequest"]["properties"]["inputs"].get("anyOf", []):
        if option.get("type") == "array":
            option["maxItems"] = settings.max_texts_per_request
    for (name, field), most in limits.items():
        schemas[name]["properties"][field]["maxItems"] = most
    schemas["DetokenizeRequest"]["properties"]["ids"]["items"]["maxItems"] = settings.max_token_ids
    for option in schemas["EmbeddingsRequest"]["properties"]["input"].get("anyOf", []):
        if option.get("type") != "array":
            continue
        if option["items"].get("type") == "integer":  # one input's token ids
            option["maxItems"] = settings.max_token_ids
            continue
        option["maxItems"] = settings.max_texts_per_request
        if option["items"].get("type") == "array":  # a list of token-id lists
            option["items"]["maxItems"] = settings.max_token_ids
    for option in schemas["ClassifyRequest"]["properties"]["speed"].get("anyOf", []):
        if option.get("type") == "array":  # one per text (the description says: exactly)
            option["maxItems"] = settings.max_texts_per_request
    visit(schemas)
    return schemas
