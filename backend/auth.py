"""API keys: off unless GATEWAY_API_KEYS_FILE names a file of named, hashed keys.

The file (JSON, written by ``python -m ops.apikeys``) holds no key, only each key's SHA-256:
``{"keys": [{"name": "team-a", "sha256": "<hex>", "models": ["minilm"], "versions": ["public",
"canary"], "rate": 10, "burst": 20}]}`` (``models``, ``versions`` and ``rate``/``burst``
optional: every model, the public scope, no limit). Keys are random 256-bit tokens, so a fast
hash is enough (nothing to brute-force); a presented key is hashed and compared with every entry
in constant time (``hmac.compare_digest``). Clients send ``Authorization: Bearer <key>`` (what
the OpenAI and Cohere SDKs send) or ``X-API-Key``. The file is re-read every
GATEWAY_LABELS_CACHE_S (its content, like models.config); a file that breaks a rule (not JSON, a
``sha256`` that is not 64 hex digits, a ``burst`` under 1, a name twice) keeps the last good
keys and raises ``gateway_api_keys_stale``; at start-up such a file, or one with no key, stops
the gateway (``check_keys_file``).

What a key may name (``versions``): a request naming neither a version nor a label (the model's
default, which the routing file may split) is always allowed; beyond that, the list's entries:
``"public"`` (the model's public labels, GATEWAY_PUBLIC_LABELS, and the version numbers that are
vetted: not newer than the newest version a public label names), a label name, a version
number, or ``"*"`` (everything, unvetted versions included: ops and canary testers). Absent:
``["public"]``. A version push loaded before its rollout's gates pass is newer than ``stable``,
so it answers only to keys that list it, its label or ``"*"``.

Rate limits: ``backend.ratelimit`` (one bucket per key, per pod or shared through Redis).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import string
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import orjson

from backend import metrics
from backend.errors import Forbidden
from backend.reloading import ReloadingFile

log = logging.getLogger(__name__)

HEADER_PREFIX = "bearer "
PUBLIC, EVERYTHING = "public", "*"
_HEX = frozenset(string.hexdigits)

# The API key of the request this thread serves (None: keys are off); the app sets it per request.
current_key: ContextVar[ApiKey | None] = ContextVar("current_key", default=None)


def key_hash(key: str) -> str:
    """Return the hex SHA-256 of a key, as the keys file stores it."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """One named key: its hash, the models it may use (None: all), the versions and labels it
    may name (see the module docstring) and its rate limit."""

    name: str
    sha256: str
    models: frozenset[str] | None = None
    rate: float | None = None  # requests per second
    burst: float | None = None
    versions: frozenset[str | int] = frozenset({PUBLIC})

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    def may_name(
        self,
        version: int | None,
        label: str | None,
        labels: Mapping[str, int],
        public: Sequence[str],
    ) -> bool:
        """Return whether this key may name ``version`` or ``label`` of a model whose labels are
        ``labels`` (``public``: the labels every key's public scope names)."""
        scope = self.versions
        if (version is None and label is None) or EVERYTHING in scope:
            return True
        if label is not None:
            return label in scope or (PUBLIC in scope and label in public)
        assert version is not None
        return version in scope or (PUBLIC in scope and vetted(version, labels, public))


def vetted(version: int, labels: Mapping[str, int], public: Sequence[str]) -> bool:
    """Return whether ``version`` is vetted: not newer than the newest version a public label
    names (a model without public labels has nothing to vet against: every version is)."""
    named = [v for name, v in labels.items() if name in public]
    return not named or version <= max(named)


def check_reach(
    key: ApiKey | None,
    model: str,
    version: int | None,
    label: str | None,
    labels: Mapping[str, int],
    public: Sequence[str],
) -> None:
    """403 when ``key`` (None: keys are off, everything allowed) may not name what it asked."""
    if key is None or key.may_name(version, label, labels, public):
        return
    what = f"label {label!r}" if label is not None else f"version {version}"
    raise Forbidden(
        f"API key {key.name!r} may not name {what} of model {model!r} (its scope: "
        f"{', '.join(sorted(map(str, key.versions))) or 'the default version only'}; the "
        f"public labels: {', '.join(public) or 'none'})"
    )


def _versions(entry: dict, where: str) -> frozenset[str | int]:
    raw = entry.get("versions", [PUBLIC])
    if raw == "all":
        raw = [EVERYTHING]
    if not isinstance(raw, list) or not all(
        (isinstance(v, str) and v) or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
        for v in raw
    ):
        raise ValueError(
            f"{where}: 'versions' must be a list of labels, version numbers, public or *"
        )
    return frozenset(raw)


def parse_keys(data: bytes) -> list[ApiKey]:
    """Return the keys of a keys file; ValueError naming the first problem."""
    doc = orjson.loads(data)
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise ValueError('the keys file must be {"keys": [...]}')
    keys: list[ApiKey] = []
    names: set[str] = set()
    for index, entry in enumerate(doc["keys"]):
        where = f"keys[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")
        name, digest = entry.get("name"), entry.get("sha256")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' must be a non-empty string")
        where = f"{where} ({name})"
        if name in names:
            raise ValueError(f"{where}: the name is used twice (rate limits and metrics go by it)")
        names.add(name)
        if not isinstance(digest, str) or len(digest) != 64 or not _HEX.issuperset(digest):
            raise ValueError(f"{where}: 'sha256' must be 64 hex characters")
        models = entry.get("models")
        if models is not None and not (
            isinstance(models, list) and all(isinstance(m, str) for m in models)
        ):
            raise ValueError(f"{where}: 'models' must be a list of model names")
        rate, burst = entry.get("rate"), entry.get("burst")
        for field, value in (("rate", rate), ("burst", burst)):
            if value is not None and (
                not isinstance(value, int | float) or isinstance(value, bool) or not value > 0
            ):
                raise ValueError(f"{where}: '{field}' must be a positive number")
        if burst is not None and burst < 1:
            raise ValueError(f"{where}: 'burst' must be at least 1 (a request takes one token)")
        if burst is not None and rate is None:
            raise ValueError(f"{where}: 'burst' needs a 'rate'")
        keys.append(
            ApiKey(
                name=name,
                sha256=digest.lower(),
                models=None if models is None else frozenset(models),
                rate=None if rate is None else float(rate),
                burst=float(burst) if burst is not None else (
                    None if rate is None else max(1.0, float(rate))
                ),
                versions=_versions(entry, where),
            )
        )  # fmt: skip
    return keys


def check_keys_file(path: str) -> list[ApiKey]:
    """Return the keys ``path`` holds; ValueError when it can't be read, breaks a rule or holds
    none (keys configured but none present: the gateway would refuse every request)."""
    try:
        keys = parse_keys(Path(path).read_bytes())
    except OSError as exc:
        raise ValueError(f"GATEWAY_API_KEYS_FILE {path}: cannot read it ({exc})") from None
    except ValueError as exc:
        raise ValueError(f"GATEWAY_API_KEYS_FILE {path}: {exc}") from None
    if not keys:
        raise ValueError(
            f"GATEWAY_API_KEYS_FILE {path} holds no key: add one (python -m ops.apikeys --file "
            f"{path} add NAME), or unset the variable to run without keys"
        )
    return keys


class KeyTable:
    """The keys of GATEWAY_API_KEYS_FILE, re-read every ``recheck_s`` by the labels' rule
    (``backend.reloading.ReloadingFile``: content hashed, last good kept, a metric raised)."""

    def __init__(
        self, path: str, recheck_s: float = 1.0, initial: list[ApiKey] | None = None
    ) -> None:
        # ``initial``: the keys the gateway started with, the last good ones of a worker forked
        # while the file is broken
        self._file: ReloadingFile[list[ApiKey]] = ReloadingFile(
            path, parse_keys, initial or [], recheck_s=recheck_s, what="API keys file",
            errors=metrics.API_KEYS_ERRORS, stale=metrics.API_KEYS_STALE, logger=log,
        )  # fmt: skip

    def keys(self) -> list[ApiKey]:
        """Return the current keys."""
        return self._file.get()

    def find(self, presented: str) -> ApiKey | None:
        """Return the key whose hash matches ``presented`` (every entry compared), else None."""
        digest = key_hash(presented)
        found = None
        for key in self._file.get():
            if hmac.compare_digest(key.sha256, digest):
                found = key
        return found
