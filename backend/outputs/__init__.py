"""An embedder's output kinds, as data: one module per kind (model.json's ``outputs``;
modelformat/outputs.py is the contract), registered in ``KINDS`` as export/architectures/ is a
table. Each module owns its post-processing, its answer's shape, its answer-bytes estimate for
the answer budget (GATEWAY_MAX_ANSWER_BYTES) and its shadow agreement measure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from backend.outputs import dense, multivector, sparse
from backend.outputs.base import Options


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

__all__ = ["KINDS", "Kind", "Options", "agreement"]


def agreement(
    served: Mapping[str, np.ndarray], shadow: Mapping[str, np.ndarray]
) -> dict[str, list[float]]:
    """Return every kind's agreement measure of two versions' embed outputs (those present)."""
    out: dict[str, list[float]] = {}
    for kind in KINDS.values():
        out.update(kind.agreement(served, shadow))
    return out
