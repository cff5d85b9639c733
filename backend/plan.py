"""One inference request as a record its stages fill in, in order (backend/service.py runs them).

A route's view parses and validates the body (stage ``validate``) and hands the gateway what it
asks; the gateway makes a ``Plan`` of it and runs the stages, each filling in its own fields and
reading only what the ones before it filled in:

============  ==============================================================  ================
stage         what it does                                                    fills in
============  ==============================================================  ================
resolve       the key's reach, routing weights, version and its assets; the   attempt, route,
              output kinds answered (embedders); again on the next version    served, assets,
              when the one resolved is not served (``Attempt``)               kinds
cache         each text's tokens and model rows from the result cache         positions
              (backend/cache.py); only the misses cross the next four
tokenize      the inputs to token ids, spending the request's budget; the     encoded, owners,
              answer's size against GATEWAY_MAX_ANSWER_BYTES (embedders)      windows,
                                                                              characters,
                                                                              answer_bytes
plan          the chunks (bucketed, split by batch size) and their tensors    speeds, calls
call          one model-server call per chunk, grouped with concurrent ones   results
reassemble    the chunks' outputs back in the caller's order                  outputs
============  ==============================================================  ================

then the route's own ``postprocess`` (labels, pooling, scores, entities) and, back in the view,
``answer`` (the answer in the route's API shape, serialized). backend/timing.py times each of
the nine; their names are ``timing.STAGES``. ``:tokenize`` and ``:detokenize`` cross resolve
only (the version default traffic would get, by the same weights and fallbacks).

Everything one request decides lives here, not in a route's closures: the route's encoder
(``Encoder``) reads the plan and writes what it found back into it (windows and their owners,
the characters it tokenized), and the deadline is set once, when the request starts.
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
from backend.tokenization import Encoded, TokenWindow
from modelformat.routing import ModelRoute

if TYPE_CHECKING:
    from backend.versions import ModelAssets

# The route's tokenizer call: reads ``plan.assets`` and ``plan.texts`` (under the result cache,
# only the misses), may fill in ``owners``, ``windows`` and ``characters``
Encoder = Callable[["Plan"], list[Encoded]]
Choice = tuple[int | None, str | None]  # a version, or a label, or neither (the newest)


@dataclass(slots=True)
class Attempt:
    """Which version resolve tries, and what the tries before it found: the whole retry state
    (``Gateway._next_attempt`` makes the next one from a NotFound)."""

    choice: Choice | None = None  # None: the first, resolve's own (the key's reach, weights)
    reached: bool = False  # the API key's reach was checked (a NotFound before it: no retry)
    weighted: bool = False  # ``choice`` came from the routing file's weights
    refreshed: bool = False  # labels and states were re-read once already
    number: int = 0  # 0 the first time; each retry one more (at most two)


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
    # one per input as the caller counts them (errors name ``what[i]``); the text itself where
    # an input is one (the default encoder and the result cache read it), else its first text
    texts: Sequence[str]
    version: int | None = None
    label: str | None = None
    truncate: bool = True
    tasks: tuple[str, ...] | None = ("embed",)  # None: any (``:tokenize``)
    what: str = "texts"
    speed: float | Sequence[float] | None = None
    # the inputs to token ids for a version's assets (None: its tokenizer on ``texts``)
    encode: Encoder | None = None
    check: Callable[[ModelAssets], None] | None = None  # the route's own 422s for a version
    per_token: bool = False  # outputs are [batch, seq, ...] (token classification)
    # :embed's and rerank's output kinds and options (backend/outputs/); None: dense only
    options: Options | None = None
    # what decides each text's tokens and model rows besides the model, version and text (the
    # route and its input options): the result cache's key (backend/cache.py); None: not cached
    reuse: tuple[object, ...] | None = None

    # set once when the request starts (its own timeout, or a shadow's): time.monotonic()
    # when it runs out of time; every stage, retry and chunk reads this one
    deadline: float = field(init=False, default=float("inf"))
    # resolve
    attempt: Attempt = field(init=False, default_factory=Attempt)
    route: ModelRoute | None = field(init=False, default=None)  # default traffic's entry
    served: int = field(init=False)
    assets: ModelAssets = field(init=False)
    kinds: tuple[str, ...] = field(init=False, default=("dense",))  # output kinds answered
    from_idf: bool = field(init=False, default=False)  # inference-free sparse: no model call
    # cache: while only the misses cross tokenize to reassemble, each one's caller index
    positions: list[int] | None = field(init=False, default=None)
    # tokenize
    encoded: list[Encoded] = field(init=False)
    owners: list[int] | None = field(init=False, default=None)  # windows: each row's input
    windows: list[list[TokenWindow]] | None = field(init=False, default=None)  # :tag's, per text
    # the characters the rows were tokenized from (x-compute-characters): a pair's both texts,
    # a cross-encoder's query once per document, 0 for token ids; None: sum of ``texts``
    characters: int | None = field(init=False, default=None)
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
