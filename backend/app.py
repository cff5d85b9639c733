"""The Flask app factory: ``gunicorn 'backend.app:create_app()'``.

Nothing here opens a connection: each worker creates its Gateway (client, pools) after fork
(``backend.worker``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flask import Flask, Response, current_app, g, request
from werkzeug.routing import BaseConverter

from backend import auth, metrics, observability, ratelimit, routing
from backend.api import (
    BODY_READ,
    authorize_model,
    cohere,
    current_settings,
    health,
    meta,
    models,
    openai,
    rerank,
    tei,
    tfs,
)
from backend.errors import NotFound, RateLimited, Unauthorized, register_error_handlers
from backend.settings import SettingsError, load_settings
from backend.worker import get_gateway
from modelformat.names import valid_model_name

log = logging.getLogger("backend")


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """Return the gateway app; ``config`` overrides GATEWAY_* variables (by field or env name)."""
    settings = load_settings(config)
    keys: list[auth.ApiKey] = []
    if settings.api_keys_file:
        try:  # keys configured but none usable: refuse to start rather than refuse every request
            keys = auth.check_keys_file(settings.api_keys_file)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    app = Flask("backend", static_folder=None)
    app.extensions["gateway_start_keys"] = keys
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["gateway_settings"] = settings
    app.extensions["gateway_lock"] = threading.Lock()
    register_error_handlers(app)
    app.url_map.converters["name"] = ModelNameConverter
    for blueprint in (models.bp, health.bp, meta.bp, openai.bp, rerank.bp, cohere.bp, tfs.bp,
                      tei.bp):  # fmt: skip
        app.register_blueprint(blueprint)
    app.before_request(_start_timer)
    app.before_request(_split_ports)
    app.before_request(_authenticate)
    app.before_request(_start_routing)
    app.after_request(_record_request)
    app.after_request(_queue_shadow)
    app.after_request(_finish_body)
    observability.install(app, settings)  # clock, timing headers, request span, access-log fields
    _use_gunicorn_logging()
    return app


class ModelNameConverter(BaseConverter):
    """A model name in a URL: no '/' and no ':' (so /v1/models/x:classify is never the status
    route of a model named 'x:classify', and OPTIONS on it does not advertise GET)."""

    regex = "[^/:]+"


def _finish_body(response: Response) -> Response:
    """Read what the handler left unread of a body within the limit, so keep-alive survives.

    An answer given before the body was read (an unknown route, an early error) would leave
    the rest on the socket; gunicorn drains at most 64 KiB of it and otherwise closes the
    connection after answering "keep-alive", so the client's next request on it is lost.
    Bodies over the limit, and chunked bodies (their size is known only once read), are not
    read here: gunicorn's ``pre_request`` hook (docker/gunicorn.conf.py) answers those with
    "Connection: close" instead.
    """
    if request.environ.get(BODY_READ):
        return response  # the view read it all (request_body)
    length = request.content_length
    if length and length <= (current_app.config["MAX_CONTENT_LENGTH"] or 0):
        while request.stream.read(1 << 16):
            pass
    return response


def body_may_stay_unread(app: Flask, headers: Any) -> bool:
    """Return True when a request's body may be left unread: over the app's limit, or chunked.

    A chunked body's size is known only once it has been read, which could be past the limit;
    its connection is closed after the answer (a chunked client pays one reconnect).
    """
    values = {name.upper(): value for name, value in headers}
    if "chunked" in values.get("TRANSFER-ENCODING", "").lower():
        return True
    declared, limit = values.get("CONTENT-LENGTH"), app.config["MAX_CONTENT_LENGTH"]
    return bool(declared is not None and declared.isdigit() and limit and int(declared) > limit)


def _start_timer() -> None:
    """Start the request's clock and clear what this thread's last request left in the
    routing context (a 401/403/429 stops before ``_start_routing``, and its metrics must not
    name the version the thread served before)."""
    g.started = time.perf_counter()
    # Threads serve many requests: nothing of the last one may leak into this one, even when a
    # hook below refuses it before _start_routing runs.
    routing.start_request(None)
    auth.current_key.set(None)


METRICS_PATH = "/metrics"


def _split_ports() -> None:
    """With GATEWAY_METRICS_BIND: /metrics only on that port, and nothing else there (404s)."""
    port = current_settings().metrics_port
    if not port:
        return
    on_metrics_port = request.environ.get("SERVER_PORT") == port
    if on_metrics_port != (request.path == METRICS_PATH):
        raise NotFound(
            "/metrics is served on the metrics port only (GATEWAY_METRICS_BIND)"
            if request.path == METRICS_PATH
            else "the metrics port serves /metrics only"
        )


# Routes that stay open when API keys are on (probes); /metrics too unless asked otherwise.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def _authenticate() -> None:
    """With GATEWAY_API_KEYS_FILE: 401 without a known key, 403 for a model the key may not use,
    429 over its rate (each in the route family's error shape)."""
    settings = current_settings()
    if not settings.api_keys_file or request.path in OPEN_PATHS:
        return
    if request.path == METRICS_PATH and not settings.metrics_require_key:
        return
    keys, limiter = _key_state(settings)
    header = request.headers.get("Authorization", "")
    presented = (
        header[len(auth.HEADER_PREFIX) :].strip()
        if header.lower().startswith(auth.HEADER_PREFIX)
        else request.headers.get("X-API-Key", "").strip()
    )
    if not presented:
        raise Unauthorized(
            "an API key is required: send 'Authorization: Bearer <key>' or 'X-API-Key'"
        )
    key = keys.find(presented)
    if key is None:
        raise Unauthorized("unknown API key")
    g.api_key = key
    request.environ["gateway.api_key"] = key.name
    model = (request.view_args or {}).get("model")
    if isinstance(model, str):
        authorize_model(model)
    wait = limiter.take(key)
    if wait > 0:
        raise RateLimited(
            f"API key {key.name!r} is over its limit of {key.rate:g} requests/s",
            retry_after_s=math.ceil(wait),
        )


def _start_routing() -> None:
    """Give this request its routing key (sticky split) and its API key's scope: the API key's
    name when keys are on (a client may not pick its side of a split), else X-Route-Key."""
    api_key = g.get("api_key")
    auth.current_key.set(api_key)
    key = api_key.name if api_key is not None else request.headers.get(routing.ROUTE_KEY_HEADER)
    routing.start_request(key or None)


def _queue_shadow(response: Response) -> Response:
    """Queue the request's shadow (if routing chose one) now that its answer is built."""
    job = routing.pending_shadow.get()
    if job is not None:
        routing.pending_shadow.set(None)
        if response.status_code < 400:
            get_gateway(current_app).shadows.submit(job)
    return response


def _key_state(settings: Any) -> tuple[auth.KeyTable, ratelimit.RateLimiter]:
    """Return this process's key table and rate limiter (made after fork, on first use)."""
    state = current_app.extensions.get("gateway_keys")
    if state is None or state[0] != os.getpid():
        state = (
            os.getpid(),
            auth.KeyTable(
                settings.api_keys_file,
                recheck_s=settings.labels_cache_s,
                initial=current_app.extensions.get("gateway_start_keys"),
            ),
            ratelimit.make_limiter(
                settings.rate_limit_redis_url, os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            ),
        )
        current_app.extensions["gateway_keys"] = state
    return state[1], state[2]


def _record_request(response: Response) -> Response:
    """Count the request and observe its latency.

    Every label value comes from the server, never from the client: the route's rule (or
    'unmatched'), a model with a directory in the model tree (else 'other', or '' for a route
    without one), a version whose assets loaded (else '': none was established), the status.
    """
    rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
    model = getattr(g, "served_model", None) or _known_model(request.view_args or {})
    version = getattr(g, "served_version", None)
    resolved = routing.resolved_version.get()
    if version is None and resolved is not None and resolved[0] == model:
        version = resolved[1]  # it failed after resolution: the error counts against that version
    served = "" if version is None else str(version)
    metrics.child(metrics.REQUESTS, rule, model, served, str(response.status_code)).inc()
    key = getattr(g, "api_key", None)
    if key is not None:
        metrics.child(metrics.KEY_REQUESTS, key.name, str(response.status_code)).inc()
    started = getattr(g, "started", None)
    if started is not None:
        elapsed = time.perf_counter() - started
        metrics.child(metrics.REQUEST_SECONDS, rule).observe(elapsed)
        if served and not routing.pinned.get():  # default traffic only: what rollouts read
            metrics.child(metrics.VERSION_SECONDS, model, served).observe(elapsed)
    if served and not routing.pinned.get():
        status = str(response.status_code)
        metrics.child(metrics.VERSION_REQUESTS, model, served, status).inc()
    return response


def _known_model(view_args: Mapping[str, Any]) -> str:
    """Return the URL's model name if such a model exists on disk, else 'other' or ''."""
    model = view_args.get("model")
    if not isinstance(model, str):
        return ""
    base = Path(current_settings().model_base_path)
    return model if valid_model_name(model) and (base / model).is_dir() else "other"


def _use_gunicorn_logging() -> None:
    """Send the gateway's logs through gunicorn's error log when running under gunicorn."""
    gunicorn_logger = logging.getLogger("gunicorn.error")
    if gunicorn_logger.handlers and not log.handlers:
        log.handlers = gunicorn_logger.handlers
        log.setLevel(gunicorn_logger.level)
        log.propagate = False
