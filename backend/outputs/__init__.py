"""An embedder's output kinds, as data: one module per kind (model.json's ``outputs``;
modelformat/outputs.py is the contract), registered in ``KINDS`` as export/architectures/ is a
table. Each module owns its post-processing, its answer's shape, its answer-bytes estimate for
the answer budget (GATEWAY_MAX_ANSWER_BYTES) and its shadow agreement measure; here, the size of
the model server's reply (``reply_outputs``, ``reply_numbers``), counted against the same budget
before the call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend.outputs import dense, multivector, sparse
from backend.outputs.base import FLOAT_BYTES, Options
from modelformat.outputs import (
    DENSE_OUTPUT,
    SPARSE_INDICES_OUTPUT,
    SPARSE_VALUES_OUTPUT,
    TOKEN_VECTORS_OUTPUT,
    TOKEN_WEIGHTS_OUTPUT,
    kind_outputs,
)
from modelformat.outputs import Outputs as ModelOutputs

# a number's bytes in the model server's reply, by transport: gRPC's tensor_content (and packed
# *_val fields) and the in-process arrays 4, REST's JSON at most one answer number's characters
REPLY_NUMBER_BYTES = {"grpc": 4, "local": 4, "rest": FLOAT_BYTES}
UNKNOWN_DIM = 1024  # a dimension model.json leaves out (older exports): counted as BGE-M3's


@dataclass(frozen=True)
class Kind:
    """What the gateway asks of one output kind."""

    name: str
    answer_bytes: Callable[[Any, Sequence[int], Options], int]
    agreement: Callable[
        [Mapping[str, np.ndarray], Mapping[str, np.ndarray]], dict[str, list[float]]
    ]


KINDS: dict[str, Kind] = {
    module.NAME: Kind(module.NAME, module.answer_bytes, module.agreement)
    for module in (dense, sparse, multivector)
}

__all__ = ["KINDS", "REPLY_NUMBER_BYTES", "Kind", "Options", "agreement", "reply_numbers",
           "reply_outputs"]  # fmt: skip


def reply_outputs(
    outputs: ModelOutputs,
    wanted: Sequence[str],
    transport: str,
    subsets: Mapping[str, Sequence[str]] | None,
) -> tuple[str, ...]:
    """Return the outputs a reply of the model server holds when a call asks for ``wanted``
    (() : every one): gRPC filters them (``output_filter``); REST asks the narrowest
    output-subset signature that has them (model.json's ``kind_signatures``: ``subsets``), or
    gets every output where the export wrote none; in process every output comes back."""
    every = tuple(name for names in kind_outputs(outputs).values() for name in names)
    if not wanted or transport == "local":
        return every
    if transport != "rest":
        return tuple(wanted)
    need = set(wanted)
    fits = [tuple(names) for names in (subsets or {}).values() if need <= set(names)]
    return min(fits, key=len) if fits else every


def reply_numbers(outputs: ModelOutputs, names: Sequence[str], seq_len: int) -> int:
    """Return the numbers one row of a reply holds of the outputs ``names``, its inputs padded
    to ``seq_len`` tokens: a dense vector's dims, a token weight per position, the graph's top-k
    ids and values, a token vector per position."""
    dense_dim = outputs.dense.dim if outputs.dense is not None else 0
    multi_dim = outputs.multivector.dim if outputs.multivector is not None else 0
    top_k = outputs.sparse.top_k if outputs.sparse is not None else 0
    per_row = {
        DENSE_OUTPUT: dense_dim or UNKNOWN_DIM,
        TOKEN_WEIGHTS_OUTPUT: seq_len,
        SPARSE_INDICES_OUTPUT: top_k,
        SPARSE_VALUES_OUTPUT: top_k,
        TOKEN_VECTORS_OUTPUT: seq_len * (multi_dim or UNKNOWN_DIM),
    }
    return sum(per_row.get(name, 1) for name in names)


def agreement(
    served: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return every kind's agreement measure of two versions' embed outputs (those present)."""
    out: dict[str, list[float]] = {}
    for kind in KINDS.values():
        out.update(kind.agreement(served, shadow))
    return out
