"""The app's per-request observability hooks: the stage clock, timing headers, the request span,
the in-flight gauge and what the access log line says about the request.

``install(app, settings)`` registers them (backend/app.py). Tracing's hooks exist only when the
OTEL_* variables turn it on (backend/tracing.py); the timing headers follow
GATEWAY_TIMING_HEADERS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Flask, Response, g, request

from backend import metrics, routing, timing, tracing
from backend.settings import Settings
from modelformat.names import valid_model_name

# WSGI environ keys backend/access_log.py writes into the access line.
ROUTE, MODEL, VERSION = "gateway.route", "gateway.model", "gateway.version"
TRACE_ID = "gateway.trace_id"


def install(app: Flask, settings: Settings) -> None:
    """Register the hooks on ``app`` (before any other before_request hook runs its work)."""
    base = Path(settings.model_base_path)
    headers = settings.timing_headers
    traced = settings.tracing

    def begin() -> None:
        clock = timing.start()
        control = request.headers.get("Cache-Control")
        if control and "no-store" in control.lower():
            clock.no_store = True
        model = (request.view_args or {}).get("model")
        if isinstance(model, str) and valid_model_name(model) and (base / model).is_dir():
            g.in_flight = metrics.child(metrics.IN_FLIGHT, model)
            g.in_flight.inc()
            metrics.child(metrics.WAITING, model)  # exported (0) before anything ever waits
        if not traced:
            trace = tracing.traceparent_id(request.headers.get("traceparent"))
            if trace:
                clock.trace_id = request.environ[TRACE_ID] = trace

    def begin_trace() -> None:
        """The request's span, joined to the caller's context: only once the request passed
        authentication and rate limits (the hooks before this one)."""
        tracing.setup()  # once per worker, after fork
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        handle = tracing.begin_request(
            request.headers, f"{request.method} {rule}",
            {"http.request.method": request.method, "http.route": rule},
        )  # fmt: skip
        g.trace = handle
        clock = timing.current()
        if clock is not None:
            clock.trace_id = request.environ[TRACE_ID] = tracing.trace_id(handle)

    def finish(response: Response) -> Response:
        environ = request.environ
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        model = getattr(g, "served_model", None)
        version = getattr(g, "served_version", None)
        if version is None:
            resolved = routing.resolved_version.get()
            if resolved is not None:
                model, version = resolved
        environ[ROUTE] = rule
        if model:
            environ[MODEL] = model
        if version is not None:
            environ[VERSION] = version
        clock = timing.current()
        if clock is not None:
            if headers:
                timing.add_headers(response.headers, clock)
            timing.add_cache_header(response.headers, clock)
        handle = g.pop("trace", None)
        if handle is not None:
            attributes: dict[str, Any] = {}
            if model:
                attributes["gateway.model"] = model
            if version is not None:
                attributes["gateway.version"] = version
            if clock is not None and clock.inferred:
                attributes["gateway.tokens"] = clock.tokens
                attributes["gateway.characters"] = clock.characters
            tracing.end_request(handle, response.status_code, attributes, _error_code(response))
        return response

    def teardown(_exc: BaseException | None) -> None:
        gauge = g.pop("in_flight", None)
        if gauge is not None:
            gauge.dec()
        handle = g.pop("trace", None)
        if handle is not None:  # no after_request ran (an exception escaped every handler)
            tracing.end_request(handle, 500, {}, "internal")
        timing.stop()

    app.before_request_funcs.setdefault(None, []).insert(0, begin)
    if traced:
        app.before_request(begin_trace)  # after the app's own hooks: authentication first
    app.after_request(finish)
    app.teardown_request(teardown)


def _error_code(response: Response) -> str:
    """Return the gateway error code of an error answer ('' for a success)."""
    if response.status_code < 400 or response.mimetype != "application/json":
        return ""
    body = response.get_json(silent=True)
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else str(response.status_code)
