"""Rate limits of API keys: one token bucket per key, behind one interface with two stores.

- ``PodStore`` (the default; nothing to run): the bucket lives in a small file in the metrics
  multiprocess directory, updated under ``flock``, so every gunicorn worker of a pod shares one
  exact limit (a keep-alive client stays on one worker, so dividing the limit by the workers
  would give it half). Without that directory (one process) it lives in memory. Each pod has its
  own buckets: with N pods a key gets up to N times its rate.
- ``RedisStore`` (GATEWAY_RATE_LIMIT_REDIS_URL): the bucket lives in Redis, refilled and taken
  in one Lua script on Redis's clock, so one limit holds across every pod (and every HPA scale).
  A Redis that does not answer within ``timeout_s`` counts in
  ``gateway_rate_limit_store_errors_total`` and the pod falls back to its own buckets for
  ``retry_s`` (each pod then enforces the limit alone) rather than failing or waiting on it.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from backend import metrics
from backend.auth import ApiKey
from backend.redisconn import RedisConn

log = logging.getLogger(__name__)

_STATE = struct.Struct("<dd")  # tokens, wall time of the last update


class RateStore(Protocol):
    """Where the buckets live."""

    def take(self, name: str, rate: float, burst: float) -> float:
        """Take one token from ``name``'s bucket; return 0 if allowed, else the seconds until
        one is available."""
        ...


def _bucket_id(name: str) -> str:
    """Return a fixed-length, file- and key-safe id of a key's name."""
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def refill(state: Any, rate: float, burst: float, now: float) -> tuple[float, float]:
    """Return (tokens left, seconds to wait) after refilling ``state`` and taking one."""
    tokens, last = state if state is not None else (burst, now)
    tokens = min(burst, tokens + max(0.0, now - last) * rate)
    if tokens >= 1.0:
        return tokens - 1.0, 0.0
    return tokens, (1.0 - tokens) / rate


class PodStore:
    """Buckets shared by the workers of one pod through ``directory`` (in memory without one)."""

    def __init__(self, directory: str | None) -> None:
        self.directory = Path(directory) if directory else None
        self._memory: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, name: str, rate: float, burst: float) -> float:
        with self._lock:
            now = time.time()
            if self.directory is None:
                tokens, wait = refill(self._memory.get(name), rate, burst, now)
                self._memory[name] = (tokens, now)
                return wait
            path = self.directory / f"ratelimit-{_bucket_id(name)}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                raw = os.pread(fd, _STATE.size, 0)
                state = _STATE.unpack(raw) if len(raw) == _STATE.size else None
                tokens, wait = refill(state, rate, burst, now)
                os.pwrite(fd, _STATE.pack(tokens, now), 0)
                return wait
            finally:
                os.close(fd)  # releases the lock


# KEYS[1]: the bucket; ARGV: rate, burst. Redis's own clock (TIME), so pods' clocks don't matter;
# the bucket expires once it would be full again (an idle key costs nothing).
# Kubernetes' Redis runs this script and no other Lua: the rate limits' user may EVAL this text
# and EVALSHA its SHA-1 (first-argument rules, deploy/k8s/base/redis.yaml), never SCRIPT LOAD
# (which compiles any Lua it is given: Redis's Lua parser is where its worst bugs were), so no
# other Lua reaches Redis's parser: change the script and the ACL together.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then tokens = burst; ts = now end
-- clamped at both ends: a bucket holds 0 to burst tokens, whatever the hash says (a negative or
-- huge count written by anything else, a lowered burst, a clock that went back)
tokens = math.max(0, math.min(burst, tokens + math.max(0, now - ts) * rate))
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""
_TAKE_SHA = hashlib.sha1(_TAKE.encode()).hexdigest()
PREFIX = "bert-gateway:rate:"


class RedisStore:
    """Buckets in Redis, shared by every pod; the pod's own buckets while Redis fails."""

    def __init__(
        self, url: str, fallback: RateStore, timeout_s: float = 0.25, retry_s: float = 1.0
    ) -> None:
        self._redis = RedisConn(url, timeout_s, retry_s)
        self._fallback = fallback
        self.retry_s = retry_s

    def take(self, name: str, rate: float, burst: float) -> float:
        conn = self._redis
        if conn.down:
            return self._fallback.take(name, rate, burst)
        try:
            wait = float(_take(conn, PREFIX + _bucket_id(name), rate, burst))
        except conn.errors as exc:
            metrics.RATE_LIMIT_STORE_ERRORS.inc()
            if conn.failed():
                log.warning("rate limits: Redis fails (%s); this pod limits alone for now", exc)
            return self._fallback.take(name, rate, burst)
        if conn.answered():
            log.warning("rate limits: Redis answers again; limits are shared again")
        return wait


def _take(conn: RedisConn, bucket: str, rate: float, burst: float) -> Any:
    """Run the script on ``bucket`` by its SHA-1; the first time after Redis (re)starts, by
    EVAL of its text, which Redis then keeps under that SHA-1 (never SCRIPT LOAD)."""
    try:
        return conn.client.evalsha(_TAKE_SHA, 1, bucket, rate, burst)
    except conn.no_script:
        return conn.client.eval(_TAKE, 1, bucket, rate, burst)


class RateLimiter:
    """Takes a token for a key from the configured store."""

    def __init__(self, store: RateStore) -> None:
        self.store = store

    def take(self, key: ApiKey) -> float:
        """Take one token; return 0 if allowed (or the key has no limit), else seconds to wait."""
        if key.rate is None:
            return 0.0
        return self.store.take(key.name, key.rate, key.burst or max(1.0, key.rate))


def make_limiter(redis_url: str, directory: str | None) -> RateLimiter:
    """Return the limiter of this process: Redis when ``redis_url`` is set, else per pod."""
    pod = PodStore(directory)
    return RateLimiter(RedisStore(redis_url, pod) if redis_url else pod)
