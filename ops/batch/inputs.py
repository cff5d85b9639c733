"""A batch job's input, read into items to embed and bad rows, by the gateway's own validation.

Two forms:

- the OpenAI Batch format: JSON Lines of ``{"custom_id", "method": "POST", "url", "body"}``,
  ``url`` one of the gateway's embedding routes (``/v1/embeddings``, whose body names its
  model, or ``/v1/models/{model}:embed``); each body is checked as the route checks it
  (backend/schemas.py), and a bad one becomes an error line with that route's error body;
- rows: JSON Lines or Parquet of an id and a text (field names given), all for one model.

Nothing here calls a server: model versions are resolved once, by the job, for every model spec
the items name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from backend import inputs
from backend.api.openai import openai_error
from backend.errors import BadRequest, GatewayError, NotFound, UnprocessableInput
from backend.schemas import (
    MODEL_SPEC,
    EmbeddingsRequest,
    EmbedRequest,
    parse_request,
)
from backend.settings import Settings

OPENAI = "/v1/embeddings"
EMBED_URL = re.compile(r"/v1/models/([^/:]+):embed")
ROUTES = (OPENAI, "/v1/models/{model}:embed")


@dataclass
class Item:
    """One input line to embed: its texts (or token ids), model and the route's options."""

    index: int  # the line's (row's) place in the input, from 0
    custom_id: str
    route: str  # "rows", "openai" or "embed"
    spec: str  # the model as named: "name", "name@3" or "name:stable"
    texts: list[str]
    token_ids: list[list[int]] | None = None
    request: Any = None  # the validated body (EmbeddingsRequest / EmbedRequest), rows: None
    options: tuple[Any, ...] = field(default=())  # items with equal options share calls

    @property
    def size(self) -> int:
        """Return the item's characters (its token ids' count): the job's sort key."""
        if self.token_ids is not None:
            return sum(len(ids) for ids in self.token_ids)
        return sum(len(text) for text in self.texts)

    @property
    def count(self) -> int:
        """Return how many inputs (rows of output) the item has."""
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)


@dataclass
class Bad:
    """One input line that is not run: its id (when it has one), HTTP status and error body."""

    index: int
    custom_id: str | None
    status: int
    body: dict[str, Any]


def error_body(route: str, error: GatewayError) -> dict[str, Any]:
    """Return ``error`` as ``route``'s error body (OpenAI's shape on /v1/embeddings)."""
    return openai_error(error) if route == "openai" else error.to_dict()


def split_spec(spec: str) -> tuple[str, int | None, str | None]:
    """Return (name, version, label) of ``name``, ``name@version`` or ``name:label``; 400 else."""
    if not MODEL_SPEC.fullmatch(spec):
        raise BadRequest(f"model {spec[:140]!r}: give 'name', 'name@<version>' or 'name:<label>'")
    name, at, version = spec.partition("@")
    if at:
        return name, int(version), None
    name, _, label = spec.partition(":")
    return name, None, label or None


def read_batch(path: Path, settings: Settings) -> Iterator[Item | Bad]:
    """Yield each line of an OpenAI Batch input file as an Item or a Bad row."""
    seen: dict[str, int] = {}
    with open(path, "rb") as lines:
        for index, raw in enumerate(lines):
            if not raw.strip():
                continue
            yield _batch_line(index, raw, settings, seen)


def _batch_line(index: int, raw: bytes, settings: Settings, seen: dict[str, int]) -> Item | Bad:
    """Return one batch line as an Item, or a Bad row with the gateway's error body."""
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Bad(index, None, 400, BadRequest(f"line {index + 1} is not JSON: {exc}").to_dict())
    if not isinstance(line, dict):
        return Bad(index, None, 400, BadRequest(f"line {index + 1} is not an object").to_dict())
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        error = BadRequest(f"line {index + 1}: field 'custom_id' must be a non-empty string")
        return Bad(index, None, 400, error.to_dict())
    if custom_id in seen:
        error = BadRequest(f"custom_id {custom_id!r} is repeated (line {seen[custom_id] + 1})")
        return Bad(index, custom_id, 400, error.to_dict())
    seen[custom_id] = index
    url, method = line.get("url"), line.get("method", "POST")
    match = EMBED_URL.fullmatch(url) if isinstance(url, str) else None
    if method != "POST" or (url != OPENAI and match is None):
        missing = NotFound(
            f"{method} {url} is not a route a batch job runs (POST to one of: {', '.join(ROUTES)})"
        )
        return Bad(index, custom_id, 404, missing.to_dict())
    route = "openai" if url == OPENAI else "embed"
    try:
        body = line.get("body")
        if not isinstance(body, dict):
            raise BadRequest("field 'body' must be a JSON object")
        if route == "openai":
            return _openai_item(index, custom_id, orjson.dumps(body), settings)
        assert match is not None
        return _embed_item(index, custom_id, match.group(1), orjson.dumps(body), settings)
    except GatewayError as exc:
        return Bad(index, custom_id, exc.status_code, error_body(route, exc))


def _openai_item(index: int, custom_id: str, raw: bytes, settings: Settings) -> Item:
    """Return a /v1/embeddings body as an Item (the route's checks: backend/api/openai.py)."""
    req = parse_request(EmbeddingsRequest, raw, settings)  # the one rule for every list
    split_spec(req.model)
    texts, token_ids = inputs.openai_inputs(req.input)
    options = ("openai", req.model, token_ids is not None, req.truncation_direction,
               req.prompt_name, req.input_type)  # fmt: skip
    return Item(index, custom_id, "openai", req.model, texts, token_ids, req, options)


def _embed_item(index: int, custom_id: str, model: str, raw: bytes, settings: Settings) -> Item:
    """Return a :embed body as an Item (the route's checks: backend/api/models.py)."""
    req = parse_request(EmbedRequest, raw, settings)
    spec = model
    if req.version is not None:
        spec = f"{model}@{req.version}"
    elif req.label is not None:
        spec = f"{model}:{req.label}"
    split_spec(spec)
    if req.long_text == "chunk":
        raise UnprocessableInput("long_text 'chunk' is not run by batch jobs: send 'truncate'")
    options = ("embed", spec, req.truncate, req.normalize, req.truncation_direction,
               req.prompt_name, req.input_type, tuple(req.outputs or ()), req.is_query,
               req.top_k, req.min_weight, req.return_tokens,
               tuple(req.embedding_types or ()))  # fmt: skip
    return Item(index, custom_id, "embed", spec, list(req.texts or []), None, req, options)


def read_rows(
    path: Path, spec: str, id_field: str, text_field: str, settings: Settings
) -> Iterator[Item | Bad]:
    """Yield each row of a JSONL or Parquet file of ids and texts as an Item or a Bad row."""
    for index, row in _rows(path):
        if isinstance(row, GatewayError):
            yield Bad(index, None, row.status_code, row.to_dict())
            continue
        ident, text = row.get(id_field), row.get(text_field)
        if ident is None or isinstance(ident, bool | dict | list):
            error = BadRequest(f"row {index + 1}: field {id_field!r} (the id) is missing")
            yield Bad(index, None, 400, error.to_dict())
            continue
        try:
            inputs.text(text, f"row {index + 1}: field {text_field!r}", inputs.Limits(settings))
        except GatewayError as exc:
            yield Bad(index, str(ident), exc.status_code, exc.to_dict())
            continue
        yield Item(index, str(ident), "rows", spec, [str(text)], options=("rows",))


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | GatewayError]]:
    """Yield (index, row) of a Parquet or JSONL file; a malformed line is a BadRequest."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        index = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=8192):
            for row in batch.to_pylist():
                yield index, row
                index += 1
        return
    with open(path, "rb") as lines:
        for index, raw in enumerate(lines):
            if not raw.strip():
                continue
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                yield index, BadRequest(f"line {index + 1} is not JSON: {exc}")
                continue
            if not isinstance(row, dict):
                yield index, BadRequest(f"line {index + 1} is not an object")
                continue
            yield index, row
