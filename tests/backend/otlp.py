"""A real OTLP trace receiver: OpenTelemetry's TraceService over gRPC (the generated classes of
the opentelemetry-proto package) keeping every span it is sent, and the span tree as text."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass
class Span:
    """One received span, its ids as hex."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    status: int  # 0 unset, 1 ok, 2 error
    events: list[str]
    service: str = ""

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps the spans of every Export call."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.metadata: list[dict[str, str]] = []
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # the gRPC method's name
        got = []
        for resource_spans in request.resource_spans:
            service = {a.key: _value(a.value) for a in resource_spans.resource.attributes}.get(
                "service.name", ""
            )
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    got.append(Span(
                        name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(), kind=s.kind,
                        start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        status=s.status.code, events=[e.name for e in s.events], service=service,
                    ))  # fmt: skip
        with self._lock:
            self.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, check: Callable[[list[Span]], bool], timeout_s: float = 20.0) -> list[Span]:
        """Return the spans once ``check`` accepts them (or what arrived by the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if check(spans):
                return spans
            time.sleep(0.1)
        with self._lock:
            return list(self.spans)


@contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """Serve an OTLP TraceService on a free port; yield (receiver, ``http://127.0.0.1:port``)."""
    receiver = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@dataclass
class _Node:
    span: Span
    children: list[_Node] = field(default_factory=list)


def text_tree(spans: list[Span], trace_id: str, keys: tuple[str, ...] = ()) -> str:
    """Return one trace's spans as an indented tree: name, duration, chosen attributes."""
    mine = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start_ns)
    nodes = {s.span_id: _Node(s) for s in mine}
    roots = []
    for node in nodes.values():
        parent = nodes.get(node.span.parent_id)
        (parent.children if parent else roots).append(node)
    origin = mine[0].start_ns if mine else 0
    lines: list[str] = []

    def walk(node: _Node, depth: int) -> None:
        s = node.span
        shown = [f"{k}={s.attributes[k]}" for k in keys if k in s.attributes]
        error = "  ERROR" if s.status == 2 else ""
        offset = (s.start_ns - origin) / 1e6
        lines.append(
            f"{'  ' * depth}{s.name}  +{offset:.2f} ms  {s.ms:.2f} ms"
            f"{'  ' + ' '.join(shown) if shown else ''}{error}"
        )
        for child in node.children:
            walk(child, depth + 1)

    for root in roots:
        walk(root, 0)
    return "\n".join(lines)
