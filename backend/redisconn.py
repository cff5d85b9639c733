"""One Redis connection that the request path may use and never wait on for long: the shared
rate-limit store (backend/ratelimit.py) and the result cache's shared tier (backend/cache.py).

``RedisConn`` makes the client (each call at most ``timeout_s``, connecting included, with no
retries: redis-py 8 retries three times with backoff by default) and keeps the rule both users
follow when it fails: after an error the caller skips Redis for ``retry_s`` (``down``), so a
Redis that is down or hung costs a request nothing, and ``failed`` / ``answered`` say when a
run of failures starts and ends (the moments worth a log line). The caller counts and falls
back as its own job requires.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("redis://", "rediss://", "unix://")


def redacted(url: str) -> str:
    """Return ``url`` with its password (everything after the user's name and before the last
    ``@``, or the whole of what precedes that ``@`` when it names no user; a ``password=``
    query parameter) as ``***``: what any message or log line about a Redis URL shows, however
    mistyped the URL is."""
    url = re.sub(r"(?i)(password=)[^&#]*", r"\1***", url)
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, sep, userinfo = head.rpartition("://")
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return f"{scheme}{sep}{shown}@{tail}"


def url_problem(url: str) -> str | None:
    """Return what is wrong with a Redis URL (its password never shown), None when redis-py
    reads it as written: a redis://, rediss:// or unix:// URL whose user and password end at
    the last ``@`` (a ``/``, ``?`` or ``#`` in them, not percent-encoded, moves the host into
    the password: connection errors would name part of it) and whose port is a number."""
    shown = redacted(url)
    if not url.startswith(SCHEMES):
        return f"must be a redis://, rediss:// or unix:// URL, not {shown!r}"
    parts = urlsplit(url)
    userinfo = url.split("://", 1)[1].rpartition("@")[0]
    if any(c in userinfo for c in "/?#") or (userinfo and parts.netloc.rpartition("@")[0]
                                              != userinfo):  # fmt: skip
        return (f"{shown!r}: percent-encode the user's name and password (a '/', '?', '#' or "
                "'@' in them ends the host part early)")  # fmt: skip
    try:
        parts.port  # noqa: B018 (urllib checks the port when it is read)
    except ValueError:
        return f"{shown!r}: the port is not a number"
    return None


class RedisConn:
    """A Redis client with a bounded wait per call and a pause after a failure."""

    def __init__(self, url: str, timeout_s: float, retry_s: float) -> None:
        import redis  # only when configured: the defaults need no client
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.no_script: type[BaseException] = redis.exceptions.NoScriptError
        try:
            self.client: Any = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                health_check_interval=30, retry=Retry(NoBackoff(), 0),
            )  # fmt: skip
        except ValueError:  # its message may quote the URL's parts: never its password
            raise ValueError(f"the Redis URL {redacted(url)!r} can't be read") from None
        self.retry_s = retry_s
        self._down_until = 0.0
        self._failing = False

    @property
    def down(self) -> bool:
        """Whether callers skip Redis now (for ``retry_s`` after a failure)."""
        return time.monotonic() < self._down_until

    def failed(self) -> bool:
        """Skip Redis for ``retry_s`` from now; return whether this starts a run of failures."""
        self._down_until = time.monotonic() + self.retry_s
        first, self._failing = not self._failing, True
        return first

    def answered(self) -> bool:
        """Note a call Redis answered; return whether it ends a run of failures."""
        ended, self._failing = self._failing, False
        return ended
