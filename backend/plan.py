"""One inference request as a record its stages fill in, in order (backend/service.py runs them).

A route's view parses and validates the body (stage ``validate``) and hands the gateway what it
asks; the gateway makes a ``Plan`` of it and runs the stages, each filling in its own fields and
reading only what the ones before it filled in:

============  ==============================================================  ================
stage         what it does                                                    fills in
============  ==============================================================  ================
resolve       the key's reach, routing weights, version and its assets; the   route, served,
              output kinds answered (embedders)                               assets, kinds
cache         each text's tokens and model rows from the result cache         positions
              (backend/cache.py); only the misses cross the next four
tokenize      the inputs to token ids, spending the request's budget; the     encoded,
              answer's size against GATEWAY_MAX_ANSWER_BYTES (embedders)      answer_bytes
plan          the chunks (bucketed, split by batch size) and their tensors    speeds, calls
call          one model-server call per chunk, grouped with concurrent ones   results
reassemble    the chunks' outputs back in the caller's order                  outputs
============  ==============================================================  ================

then the route's own ``postprocess`` (labels, pooling, scores, entities) and, back in the view,
``answer`` (the answer in the route's API shape, serialized). backend/timing.py times each of
the nine; their names are ``timing.STAGES``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from backend.bucketing import Chunk, pad_batch
from backend.clients.base import Outputs
from backend.early_exit import SPEED_INPUT, chunk_speeds
from backend.outputs.base import Options
from backend.tokenization import Encoded
from modelformat.routing import ModelRoute

if TYPE_CHECKING:
    from backend.versions import ModelAssets

Encoder = Callable[["ModelAssets"], list[Encoded]]
Choice = tuple[int | None, str | None]  # a version, or a label, or neither (the newest)


@dataclass(frozen=True, slots=True)
class Call:
    """One model-server call the plan makes: a chunk's rows as padded tensors."""

    chunk: Chunk
    inputs: dict[str, np.ndarray]
    signature: str | None  # a bucket's fixed-length signature, else the default one


@dataclass(slots=True)
class Plan:
    """One inference request: what the route asks (the constructor's fields), then what each
    stage found (the rest, set as the stages run; read one before its stage and it raises)."""

    model: str
    texts: Sequence[str]  # the inputs as the caller counts them (errors name ``what[i]``)
    version: int | None = None
    label: str | None = None
    truncate: bool = True
    tasks: tuple[str, ...] = ("embed",)
    what: str = "texts"
    speed: float | Sequence[float] | None = None
    # the inputs to token ids for a version's assets (None: its tokenizer on ``texts``)
    encode: Encoder | None = None
    check: Callable[[ModelAssets], None] | None = None  # the route's own 422s for a version
    per_token: bool = False  # outputs are [batch, seq, ...] (token classification)
    deadline: float = float("inf")  # time.monotonic() when the request runs out of time
    # :embed's and rerank's output kinds and options (backend/outputs/); None: dense only
    options: Options | None = None
    # what decides each text's tokens and model rows besides the model, version and text (the
    # route and its input options): the result cache's key (backend/cache.py); None: not cached
    reuse: tuple[object, ...] | None = None

    # resolve
    reached: bool = field(init=False, default=False)  # the API key's reach was checked
    route: ModelRoute | None = field(init=False)  # default traffic's routing-file entry
    weighted: bool = field(init=False)  # ``choice`` came from the route's weights
    choice: Choice = field(init=False)  # the (version, label) this attempt resolved
    served: int = field(init=False)
    assets: ModelAssets = field(init=False)
    kinds: tuple[str, ...] = field(init=False, default=("dense",))  # output kinds answered
    from_idf: bool = field(init=False, default=False)  # inference-free sparse: no model call
    # cache: while only the misses cross tokenize to reassemble, each one's caller index
    positions: list[int] | None = field(init=False, default=None)
    # tokenize
    encoded: list[Encoded] = field(init=False)
    owners: list[int] | None = field(init=False, default=None)  # windows: each row's input
    answer_bytes: int = field(init=False, default=0)  # the answer's estimated size
    # plan
    speeds: np.ndarray | None = field(init=False)  # early-exit models: one speed per input
    calls: list[Call] = field(init=False)
    # call
    results: list[Outputs] = field(init=False)
    # reassemble
    outputs: Outputs = field(init=False)

    @property
    def truncated(self) -> list[bool]:
        """Whether each input was cut to fit max_seq_len (caller order)."""
        return [e.truncated for e in self.encoded]

    @property
    def token_counts(self) -> list[int]:
        """Tokens each input went in with ([CLS] and [SEP] included), caller order."""
        return [e.ids.shape[0] for e in self.encoded]


def chunk_inputs(
    chunk: Chunk, encoded: Sequence[Encoded], pad_id: int, speeds: np.ndarray | None
) -> dict[str, np.ndarray]:
    """Return the tensors of ``chunk``'s rows padded to its length (with each row's speed for
    an early-exit model, in the chunk's row order)."""
    rows = [encoded[i] for i in chunk.indices]
    types = [e.type_ids for e in rows] if any(e.type_ids is not None for e in rows) else None
    masks = [e.attention for e in rows] if any(e.attention is not None for e in rows) else None
    inputs = pad_batch([e.ids for e in rows], chunk.seq_len, pad_id, types, masks)
    if speeds is not None:
        inputs[SPEED_INPUT] = chunk_speeds(speeds, chunk.indices)
    return inputs
