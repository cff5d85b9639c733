"""The gateway's settings: one frozen dataclass built from GATEWAY_* environment variables.

This is the only module that reads ``os.environ`` for the gateway's own configuration.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from backend.redisconn import url_problem

UPSTREAMS = ("grpc", "rest", "local")
LOG_FORMATS = ("json", "text")


class SettingsError(ValueError):
    """A GATEWAY_* variable (or an override) has a value the gateway cannot use."""


@dataclass(frozen=True)
class Settings:
    """Everything the gateway is configured with; units are in the names."""

    upstream: str = "grpc"
    # host:port, or a gRPC target naming several replicas (dns:///name:8500, ipv4:a:p,b:p)
    tfs_grpc_target: str = "127.0.0.1:8500"
    tfs_rest_url: str = "http://127.0.0.1:8501"  # or several base URLs, comma-separated
    model_base_path: str = "models"
    model_config_file: str = ""
    default_model: str = ""
    request_timeout_s: float = 10.0
    status_cache_s: float = 1.0
    # one deadline for asking every replica its version states (a hung replica adds nothing)
    status_deadline_s: float = 1.0
    labels_cache_s: float = 1.0
    max_batch_size: int = 32
    max_concurrent_chunks: int = 4
    max_body_bytes: int = 1_048_576
    max_texts_per_request: int = 256
    max_text_chars: int = 20_000
    # token ids in one list of ids (:detokenize's ids, /v1/embeddings' token-id input): a text
    # of GATEWAY_MAX_TEXT_CHARS characters never has more tokens than characters
    max_token_ids: int = 20_000
    # what one request may cause once tokenized (chunk and tag windows, pairs, prompts included):
    # tokens of every row it sends upstream, specials and windows' overlaps counted, and the
    # rows (texts, pairs, windows); TEI's max_batch_tokens / max_client_batch_size. A 413 past
    # either, before any row is built
    max_request_tokens: int = 262_144
    max_request_rows: int = 1024
    # tensor elements (numbers, strings) one /tfs body may hold, counted before the call: a
    # :predict body can ask the model server for a tensor far over what its bytes suggest
    tfs_max_elements: int = 1_000_000
    # strings, lists and objects one /tfs body may hold, counted in its bytes before it is
    # parsed: each costs the parser tens of bytes and the checks a step (a 1 MiB body of `[],`
    # is 350,000 lists, ~30 MiB and ~0.4 s); numbers, the tensors' usual leaves, are not counted
    tfs_max_values: int = 4_096
    # bytes of one /tfs body (within GATEWAY_MAX_BODY_BYTES): TF Serving's JSON is parsed whole
    # (its parse errors anywhere come first), each number a Python object, and checked in C:
    # on a loaded 2-core AVX2 machine 1 MiB of numbers (524,000) cost a worker 50-80 ms of CPU,
    # 512 KiB 40-60 ms, 256 KiB at most 30 ms (tests/backend/test_request_budget.py)
    tfs_max_body_bytes: int = 262_144
    # bytes of the answer one embedding request (:embed, /v1/embeddings, /v2/embed) may build
    # (multi-vectors are rows x dims numbers, sparse answers indices and weights), and of the
    # model server's reply to it (the outputs the route reads, padded rows): estimated from the
    # tokenized rows before the model runs; a 413 past it (backend/outputs/). Also the most bytes
    # of a model server reply the gateway reads in: the gRPC receive limit follows it, a /tfs
    # REST reply is read up to it
    max_answer_bytes: int = 33_554_432
    bucketing: bool = True
    grpc_retries: int = 2
    retry_after_s: int = 1
    debug_endpoints: bool = False
    # API keys (backend/auth.py): off when empty; /metrics needs a key only when asked to
    api_keys_file: str = ""
    metrics_require_key: bool = False
    # labels every key may name (comma-separated); versions newer than the newest of them are
    # unvetted: only keys whose scope lists them reach them (backend/auth.py)
    public_labels: str = "stable"
    # redis://host:port/db: rate limits shared by every pod (backend/ratelimit.py); empty: per pod
    rate_limit_redis_url: str = ""
    # host:port of a second listener that alone serves /metrics (docker/gunicorn.conf.py binds it);
    # empty: /metrics is served on GATEWAY_BIND with the API
    metrics_bind: str = ""
    # speed of early-exit models when a request gives none (None: the model's own default)
    default_speed: float | None = None
    # weights and shadow per model (backend/routing.py); empty: routing.yaml beside the config
    routing_file: str = ""
    # shadow requests that may wait per worker behind the one running before more are dropped
    # (0: one in flight, none waiting, so shadows only use the worker's spare moments and never
    # build a backlog that drains into the next rollout step); each shadow call's deadline
    shadow_queue_size: int = 0
    shadow_timeout_s: float = 10.0
    # where shadow calls go (same forms as tfs_grpc_target / tfs_rest_url): model-server capacity
    # of their own, e.g. a lower-priority TF Serving deployment, so that a shadow never takes CPU
    # from the clients' calls; empty: the same model servers as the clients' calls
    shadow_tfs_grpc_target: str = ""
    shadow_tfs_rest_url: str = ""
    # upstream calls of one kind (model, version, bucket) a worker runs at once; requests that
    # arrive meanwhile share the next call (backend/grouping.py); 0: every request calls alone
    group_in_flight: int = 2
    # the result cache (backend/cache.py), per worker: bytes its entries may hold (0: off), the
    # most one entry may hold (a bigger answer is computed and not kept), the most entries;
    # entries are per API key unless shared across keys (a hit's timing tells one key that
    # another sent the same text)
    cache_bytes: int = 0
    cache_entry_bytes: int = 65_536
    cache_entries: int = 100_000
    cache_shared_keys: bool = False
    # the result cache's shared tier (backend/cache.py, SharedTier), behind the worker's: off
    # unless turned on; then in the Redis of cache_redis_url, else of rate_limit_redis_url, under
    # its own key prefix (a Redis ACL names it: deploy/k8s/base/redis.yaml), each entry kept
    # cache_redis_ttl_s; every call waits at most cache_redis_timeout_s, and after a failure the
    # tier is skipped for cache_redis_retry_s (a Redis down costs requests nothing)
    cache_redis: bool = False
    cache_redis_url: str = ""
    cache_redis_prefix: str = "bert-gateway:cache:"
    cache_redis_ttl_s: float = 3600.0
    cache_redis_timeout_s: float = 0.05
    cache_redis_retry_s: float = 5.0
    # observability (backend/observability.py): TEI's x-*-time headers and Server-Timing on
    # inference answers; access and error log lines as JSON ("json") or gunicorn's text
    timing_headers: bool = True
    log_format: str = "json"
    # OpenTelemetry traces: on when the standard OTEL_* variables name an OTLP endpoint
    tracing: bool = False

    def __post_init__(self) -> None:
        if self.upstream not in UPSTREAMS:
            raise SettingsError(
                f"GATEWAY_UPSTREAM must be one of {UPSTREAMS}, not {self.upstream!r}"
            )
        for name in ("max_batch_size", "max_concurrent_chunks", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be at least 1")
        if min(self.cache_bytes, self.cache_entry_bytes, self.cache_entries) < 0:
            raise SettingsError(
                "cache_bytes, cache_entry_bytes and cache_entries must be at least 0"
            )
        self._check_cache_redis()
        if self.shadow_queue_size < 0 or self.group_in_flight < 0:
            raise SettingsError("shadow_queue_size and group_in_flight must be at least 0")
        limits = ("max_texts_per_request", "max_text_chars", "max_token_ids",
                  "max_request_tokens", "max_request_rows", "tfs_max_elements",
                  "tfs_max_values", "tfs_max_body_bytes", "max_answer_bytes")  # fmt: skip
        if min(getattr(self, name) for name in limits) < 1:
            raise SettingsError(f"{', '.join(limits)} must be at least 1")
        if min(self.request_timeout_s, self.status_deadline_s, self.shadow_timeout_s) <= 0:
            raise SettingsError(
                "request_timeout_s, status_deadline_s and shadow_timeout_s must be positive"
            )
        if self.log_format not in LOG_FORMATS:
            raise SettingsError(
                f"GATEWAY_LOG_FORMAT must be one of {LOG_FORMATS}, not {self.log_format!r}"
            )
        if self.metrics_bind and not self.metrics_port.isdigit():
            raise SettingsError(
                f"GATEWAY_METRICS_BIND must be host:port, not {self.metrics_bind!r}"
            )
        if self.default_speed is not None and not 0 <= self.default_speed <= 1:  # NaN too
            raise SettingsError(
                f"GATEWAY_DEFAULT_SPEED must be in [0, 1] or unset, not {self.default_speed}"
            )

    def _check_cache_redis(self) -> None:
        """Refuse a shared tier without the worker's tier, a Redis, a prefix or positive times."""
        for name in ("rate_limit_redis_url", "cache_redis_url"):
            url = getattr(self, name)
            problem = url_problem(url) if url else None
            if problem is not None:  # the message shows the URL with its password redacted
                raise SettingsError(f"GATEWAY_{name.upper()} {problem}")
        if not self.cache_redis:
            return
        if not (self.cache_bytes and self.cache_entries):
            raise SettingsError(
                "GATEWAY_CACHE_REDIS needs the worker's tier it sits behind: set "
                "GATEWAY_CACHE_BYTES (and GATEWAY_CACHE_ENTRIES) above 0"
            )
        if not self.cache_redis_target:
            raise SettingsError(
                "GATEWAY_CACHE_REDIS needs a Redis: set GATEWAY_CACHE_REDIS_URL "
                "(or GATEWAY_RATE_LIMIT_REDIS_URL, which it then shares)"
            )
        if not self.cache_redis_prefix:
            raise SettingsError("GATEWAY_CACHE_REDIS_PREFIX must not be empty")
        times = (self.cache_redis_ttl_s, self.cache_redis_timeout_s, self.cache_redis_retry_s)
        if not min(times) > 0:  # NaN too
            raise SettingsError(
                "GATEWAY_CACHE_REDIS_TTL_S, GATEWAY_CACHE_REDIS_TIMEOUT_S and "
                "GATEWAY_CACHE_REDIS_RETRY_S must be positive"
            )

    @property
    def cache_redis_target(self) -> str:
        """The Redis URL of the result cache's shared tier (the rate limits' unless its own)."""
        return self.cache_redis_url or self.rate_limit_redis_url

    @property
    def public_label_names(self) -> tuple[str, ...]:
        """The public labels, in the order given (the first is the fallback of routing)."""
        return tuple(name.strip() for name in self.public_labels.split(",") if name.strip())

    @property
    def metrics_port(self) -> str:
        """The port of GATEWAY_METRICS_BIND ("" when /metrics shares the API's port)."""
        return self.metrics_bind.rpartition(":")[2] if self.metrics_bind else ""

    def shadow_settings(self) -> Settings | None:
        """Return the settings shadow calls go out with, or None: they use this upstream."""
        if self.upstream == "grpc" and self.shadow_tfs_grpc_target:
            target = {"tfs_grpc_target": self.shadow_tfs_grpc_target}
        elif self.upstream == "rest" and self.shadow_tfs_rest_url:
            target = {"tfs_rest_url": self.shadow_tfs_rest_url}
        else:
            return None
        return self.replace(**target, shadow_tfs_grpc_target="", shadow_tfs_rest_url="")

    def replace(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied (validated like the original)."""
        return dataclasses.replace(self, **changes)


# GATEWAY_<NAME> → field; a few env names are shorter than the field they fill.
ENV_NAMES: dict[str, str] = {
    "GATEWAY_UPSTREAM": "upstream",
    "GATEWAY_TFS_GRPC": "tfs_grpc_target",
    "GATEWAY_TFS_REST": "tfs_rest_url",
    "GATEWAY_MODEL_BASE_PATH": "model_base_path",
    "GATEWAY_MODEL_CONFIG_FILE": "model_config_file",
    "GATEWAY_DEFAULT_MODEL": "default_model",
    "GATEWAY_TIMEOUT_S": "request_timeout_s",
    "GATEWAY_STATUS_CACHE_S": "status_cache_s",
    "GATEWAY_STATUS_DEADLINE_S": "status_deadline_s",
    "GATEWAY_LABELS_CACHE_S": "labels_cache_s",
    "GATEWAY_MAX_BATCH": "max_batch_size",
    "GATEWAY_MAX_CONCURRENT_CHUNKS": "max_concurrent_chunks",
    "GATEWAY_MAX_BODY_BYTES": "max_body_bytes",
    "GATEWAY_MAX_TEXTS": "max_texts_per_request",
    "GATEWAY_MAX_TEXT_CHARS": "max_text_chars",
    "GATEWAY_MAX_TOKEN_IDS": "max_token_ids",
    "GATEWAY_MAX_REQUEST_TOKENS": "max_request_tokens",
    "GATEWAY_MAX_REQUEST_ROWS": "max_request_rows",
    "GATEWAY_TFS_MAX_ELEMENTS": "tfs_max_elements",
    "GATEWAY_TFS_MAX_VALUES": "tfs_max_values",
    "GATEWAY_TFS_MAX_BODY_BYTES": "tfs_max_body_bytes",
    "GATEWAY_MAX_ANSWER_BYTES": "max_answer_bytes",
    "GATEWAY_BUCKETING": "bucketing",
    "GATEWAY_GRPC_RETRIES": "grpc_retries",
    "GATEWAY_RETRY_AFTER_S": "retry_after_s",
    "GATEWAY_DEBUG_ENDPOINTS": "debug_endpoints",
    "GATEWAY_API_KEYS_FILE": "api_keys_file",
    "GATEWAY_METRICS_REQUIRE_KEY": "metrics_require_key",
    "GATEWAY_PUBLIC_LABELS": "public_labels",
    "GATEWAY_RATE_LIMIT_REDIS_URL": "rate_limit_redis_url",
    "GATEWAY_METRICS_BIND": "metrics_bind",
    "GATEWAY_DEFAULT_SPEED": "default_speed",
    "GATEWAY_ROUTING_FILE": "routing_file",
    "GATEWAY_SHADOW_QUEUE": "shadow_queue_size",
    "GATEWAY_SHADOW_TIMEOUT_S": "shadow_timeout_s",
    "GATEWAY_SHADOW_TFS_GRPC": "shadow_tfs_grpc_target",
    "GATEWAY_SHADOW_TFS_REST": "shadow_tfs_rest_url",
    "GATEWAY_GROUP_IN_FLIGHT": "group_in_flight",
    "GATEWAY_CACHE_BYTES": "cache_bytes",
    "GATEWAY_CACHE_ENTRY_BYTES": "cache_entry_bytes",
    "GATEWAY_CACHE_ENTRIES": "cache_entries",
    "GATEWAY_CACHE_SHARED_KEYS": "cache_shared_keys",
    "GATEWAY_CACHE_REDIS": "cache_redis",
    "GATEWAY_CACHE_REDIS_URL": "cache_redis_url",
    "GATEWAY_CACHE_REDIS_PREFIX": "cache_redis_prefix",
    "GATEWAY_CACHE_REDIS_TTL_S": "cache_redis_ttl_s",
    "GATEWAY_CACHE_REDIS_TIMEOUT_S": "cache_redis_timeout_s",
    "GATEWAY_CACHE_REDIS_RETRY_S": "cache_redis_retry_s",
    "GATEWAY_TIMING_HEADERS": "timing_headers",
    "GATEWAY_LOG_FORMAT": "log_format",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _convert(name: str, kind: Any, raw: Any) -> Any:
    """Return ``raw`` converted to the field's type; strings come from the environment."""
    if not isinstance(raw, str):
        return raw
    try:
        if kind in (bool, "bool"):
            lowered = raw.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ValueError(raw)
            return lowered in _TRUE
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
        if kind == "float | None":
            return float(raw) if raw.strip() else None
    except ValueError:
        raise SettingsError(f"{name}: cannot read {raw!r} as {kind}") from None
    return raw


def load_settings(
    overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Return settings from GATEWAY_* variables, then ``overrides`` (field or env names)."""
    env = os.environ if environ is None else environ
    types = {f.name: f.type for f in fields(Settings)}
    values: dict[str, Any] = {"tracing": otel_traces_configured(env)}
    for env_name, field_name in ENV_NAMES.items():
        if env_name in env:
            values[field_name] = _convert(env_name, types[field_name], env[env_name])
    for key, raw in (overrides or {}).items():
        field_name = ENV_NAMES.get(key, key)
        if field_name not in types:
            raise SettingsError(f"unknown setting {key!r}")
        values[field_name] = _convert(key, types[field_name], raw)
    return Settings(**values)


def otel_traces_configured(environ: Mapping[str, str]) -> bool:
    """Return True when the standard OTEL_* variables ask for traces over OTLP: an endpoint is
    set and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )
