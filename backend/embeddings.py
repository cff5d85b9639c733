"""What an embedding model says of its vectors (prompts, normalization) and the output types.

Prompts (sentence-transformers' ``config_sentence_transformers.json``, in model.json's
``sentence_transformers`` entry): ``prompt_name`` picks one, prepended to every text as
``SentenceTransformer.encode(prompt_name=...)`` does; without one the model's
``default_prompt_name`` applies. Cohere's ``input_type`` maps onto the model's prompts:
``search_query`` -> ``query``, ``search_document`` -> ``document`` (else ``passage``),
``classification`` / ``clustering`` -> the prompt of that name; a model without such a prompt
embeds the text as it is.

Output types (Cohere v2's ``embedding_types``, infinity's ``embedding_dtype``; the rule is
sentence-transformers' ``quantize_embeddings``, which infinity calls):
- ``float``: float32 as the model answers;
- ``int8`` / ``uint8``: each component cut into 256 steps of the range [-1, 1], ``uint8`` =
  ``int((x + 1) / (2 / 255))`` and ``int8`` = ``int((x + 1) / (2 / 255) - 128)`` (truncation
  toward zero, as numpy's astype), of unit vectors only. The range is fixed (a unit vector's
  components lie in it) where infinity embeds a calibration set at start-up for per-dimension
  ranges and sentence-transformers, given none, takes the batch's own min and max: with a fixed
  range a text's answer never depends on the other texts of a request, nor on a download;
- ``binary`` / ``ubinary``: one bit per component, 1 where it is > 0, packed 8 to a byte
  (first component in the highest bit, the last byte zero-padded): ``ubinary`` the bytes as
  uint8, ``binary`` the bytes - 128 as int8; ceil(dim / 8) values per vector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

OUTPUT_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
INPUT_TYPES = ("search_query", "search_document", "classification", "clustering")
# Cohere's input_type -> the prompt names it stands for, first found wins
INPUT_TYPE_PROMPTS = {
    "search_query": ("query", "search_query"),
    "search_document": ("document", "passage", "search_document"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
QUANTIZED = ("int8", "uint8")


@dataclass(frozen=True)
class EmbeddingInfo:
    """An embedding version's prompts and whether its graph normalizes (model.json)."""

    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # a sentence-transformers model answers what SentenceTransformer.encode does: normalized
    # only if it has a Normalize module; other versions: the gateway normalizes by default
    normalize_by_default: bool = True
    include_prompt: bool = True


def embedding_info(info: Mapping[str, Any]) -> EmbeddingInfo:
    """Return the embedding side of model.json (ValueError for a malformed entry)."""
    entry = info.get("sentence_transformers")
    if entry is None:
        return EmbeddingInfo()
    if not isinstance(entry, Mapping):
        raise ValueError("model.json sentence_transformers must be an object")
    prompts = entry.get("prompts") or {}
    if not isinstance(prompts, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ValueError("model.json sentence_transformers.prompts must map names to strings")
    default = entry.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"model.json default_prompt_name {default!r} is not one of the prompts")
    return EmbeddingInfo(
        prompts=dict(prompts), default_prompt_name=default,
        normalize_by_default=bool(entry.get("normalize", False)),
        include_prompt=bool(entry.get("include_prompt", True)),
    )  # fmt: skip


def prompt_for(info: EmbeddingInfo, prompt_name: str | None, input_type: str | None) -> str:
    """Return the text to put before each input ("" for none).

    Raises ValueError (the caller's 422) for a prompt the model doesn't have, or a prompt on a
    model that pools without its prompt tokens (include_prompt false: not served).
    """
    if prompt_name is not None:
        if prompt_name not in info.prompts:
            have = sorted(info.prompts) or "none"
            raise ValueError(f"field 'prompt_name': the model has no prompt {prompt_name!r} "
                             f"(its prompts: {have})")  # fmt: skip
        name: str | None = prompt_name
    elif input_type is not None:
        name = next((n for n in INPUT_TYPE_PROMPTS[input_type] if n in info.prompts), None)
    else:
        name = info.default_prompt_name
    if name is None:
        return ""
    if not info.include_prompt:
        raise ValueError(
            f"the model's prompt {name!r} is left out of its pooling (include_prompt false), "
            "which this gateway does not serve: embed without a prompt"
        )
    return info.prompts[name]


def with_prompt(texts: Sequence[str], prompt: str) -> list[str]:
    """Return ``texts`` with ``prompt`` in front of each (as sentence-transformers does)."""
    return [prompt + text for text in texts] if prompt else list(texts)


def quantize(vectors: np.ndarray, kind: str) -> np.ndarray:
    """Return ``vectors`` [n, dim] (float32) as output type ``kind`` (see the module's rules).

    Raises ValueError for int8/uint8 of vectors that are not unit vectors.
    """
    if kind == "float":
        return vectors
    if kind in QUANTIZED:
        norms = np.linalg.norm(vectors, axis=1)
        if vectors.size and not np.all(np.abs(norms - 1.0) < 1e-3):
            raise ValueError(
                f"{kind} embeddings quantize unit vectors: send normalize=true (this model "
                "does not normalize its own)"
            )
        steps = (np.clip(vectors, -1.0, 1.0) + 1.0) / np.float32(2.0 / 255.0)
        if kind == "uint8":
            return steps.astype(np.uint8)
        return (steps - 128.0).astype(np.int8)
    if kind not in ("binary", "ubinary"):
        raise ValueError(f"output type must be one of {list(OUTPUT_TYPES)}, got {kind!r}")
    packed = np.packbits(vectors > 0, axis=-1)
    if kind == "ubinary":
        return packed
    return (packed.astype(np.int16) - 128).astype(np.int8)
