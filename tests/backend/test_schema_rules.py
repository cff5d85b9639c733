"""What the gateway refuses, its OpenAPI document refuses too (issue 41 item 6: schemathesis found
two schema-valid requests the gateway answers 422): token ids with a prompt, an empty speed list."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from backend.openapi import openapi_document
from backend.settings import Settings


def _valid(name: str, body: dict[str, Any]) -> bool:
    """Return whether ``body`` is valid against the document's component schema ``name``."""
    doc = openapi_document(Settings())
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(schema).is_valid(body)


REFUSED = {
    "prompt_name with token ids": ("EmbeddingsRequest", {"model": "m", "input": [5, 6],
                                                         "prompt_name": "query"}),
    "input_type with lists of token ids": ("EmbeddingsRequest", {
        "model": "m", "input": [[5], [6.0]], "input_type": "search_query"}),
    "an empty speed list": ("ClassifyRequest", {"texts": ["hi"], "speed": []}),
}  # fmt: skip
ACCEPTED = {
    "prompt_name with texts": ("EmbeddingsRequest", {"model": "m", "input": ["hi"],
                                                     "prompt_name": "query"}),
    "token ids without a prompt": ("EmbeddingsRequest", {"model": "m", "input": [5, 6]}),
    "a speed per text": ("ClassifyRequest", {"texts": ["hi"], "speed": [0.5]}),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_the_schema_refuses_what_the_gateway_refuses(case: str) -> None:
    name, body = REFUSED[case]
    assert not _valid(name, body)


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_the_schema_accepts_what_the_gateway_serves(case: str) -> None:
    name, body = ACCEPTED[case]
    assert _valid(name, body)
