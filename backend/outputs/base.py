"""What every output kind shares: the request's output options and the answer-size rule."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# JSON characters one number of an answer takes at most, by type (orjson: a float32 as
# "-0.123456789," is at most ~16; an int8 "-128," 5): the answer budget counts these
FLOAT_BYTES = 16
INT_BYTES = 5


@dataclass(frozen=True, slots=True)
class Options:
    """What a request asks of an embedder's outputs (the Plan carries it)."""

    kinds: tuple[str, ...] | None = None  # None: the model's default kinds
    is_query: bool = False  # queries (ColBERT's query side, inference-free SPLADE queries)
    top_k: int | None = None  # sparse: at most this many entries per text
    min_weight: float = 0.0  # sparse: entries under it are left out
    with_tokens: bool = False  # sparse: also the token strings with their weights
    types: tuple[str, ...] = ("float",)  # output types of dense and multi-vectors


def number_bytes(dim: int, types: tuple[str, ...]) -> int:
    """Return the answer bytes of one vector of ``dim`` components in each of ``types``."""
    total = 0
    for kind in types:
        if kind == "float":
            total += dim * FLOAT_BYTES
        elif kind in ("binary", "ubinary"):
            total += -(-dim // 8) * INT_BYTES
        else:
            total += dim * INT_BYTES
    return total


def row_lengths(encoded_lengths: list[int]) -> np.ndarray:
    """Return the tokens of each row as an int array."""
    return np.asarray(encoded_lengths, dtype=np.int64)
