"""Prometheus metrics, safe under gunicorn's multiprocess model.

With PROMETHEUS_MULTIPROC_DIR set (docker/gunicorn.conf.py sets it before the app is imported),
each worker writes its samples to files there and /metrics aggregates all workers.

Every label value comes from the server, never from a client (each new value is a new series in
every worker's file, on a pod's small memory-backed /tmp): routes are the app's URL rules (else
'unmatched'); models have a directory in the model tree (else 'other', or '' for a route
without one); versions have assets there, or come from the routing file (else '': no version
was established); statuses, error codes, transports, outcomes, stages and measures are the
gateway's own constants; API key names come from the keys file. tests/backend/
test_hostile_clients.py sends 5,000 requests inventing names, versions and id lists and checks
that the set of series does not change.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

REQUESTS = Counter(
    "gateway_requests_total",
    "HTTP requests by route, model, served version and status code.",
    ["route", "model", "version", "status"],
)
REQUEST_SECONDS = Histogram(
    "gateway_request_duration_seconds",
    "Whole-request latency by route.",
    ["route"],
    buckets=LATENCY_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "gateway_stage_duration_seconds",
    "Latency of one stage of an inference request, in the order they run: validate, resolve, "
    "cache, tokenize, plan, call (the model server's calls), reassemble, postprocess, answer; and "
    "queue (the part of call spent waiting for a call shared with concurrent requests).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
UPSTREAM_ERRORS = Counter(
    "gateway_upstream_errors_total",
    "Failed calls to the model server by transport and gateway error code.",
    ["transport", "code"],
)
REPLICA_FAILOVERS = Counter(
    "gateway_replica_failovers_total",
    "Calls retried on another model-server replica, by transport and the first replica's error.",
    ["transport", "code"],
)
REPLICA_HUNG = Counter(
    "gateway_replica_hung_total",
    "Replicas found accepting connections but not answering (no calls until they answer again).",
    ["transport"],
)
STATUS_REFRESHES = Counter(
    "gateway_status_refreshes_total",
    "Version-state fan-outs to the model server, by outcome: fresh, stale (the last merged answer "
    "served while a refresh runs) and negative (an unknown model answered from the cache).",
    ["outcome"],
)
KEY_REQUESTS = Counter(
    "gateway_api_key_requests_total",
    "Requests by API key name (never the key) and HTTP status, when API keys are on.",
    ["key", "status"],
)
API_KEYS_ERRORS = Counter(
    "gateway_api_keys_errors_total",
    "Failed reads of GATEWAY_API_KEYS_FILE; the last good keys stay.",
)
API_KEYS_STALE = Gauge(
    "gateway_api_keys_stale",
    "1 while a worker serves the last good API keys because the keys file is unusable.",
    multiprocess_mode="livemax",
)
RATE_LIMIT_STORE_ERRORS = Counter(
    "gateway_rate_limit_store_errors_total",
    "Rate-limit takes Redis failed (GATEWAY_RATE_LIMIT_REDIS_URL); the pod limits alone meanwhile.",
)
UPSTREAM_GROUP_REQUESTS = Histogram(
    "gateway_upstream_group_requests",
    "Requests sharing one upstream call (backend/grouping.py; 1: the call went alone).",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
)
TEXTS_PER_REQUEST = Histogram(
    "gateway_texts_per_request",
    "Texts per inference request.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
TOKENS_PER_REQUEST = Histogram(
    "gateway_tokens_per_request",
    "Tokens (specials included, before padding) per inference request.",
    buckets=(16, 64, 256, 1024, 4096, 16384, 65536, 262144),
)
EXIT_LAYER = Histogram(
    "gateway_exit_layer",
    "Layers each text ran before it exited (early-exit models; the model's layer count = all).",
    ["model", "version"],
    buckets=tuple(range(1, 25)),
)

MODEL_CONFIG_ERRORS = Counter(
    "gateway_model_config_errors_total",
    "Failed reads of the serving config (GATEWAY_MODEL_CONFIG_FILE); the last good labels stay.",
)
MODEL_CONFIG_STALE = Gauge(
    "gateway_model_config_stale",
    "1 while a worker serves labels from an older config because the file is unreadable.",
    # live: a worker that dies while its config read fails must not leave a 1 behind for good
    # (gunicorn's child_exit marks it dead, which drops only live gauges).
    multiprocess_mode="livemax",
)

ROUTING_ERRORS = Counter(
    "gateway_routing_errors_total",
    "Failed reads of the routing file (GATEWAY_ROUTING_FILE); the last good routing stays.",
)
ROUTING_STALE = Gauge(
    "gateway_routing_stale",
    "1 while a worker routes by the last good routing because the routing file is unusable.",
    multiprocess_mode="livemax",
)

# Rollouts (ops/rollout/) read these: per-version latency and errors, the split, the shadow.
# Only default requests (naming neither a version nor a label: the traffic routing splits) count
# in these two: a client pinning the new version must not move the figures a rollout decides on.
VERSION_REQUESTS = Counter(
    "gateway_version_requests_total",
    "Default inference requests (no version or label named) by model, served version and status.",
    ["model", "version", "status"],
)
VERSION_SECONDS = Histogram(
    "gateway_version_request_seconds",
    "Whole-request latency of default inference requests by model and the version that served "
    "them.",
    ["model", "version"],
    buckets=LATENCY_BUCKETS,
)
ROUTED = Counter(
    "gateway_routed_total",
    "Default requests the routing file's weights sent to a version, by how: key (sticky), random.",
    ["model", "version", "how"],
)
SHADOW_REQUESTS = Counter(
    "gateway_shadow_requests_total",
    "Shadow requests by outcome: compared, error (the shadow failed) or dropped (queue full).",
    ["model", "served_version", "shadow_version", "outcome"],
)
SHADOW_QUEUE = Gauge(
    "gateway_shadow_queue_depth",
    "Shadow requests queued or running, summed over live workers: a rollout waits for 0 before "
    "it measures a step (a backlog from the step before would mix into it).",
    ["model"],
    multiprocess_mode="livesum",
)
AGREEMENT_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)
SHADOW_AGREEMENT = Histogram(
    "gateway_shadow_agreement",
    "Agreement of the shadow's answer with the served one, per text: top1 (0 or 1), topk_overlap, "
    "cosine (embeddings), maxsim (multi-vectors: each token vector's best cosine, both ways), "
    "sparse_overlap (sparse vectors: top-10 ids), tokens (taggers: token labels). "
    "Mean = _sum / _count.",
    ["model", "served_version", "shadow_version", "measure"],
    buckets=AGREEMENT_BUCKETS,
)
SHADOW_SCORE_DELTA = Histogram(
    "gateway_shadow_score_delta",
    "|served score - shadow score| of the served top label, per text (classifiers).",
    ["model", "served_version", "shadow_version"],
    buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
)
SHADOW_SECONDS = Histogram(
    "gateway_shadow_seconds",
    "Latency of the shadow call (resolve through reassemble), off the client's path.",
    ["model", "served_version", "shadow_version"],
    buckets=LATENCY_BUCKETS,
)

# Autoscaling signals (deploy/k8s: the gateway's HPA scales on them), summed over live workers.
IN_FLIGHT = Gauge(
    "gateway_requests_in_flight",
    "Requests to a model's routes the gateway is working on (waiting included), per model.",
    ["model"],
    multiprocess_mode="livesum",
)
WAITING = Gauge(
    "gateway_requests_waiting",
    "Requests queued for a model-server call shared with others (backend/grouping.py), per model.",
    ["model"],
    multiprocess_mode="livesum",
)

CACHE_LOOKUPS = Counter(
    "gateway_cache_lookups_total",
    "Texts looked up in the result cache (backend/cache.py), per tier and result: hit or miss.",
    ["tier", "result"],
)
CACHE_EVICTIONS = Counter(
    "gateway_cache_evictions_total",
    "Result-cache entries evicted (least recently used first) to keep the tier's bounds.",
    ["tier"],
)
CACHE_NOT_STORED = Counter(
    "gateway_cache_not_stored_total",
    "Computed answers the result cache did not keep, per tier and reason: too_big (over "
    "GATEWAY_CACHE_ENTRY_BYTES), degraded (the shared tier was being skipped).",
    ["tier", "reason"],
)
CACHE_BYTES = Gauge(
    "gateway_cache_bytes",
    "Bytes the result cache's entries hold, per tier (summed over workers).",
    ["tier"],
    multiprocess_mode="livesum",
)
CACHE_ENTRIES = Gauge(
    "gateway_cache_entries",
    "Entries in the result cache, per tier (summed over workers).",
    ["tier"],
    multiprocess_mode="livesum",
)
CACHE_TRANSFER_BYTES = Counter(
    "gateway_cache_transfer_bytes_total",
    "Bytes of entries the result cache read from (read) and wrote to (write) its shared tier "
    "(redis: GATEWAY_CACHE_REDIS).",
    ["tier", "direction"],
)
CACHE_ERRORS = Counter(
    "gateway_cache_errors_total",
    "Calls to the result cache's shared tier that failed or ran past GATEWAY_CACHE_REDIS_TIMEOUT_S "
    "(and entries read back that could not be decoded): the tier was skipped, the texts computed.",
    ["tier"],
)
CACHE_DEGRADED = Gauge(
    "gateway_cache_degraded",
    "1 while a worker skips the result cache's shared tier after an error (for "
    "GATEWAY_CACHE_REDIS_RETRY_S), else 0; the most over live workers.",
    ["tier"],
    multiprocess_mode="livemax",
)

# (metric, label values) -> the labelled child. ``labels()`` validates and looks the values up
# under a lock on every call; the hot path asks for the same few children every request.
_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def child(metric: Any, *values: str) -> Any:
    """Return ``metric.labels(*values)``, cached (label values in the metric's label order)."""
    key = (metric, values)
    found = _children.get(key)
    if found is None:
        found = _children.setdefault(key, metric.labels(*values))
    return found


# Threads whose work is not a client's request (the shadow) keep out of the stage histograms.
_quiet = threading.local()


def quiet_stages() -> None:
    """Leave this thread's stages out of ``gateway_stage_duration_seconds`` from now on."""
    _quiet.on = True


def observe_stage(name: str, seconds: float) -> None:
    """Observe one stage's seconds (backend/timing.py measures them once for every consumer)."""
    if not getattr(_quiet, "on", False):
        child(STAGE_SECONDS, name).observe(seconds)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Time the enclosed block as stage ``name`` (requests use ``timing.stage``)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        observe_stage(name, time.perf_counter() - started)


def render() -> tuple[bytes, str]:
    """Return the exposition text and its content type, aggregated over workers if multiprocess."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def mark_worker_dead(pid: int) -> None:
    """Let the multiprocess collector drop a dead worker's live gauges (gunicorn child_exit)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid)
