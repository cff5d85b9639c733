"""What one request may make the gateway do once its inputs are tokenized: a budget of tokens and
upstream rows (text-embeddings-inference's ``max_batch_tokens`` / ``max_client_batch_size`` as the
analogy) and its deadline, checked by the tokenizer as it goes and by post-processing loops.

The gateway opens one budget per request (``scope``: the inference routes around every attempt,
so a retry on another version spends the same budget; ``:tokenize`` and ``:detokenize`` around
their work); the tokenizer checks the rows it is given before it tokenizes them (``expect``),
spends rows and tokens right after each tokenization, before windows, pairs or per-token lists
are built (``spend``), and its loops call ``check_deadline``. Outside a scope (training, tests of
the tokenizer alone) there is no budget and all three are no-ops; post-processing checks the
request's deadline itself (``past_deadline``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from backend.errors import PayloadTooLarge, UpstreamTimeout
from backend.settings import Settings


@dataclass
class Budget:
    """The tokens and upstream rows one request may still cause, and its deadline."""

    max_tokens: int
    max_rows: int
    deadline: float  # time.monotonic()
    tokens: int = 0
    rows: int = 0

    def spend(self, rows: int, tokens: int) -> None:
        """Count ``rows`` more upstream rows of ``tokens`` tokens; 413 past either limit (the
        numbers and the setting named), 504 past the deadline."""
        self.rows += rows
        self.tokens += tokens
        if self.tokens > self.max_tokens:
            raise PayloadTooLarge(
                f"the request needs {self.tokens} tokens (so far), over the limit of "
                f"{self.max_tokens} per request (GATEWAY_MAX_REQUEST_TOKENS)"
            )
        if self.rows > self.max_rows:
            raise PayloadTooLarge(
                f"the request needs {self.rows} upstream rows (texts, pairs or windows; so far), "
                f"over the limit of {self.max_rows} per request (GATEWAY_MAX_REQUEST_ROWS)"
            )
        self.check_deadline()

    def expect(self, rows: int) -> None:
        """413 when ``rows`` more upstream rows would be over the limit (known before their
        tokens are: nothing is spent, ``spend`` counts them with their tokens); 504 past the
        deadline."""
        if self.rows + rows > self.max_rows:
            raise PayloadTooLarge(
                f"the request needs {self.rows + rows} upstream rows (texts, pairs or windows; "
                f"so far), over the limit of {self.max_rows} per request "
                "(GATEWAY_MAX_REQUEST_ROWS)"
            )
        self.check_deadline()

    def check_deadline(self) -> None:
        """504 once the request's deadline has passed."""
        past_deadline(self.deadline)


def past_deadline(deadline: float) -> None:
    """504 once ``deadline`` (time.monotonic()) has passed."""
    if time.monotonic() > deadline:
        raise UpstreamTimeout("the request ran past GATEWAY_TIMEOUT_S")


_active: ContextVar[Budget | None] = ContextVar("gateway_budget", default=None)


@contextmanager
def scope(settings: Settings, deadline: float) -> Iterator[Budget]:
    """Run the enclosed work within the running request's budget, or a fresh one of
    ``settings``' limits and ``deadline`` when none runs (a retry spends the request's)."""
    running = _active.get()
    if running is not None:
        yield running
        return
    budget = Budget(settings.max_request_tokens, settings.max_request_rows, deadline)
    token = _active.set(budget)
    try:
        yield budget
    finally:
        _active.reset(token)


def spend(rows: int, tokens: int) -> None:
    """Spend from the running request's budget (no-op outside a request)."""
    budget = _active.get()
    if budget is not None:
        budget.spend(rows, tokens)


def expect(rows: int) -> None:
    """Check ``rows`` more upstream rows against the running request's budget before they are
    tokenized (no-op outside a request)."""
    budget = _active.get()
    if budget is not None:
        budget.expect(rows)


def check_deadline() -> None:
    """504 when the running request is past its deadline (no-op outside a request)."""
    budget = _active.get()
    if budget is not None:
        budget.check_deadline()
