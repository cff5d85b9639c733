"""OpenTelemetry traces of requests, off unless an OTLP endpoint is configured, and then free.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and
neither ``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``); everything else is the
SDK's own standard variables (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``/``_ARG``,
``OTEL_BSP_*``, ``OTEL_EXPORTER_OTLP_HEADERS``...). When off, nothing of OpenTelemetry is
imported, the app registers no tracing hook and every function here returns at its first line.

A traced request is one SERVER span joined to the caller's W3C ``traceparent``, with a child span
per stage (``gateway.validate``, ``gateway.resolve``, ``gateway.tokenize``, ``gateway.plan``,
``gateway.call`` with ``gateway.queue`` inside it, ``gateway.reassemble``, ``gateway.postprocess``,
``gateway.answer``: backend/timing.py times them) and a CLIENT span per model-server call
(``tfserving.predict``: model, version, signature, rows of the (possibly grouped) call,
replica). The call carries the trace on (gRPC metadata / HTTP headers, ``traceparent``): the W3C
trace context only, unless OTEL_PROPAGATORS names more (a client's ``baggage`` is not forwarded
by default). The caller's
context is read once the request is authenticated: a refused request starts no span. A shadow
call is a trace of its own, linked to the request it repeats. Errors are recorded on the span
they left.

The SDK starts in each gunicorn worker on its first request (its export thread must not cross a
fork); its BatchSpanProcessor exports in the background and flushes when the worker exits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")

SERVICE_NAME = "bert-gateway"

_tracer: Any = None  # the SDK tracer once this process set it up; None: tracing is off
_pid = 0
_api: Any = None  # the opentelemetry modules this module uses (imported only when on)
_NULL = contextlib.nullcontext()


def active() -> bool:
    """Return True in a process that traces."""
    return _tracer is not None


def setup() -> None:
    """Start the SDK in this process (once per worker, after fork): OTLP over gRPC, batched."""
    global _tracer, _pid, _api
    if _tracer is not None and _pid == os.getpid():
        return
    from types import SimpleNamespace

    from opentelemetry import context, propagate, trace
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_*
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _api = SimpleNamespace(
        context=context, propagator=_propagator(propagate), trace=trace, Link=Link,
        SpanKind=SpanKind, Status=Status, StatusCode=StatusCode, provider=provider,
    )  # fmt: skip
    _tracer = provider.get_tracer("backend")
    _pid = os.getpid()


def _propagator(propagate: Any) -> Any:
    """Return what is read from requests and sent on to TF Serving: the W3C trace context only,
    unless the operator names propagators (OTEL_PROPAGATORS, the SDK's own configuration). The
    SDK's default adds W3C baggage: a client's ``baggage`` header would go, as it came, into
    every model-server call's gRPC metadata."""
    if os.environ.get("OTEL_PROPAGATORS", "").strip():
        return propagate.get_global_textmap()
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def shutdown() -> None:
    """Export what is buffered and stop (a worker's exit; atexit does it too)."""
    global _tracer
    if _tracer is not None and _pid == os.getpid():
        _api.provider.shutdown()
    _tracer = None


# -- the request span ------------------------------------------------------------------------


def begin_request(headers: Any, name: str, attributes: dict[str, Any]) -> Any:
    """Start the request's SERVER span as a child of the caller's ``traceparent`` (if any) and
    make it current; return the handle ``end_request`` takes."""
    parent = _api.propagator.extract(headers)
    span = _tracer.start_span(
        name, context=parent, kind=_api.SpanKind.SERVER, attributes=attributes
    )
    token = _api.context.attach(_api.trace.set_span_in_context(span, parent))
    return span, token


def trace_id(handle: Any) -> str:
    """Return the hex trace id of a request span's handle."""
    return format(handle[0].get_span_context().trace_id, "032x")


def end_request(handle: Any, status: int, attributes: dict[str, Any], error: str = "") -> None:
    """Finish the request span with its status code (5xx answers are errors)."""
    span, token = handle
    span.set_attributes(attributes)
    span.set_attribute("http.response.status_code", status)
    if error:
        span.set_attribute("error.type", error)
    if status >= 500:
        span.set_status(_api.Status(_api.StatusCode.ERROR, error or str(status)))
    span.end()
    with contextlib.suppress(ValueError):  # a context from another thread/context: nothing to undo
        _api.context.detach(token)


# -- stages and upstream calls ---------------------------------------------------------------


def start_stage(name: str) -> tuple[Any, Any]:
    """Start the span of stage ``name`` under the current span and make it current."""
    span = _tracer.start_span(f"gateway.{name}")
    return span, _api.context.attach(_api.trace.set_span_in_context(span))


def end_stage(handle: tuple[Any, Any], seconds: float) -> None:
    """End a stage span exactly ``seconds`` after it started (the clock's measurement)."""
    span, token = handle
    _api.context.detach(token)
    span.end(end_time=span.start_time + int(seconds * 1e9))


def fail(span: Any, exc: BaseException) -> None:
    """Record ``exc`` on ``span`` and mark it failed (with the gateway error's code)."""
    span.record_exception(exc)
    span.set_status(_api.Status(_api.StatusCode.ERROR, getattr(exc, "code", type(exc).__name__)))


def upstream_call(
    model: str, version: int, signature: str | None, rows: int, transport: str
) -> contextlib.AbstractContextManager[Any]:
    """Return the context of one model-server call: a CLIENT span when tracing, else nothing."""
    if _tracer is None:
        return _NULL
    return _call_span(model, version, signature, rows, transport)


@contextlib.contextmanager
def _call_span(
    model: str, version: int, signature: str | None, rows: int, transport: str
) -> Iterator[Any]:
    attributes = {
        "rpc.system": transport,
        "tfserving.model": model,
        "tfserving.version": version,
        "tfserving.signature": signature or "serving_default",
        "tfserving.rows": rows,
    }
    with _tracer.start_as_current_span(
        "tfserving.predict", kind=_api.SpanKind.CLIENT, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:  # fmt: skip
        try:
            yield span
        except BaseException as exc:
            fail(span, exc)
            raise


def annotate(key: str, value: Any) -> None:
    """Set an attribute on the current span (the replica a call went to), when tracing."""
    if _tracer is not None:
        _api.trace.get_current_span().set_attribute(key, value)


def grpc_metadata() -> tuple[tuple[str, str], ...] | None:
    """Return the trace context as gRPC metadata for an outgoing call (None when off)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _api.propagator.inject(carrier)
    return tuple(carrier.items())


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the trace context (``traceparent``) to an outgoing HTTP call's headers, when tracing."""
    if _tracer is not None:
        _api.propagator.inject(headers)


def linked(name: str, fn: Callable[[], T], attributes: dict[str, Any]) -> Callable[[], T]:
    """Return ``fn`` run as the root span ``name`` linked to the current span (a shadow call
    that runs later on another thread); ``fn`` itself when not tracing."""
    if _tracer is None:
        return fn
    origin = _api.trace.get_current_span().get_span_context()

    def run() -> T:
        links = [_api.Link(origin)] if origin.is_valid else []
        with _tracer.start_as_current_span(
            name, context=_api.context.Context(), links=links, attributes=attributes
        ):
            return fn()

    return run


def traceparent_id(header: str | None) -> str:
    """Return the trace id of a W3C ``traceparent`` header ('' when absent or malformed)."""
    if not header:
        return ""
    parts = header.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return ""
    try:
        int(parts[1], 16)
    except ValueError:
        return ""
    return parts[1].lower()
