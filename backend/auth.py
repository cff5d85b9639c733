"""API keys: off unless GATEWAY_API_KEYS_FILE names a file of named, hashed keys.

The file (JSON, written by ``python -m ops.apikeys``) holds no key, only each key's SHA-256:
``{"keys": [{"name": "team-a", "sha256": "<hex>", "models": ["minilm"], "rate": 10, "burst": 20}]}``
(``models`` and ``rate``/``burst`` optional: every model, no limit). Keys are random 256-bit
tokens, so a fast hash is enough (nothing to brute-force); a presented key is hashed and compared
with every entry in constant time (``hmac.compare_digest``). Clients send ``Authorization:
Bearer <key>`` (what the OpenAI and Cohere SDKs send) or ``X-API-Key``. The file is re-read
every GATEWAY_LABELS_CACHE_S (its content, like models.config); a broken file keeps the last good
keys and raises ``gateway_api_keys_stale``.

Rate limits are one token bucket per key shared by every gunicorn worker: its state lives in a
small file in the metrics multiprocess directory, updated under ``flock`` (one exact limit,
whichever worker a connection lands on; a keep-alive client stays on one worker, so dividing the
limit by the workers would give it half). Without that directory (one process) it lives in memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from backend import metrics
from backend.reloading import ReloadingFile

log = logging.getLogger(__name__)

HEADER_PREFIX = "bearer "
_STATE = struct.Struct("<dd")  # tokens, monotonic-free wall time of the last update


def key_hash(key: str) -> str:
    """Return the hex SHA-256 of a key, as the keys file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """One named key: its hash, the models it may use (None: all) and its rate limit."""

    name: str
    sha256: str
    models: frozenset[str] | None = None
    rate: float | None = None  # requests per second
    burst: float | None = None

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


def parse_keys(data: bytes) -> list[ApiKey]:
    """Return the keys of a keys file; ValueError naming the first problem."""
    doc = orjson.loads(data)
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError('the keys file must be {"keys": [...]}')
    keys = []
    for index, entry in enumerate(doc["keys"]):
        where = f"keys[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")
        name, digest = entry.get("name"), entry.get("sha256")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' must be a non-empty string")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ValueError(f"{where} ({name}): 'sha256' must be 64 hex characters")
        models = entry.get("models")
        if models is not None and not (
            isinstance(models, list) and all(isinstance(m, str) for m in models)
        ):
            raise ValueError(f"{where} ({name}): 'models' must be a list of model names")
        rate, burst = entry.get("rate"), entry.get("burst")
        for field, value in (("rate", rate), ("burst", burst)):
            if value is not None and (not isinstance(value, int | float) or value <= 0):
                raise ValueError(f"{where} ({name}): '{field}' must be a positive number")
        keys.append(
            ApiKey(
                name=name,
                sha256=digest.lower(),
                models=None if models is None else frozenset(models),
                rate=None if rate is None else float(rate),
                burst=float(burst)
                if burst is not None
                else (None if rate is None else float(rate)),
            )
        )
    return keys


class KeyTable:
    """The keys of GATEWAY_API_KEYS_FILE, re-read every ``recheck_s`` by the labels' rule
    (``backend.reloading.ReloadingFile``: content hashed, last good kept, a metric raised)."""

    def __init__(self, path: str, recheck_s: float = 1.0) -> None:
        self._file: ReloadingFile[list[ApiKey]] = ReloadingFile(
            path, parse_keys, [], recheck_s=recheck_s, what="API keys file",
            errors=metrics.API_KEYS_ERRORS, stale=metrics.API_KEYS_STALE, logger=log,
        )  # fmt: skip

    def find(self, presented: str) -> ApiKey | None:
        """Return the key whose hash matches ``presented`` (every entry compared), else None."""
        digest = key_hash(presented)
        found = None
        for key in self._file.get():
            if hmac.compare_digest(key.sha256, digest):
                found = key
        return found


class RateLimiter:
    """One token bucket per key name, shared across processes through ``directory``."""

    def __init__(self, directory: str | None) -> None:
        self.directory = Path(directory) if directory else None
        self._memory: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: ApiKey) -> float:
        """Take one token; return 0 if allowed, else the seconds until one is available."""
        if key.rate is None:
            return 0.0
        burst = key.burst or key.rate
        with self._lock:
            if self.directory is None:
                tokens, wait = self._refill(self._memory.get(key.name), key.rate, burst)
                self._memory[key.name] = (tokens, time.time())
                return wait
            path = (
                self.directory / f"ratelimit-{hashlib.sha256(key.name.encode()).hexdigest()[:16]}"
            )
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                raw = os.pread(fd, _STATE.size, 0)
                state = _STATE.unpack(raw) if len(raw) == _STATE.size else None
                tokens, wait = self._refill(state, key.rate, burst)
                os.pwrite(fd, _STATE.pack(tokens, time.time()), 0)
                return wait
            finally:
                os.close(fd)  # releases the lock

    @staticmethod
    def _refill(state: Any, rate: float, burst: float) -> tuple[float, float]:
        """Return (tokens left, seconds to wait) after refilling ``state`` and taking one."""
        now = time.time()
        tokens, last = state if state is not None else (burst, now)
        tokens = min(burst, tokens + max(0.0, now - last) * rate)
        if tokens >= 1.0:
            return tokens - 1.0, 0.0
        return tokens, (1.0 - tokens) / rate
