"""What every output kind shares: the request's output options and the answer-size rule."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

# JSON characters one number of an answer takes at most, by type (orjson: a float32 as
# "-0.123456789," is at most ~16; an int8 "-128," 5): the answer budget counts these
FLOAT_BYTES = 16
INT_BYTES = 5
ENCODINGS = ("float", "base64")  # encoding_format: JSON numbers, or base64 of the bytes


@dataclass(frozen=True, slots=True)
class Options:
    """What a request asks of an embedder's outputs (the Plan carries it)."""

    kinds: tuple[str, ...] | None = None  # None: the model's default kinds
    is_query: bool = False  # queries (ColBERT's query side, inference-free SPLADE queries)
    top_k: int | None = None  # sparse: at most this many entries per text
    min_weight: float = 0.0  # sparse: entries under it are left out
    with_tokens: bool = False  # sparse: also the token strings with their weights
    types: tuple[str, ...] = ("float",)  # output types of dense and multi-vectors
    encoding: str = "float"  # dense and multi-vectors: JSON numbers, or "base64" of their bytes


def number_bytes(dim: int, types: tuple[str, ...], encoding: str = "float") -> int:
    """Return the answer bytes of one vector of ``dim`` components in each of ``types`` (as
    JSON numbers, or with ``encoding`` base64 as 4 characters per 3 bytes)."""
    total = 0
    for kind in types:
        if encoding == "base64":
            raw = dim * 4 if kind == "float" else -(-dim // 8) if "binary" in kind else dim
            total += -(-raw // 3) * 4 + 4  # its quotes and comma
        elif kind == "float":
            total += dim * FLOAT_BYTES
        elif kind in ("binary", "ubinary"):
            total += -(-dim // 8) * INT_BYTES
        else:
            total += dim * INT_BYTES
    return total


def encoded(array: np.ndarray, encoding: str) -> Any:
    """Return ``array`` as an answer carries it: the array itself (orjson writes its numbers
    straight from numpy), or with ``encoding`` base64 one string of its little-endian bytes
    (float32 4 bytes, int8/uint8 one; a matrix row after row)."""
    if encoding != "base64":
        return array
    raw = array.astype("<f4", copy=False) if array.dtype.kind == "f" else array
    return base64.b64encode(np.ascontiguousarray(raw).tobytes()).decode("ascii")


def row_lengths(encoded_lengths: list[int]) -> np.ndarray:
    """Return the tokens of each row as an int array."""
    return np.asarray(encoded_lengths, dtype=np.int64)
