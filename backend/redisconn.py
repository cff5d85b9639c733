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

import time
from typing import Any


class RedisConn:
    """A Redis client with a bounded wait per call and a pause after a failure."""

    def __init__(self, url: str, timeout_s: float, retry_s: float) -> None:
        import redis  # only when configured: the defaults need no client
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self.client: Any = redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            health_check_interval=30, retry=Retry(NoBackoff(), 0),
        )  # fmt: skip
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
