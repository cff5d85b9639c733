"""One clock per request: its stages feed the metrics, the timing headers and the spans alike.

A request's ``Clock`` (a context variable, set when the request starts) collects how long each
stage of an inference took, the stages every inference request crosses in this order
(backend/plan.py says what each does): ``validate`` (the body parsed and checked), ``resolve``
(the key's reach, the version and its assets), ``cache`` (the result cache's lookups:
backend/cache.py; 0 when it is off), ``tokenize``, ``plan`` (chunks and their
tensors), ``call`` (the model server's calls), ``reassemble``, ``postprocess`` and ``answer``
(the answer in its API's shape, serialized). ``queue`` is the part of ``call`` spent waiting for
a call shared with concurrent requests (backend/grouping.py). The same measured seconds go to
``gateway_stage_duration_seconds``, to the span of the stage (when tracing is on,
backend/tracing.py) and to the answer's headers, so the three never disagree. What runs before
``validate`` (authentication, rate limits) and after ``answer`` counts in ``total`` only.

Headers on every inference answer (GATEWAY_TIMING_HEADERS, on by default), in the names of
Hugging Face's text-embeddings-inference (whole milliseconds, as TEI sends them):

- ``x-tokenization-time``, ``x-queue-time``, ``x-inference-time`` (call minus queue),
- ``x-compute-time`` (tokenize through post-process: the inference's own work),
- ``x-total-time`` (the request in the gateway, from its first hook to its headers),
- ``x-compute-tokens`` (tokens sent, specials included, before padding), ``x-compute-characters``;

and the nine stages in W3C ``Server-Timing`` with fractional milliseconds, in order, then
``total`` (``validate;dur=0.041, resolve;dur=0.012, cache;dur=0.000, tokenize;dur=0.231,
...``), which browsers'
developer tools show.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from backend import metrics, tracing

STAGES = (
    "validate", "resolve", "cache", "tokenize", "plan", "call", "reassemble", "postprocess",
    "answer",
)  # fmt: skip
# the inference's own work (x-compute-time): what the model server was asked for, and its answer
COMPUTE = ("cache", "tokenize", "plan", "call", "reassemble", "postprocess")


@dataclass
class Clock:
    """The stages of one request, in seconds, and what its inference computed."""

    started: float = field(default_factory=time.perf_counter)
    stages: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    characters: int = 0
    inferred: bool = False  # a cache or tokenize stage ran: the answer is an inference's
    no_store: bool = False  # the request said Cache-Control: no-store (backend/cache.py)
    cache: str = ""  # the result cache's answer: hit, miss, partial or bypass (x-cache)
    # its shared tier's for the texts the worker's missed: hit, miss, partial or degraded
    cache_shared: str = ""
    trace_id: str = ""  # for the error log's lines (backend/access_log.py)

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage`` (a request may run a stage more than once)."""
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds

    def headers(self, now: float | None = None) -> dict[str, str]:
        """Return the timing headers of the answer (TEI's names and Server-Timing)."""
        total = (time.perf_counter() if now is None else now) - self.started
        get = self.stages.get
        queue, tokenize = get("queue", 0.0), get("tokenize", 0.0)
        inference = max(0.0, get("call", 0.0) - queue)
        compute = sum(get(name, 0.0) for name in COMPUTE)
        timing = ", ".join(
            f"{name};dur={get(name, 0.0) * 1000:.3f}" for name in STAGES
        )  # fmt: skip
        return {
            "x-compute-time": str(int(compute * 1000)),
            "x-tokenization-time": str(int(tokenize * 1000)),
            "x-queue-time": str(int(queue * 1000)),
            "x-inference-time": str(int(inference * 1000)),
            "x-total-time": str(int(total * 1000)),
            "x-compute-tokens": str(self.tokens),
            "x-compute-characters": str(self.characters),
            "Server-Timing": f"{timing}, total;dur={total * 1000:.3f}",
        }


_current: ContextVar[Clock | None] = ContextVar("gateway_clock", default=None)


def start() -> Clock:
    """Start this request's clock (the app's first hook)."""
    clock = Clock()
    _current.set(clock)
    return clock


def current() -> Clock | None:
    """Return the running request's clock (None outside a request: the shadow thread)."""
    return _current.get()


def stop() -> None:
    """Forget the clock (a pool thread's next request starts its own)."""
    _current.set(None)


def count(tokens: int, characters: int) -> None:
    """Record what the request's inference computed (x-compute-tokens/-characters)."""
    clock = _current.get()
    if clock is not None:
        clock.tokens += tokens
        clock.characters += characters


class stage:  # lower case: called as the function it replaces was, ``with timing.stage(name):``
    """Time the enclosed block as stage ``name``: one measurement for the clock, the stage
    histogram and the stage's span (recording the error that leaves the block, if any).

    A class rather than a generator-based context manager: a request enters six of these, and
    contextlib's generator round trips cost several times the work they wrap.
    """

    __slots__ = ("name", "span", "started")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.span = tracing.start_stage(self.name) if tracing.active() else None
        self.started = time.perf_counter()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        elapsed = time.perf_counter() - self.started
        span, name = self.span, self.name
        if exc is not None and span is not None:
            tracing.fail(span[0], exc)
        clock = _current.get()
        if clock is not None:
            clock.add(name, elapsed)
            if name in ("tokenize", "cache"):
                clock.inferred = True
        metrics.observe_stage(name, elapsed)
        if span is not None:
            tracing.end_stage(span, elapsed)


def add_headers(headers: Any, clock: Clock) -> None:
    """Put the clock's timing headers on an inference answer.

    Appended (no view sets any of them, and this runs once per answer): werkzeug's ``set``
    would look through every header already there for each one it sets."""
    if clock.inferred:
        headers.extend(clock.headers())


def add_cache_header(headers: Any, clock: Clock) -> None:
    """Say on the answer what the result cache did (``x-cache``: hit, miss, partial, bypass)
    and, when its shared tier was asked, what that did (``x-cache-shared``)."""
    if clock.cache:
        headers["x-cache"] = clock.cache
        if clock.cache_shared:
            headers["x-cache-shared"] = clock.cache_shared
