"""OpenTelemetry traces received by a real OTLP receiver over gRPC: a gunicorn gateway with the
OTEL_* variables set (its tree, parents, attributes, the shadow's link, errors), and the trace
context the upstream clients send on to TF Serving."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests

from backend import tracing
from backend.clients.grpc_client import GrpcClient
from backend.errors import UpstreamUnavailable
from backend.timing import STAGES
from modelformat.protos import serving_pb2
from tests.backend.conftest import INTENT
from tests.backend.fake_grpc import predict_server
from tests.backend.otlp import Receiver, Span, otlp_receiver, text_tree
from tests.backend.stack import Gateway, ModelServer, gateway_env

CALLER_TRACE, CALLER_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
SERVER, CLIENT = 2, 3  # OTLP span kinds


def otel_env(endpoint: str) -> dict[str, str]:
    """Return the standard OTEL_* variables of a gateway exporting to ``endpoint`` at once."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "bert-gateway-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_TRACES_SAMPLER": "always_on",
    }


@pytest.fixture(scope="module")
def traced(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Receiver, Gateway]]:  # fmt: skip
    """Yield an OTLP receiver and a gateway tracing into it (v1 serves tiny-intent's default
    traffic, v2 shadows it)."""
    routing_file = tmp_path_factory.mktemp("traced") / "routing.yaml"
    routing_file.write_text(f"{INTENT}:\n  weights: {{1: 1}}\n  shadow: {{version: 2}}\n")
    with otlp_receiver() as (receiver, endpoint):
        env = {
            **gateway_env(modelserver, "grpc", model_base, config_file),
            **otel_env(endpoint),
            "GATEWAY_ROUTING_FILE": str(routing_file),
            "GATEWAY_SHADOW_QUEUE": "8",  # the warm-up's shadows must not crowd ours out
        }
        gateway = Gateway(env, log_dir, workers=1)
        try:  # warm (the model server's first call on a model is slow): the traces show a warm one
            for _ in range(3):
                requests.post(
                    f"{gateway.url}/v1/models/{INTENT}:classify", json={"texts": ["hi"]}, timeout=30
                )
            yield receiver, gateway
        finally:
            gateway.stop()


def _trace(receiver: Receiver, trace_id: str, names: set[str]) -> list[Span]:
    spans = receiver.wait_for(lambda got: names <= {s.name for s in got if s.trace_id == trace_id})
    return [s for s in spans if s.trace_id == trace_id]


def test_a_request_is_a_span_tree_joined_to_the_callers_traceparent(
    traced: tuple[Receiver, Gateway],
) -> None:
    receiver, gateway = traced
    response = requests.post(
        f"{gateway.url}/v1/models/{INTENT}:classify",
        json={"texts": ["hello world", "my card was charged twice"]},
        headers={"traceparent": TRACEPARENT},
        timeout=30,
    )
    assert response.status_code == 200, response.text

    stages = [f"gateway.{name}" for name in STAGES]
    spans = _trace(receiver, CALLER_TRACE, {
        "POST /v1/models/<model>:classify", "tfserving.predict", *stages,
    })  # fmt: skip
    by_name = {s.name: s for s in spans}

    root = by_name["POST /v1/models/<model>:classify"]
    assert root.parent_id == CALLER_SPAN and root.kind == SERVER
    assert root.service == "bert-gateway-test"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["gateway.model"] == INTENT and root.attributes["gateway.version"] == 1
    # the nine stages, children of the request, one after the other in their order
    assert all(by_name[stage].parent_id == root.span_id for stage in stages)
    for before, after in itertools.pairwise(stages):
        assert by_name[before].end_ns <= by_name[after].start_ns, (before, after)
    assert by_name["gateway.call"].attributes["gateway.group_requests"] == 1  # went alone
    call = by_name["tfserving.predict"]
    assert call.parent_id == by_name["gateway.call"].span_id and call.kind == CLIENT
    assert call.attributes["tfserving.model"] == INTENT
    assert call.attributes["tfserving.version"] == 1 and call.attributes["tfserving.rows"] == 2
    assert call.attributes["tfserving.replica"].startswith("127.0.0.1:")  # the model server
    # the stage spans are the clock's measurements: Server-Timing says the same durations
    timing = dict(
        part.strip().split(";dur=") for part in response.headers["Server-Timing"].split(",")
    )
    for name in STAGES:
        assert abs(float(timing[name]) - by_name[f"gateway.{name}"].ms) < 0.01, name

    # the shadow call (v2) is a trace of its own, linked to the request it repeats
    def linked_to_ours(span: Span) -> bool:
        return span.name == "gateway.shadow" and any(t == CALLER_TRACE for t, _ in span.links)

    shadows = receiver.wait_for(lambda got: any(linked_to_ours(s) for s in got))
    shadow = next(s for s in shadows if linked_to_ours(s))
    assert shadow.links == [(CALLER_TRACE, root.span_id)] and shadow.parent_id == ""
    assert shadow.attributes["gateway.shadow_version"] == 2
    shadow_calls = _trace(receiver, shadow.trace_id, {"tfserving.predict"})
    assert [s.attributes["tfserving.version"] for s in shadow_calls if s.name ==
            "tfserving.predict"] == [2]  # fmt: skip

    # the access line carries the trace id
    deadline = time.monotonic() + 10
    while CALLER_TRACE not in gateway.process.tail(200) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f'"trace_id":"{CALLER_TRACE}"' in gateway.process.tail(200)
    _figures(spans + shadow_calls, root, shadow)


def _figures(spans: list[Span], root: Span, shadow: Span) -> None:
    """With OBSERVABILITY_FIGURES=<dir>: the request's trace (and its linked shadow trace) as a
    text tree (<dir>/trace.txt) and as a timeline (<dir>/trace.png)."""
    where = os.environ.get("OBSERVABILITY_FIGURES")
    if not where:
        return
    keys = ("tfserving.model", "tfserving.version", "tfserving.rows", "tfserving.replica",
            "gateway.version", "http.response.status_code")  # fmt: skip
    text = (
        text_tree(spans, root.trace_id, keys)
        + f"\n\n(linked from {root.name}, trace {shadow.trace_id[:8]}...)\n"
        + text_tree(spans, shadow.trace_id, keys)
    )
    Path(where).mkdir(parents=True, exist_ok=True)
    (Path(where) / "trace.txt").write_text(text + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = sorted((s for s in spans if s.trace_id == root.trace_id), key=lambda s: s.start_ns)
    depth = {root.span_id: 0}
    for span in mine:
        depth.setdefault(span.span_id, depth.get(span.parent_id, -1) + 1)
    figure, ax = plt.subplots(figsize=(10, 0.45 * len(mine) + 1))
    for row, span in enumerate(mine):
        start = (span.start_ns - root.start_ns) / 1e6
        ax.barh(row, span.ms, left=start, color=f"C{depth[span.span_id]}")
        ax.text(start, row, f" {span.name} {span.ms:.2f} ms", va="center", fontsize=8)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the request span started")
    ax.set_title(f"trace {root.trace_id[:8]}... of one :classify request (received over OTLP)")
    figure.tight_layout()
    figure.savefig(Path(where) / "trace.png", dpi=90)
    plt.close(figure)


def test_an_error_answer_is_recorded_on_its_request_span(traced: tuple[Receiver, Gateway]) -> None:
    receiver, gateway = traced
    trace = "1" * 32
    response = requests.post(
        f"{gateway.url}/v1/models/{INTENT}:classify",
        json={"texts": ["word " * 200], "truncate": False},
        headers={"traceparent": f"00-{trace}-{CALLER_SPAN}-01"},
        timeout=30,
    )
    assert response.status_code == 422

    spans = _trace(receiver, trace, {"POST /v1/models/<model>:classify"})

    root = next(s for s in spans if s.parent_id == CALLER_SPAN)
    assert root.attributes["error.type"] == "text_too_long"
    assert root.attributes["http.response.status_code"] == 422


@pytest.fixture
def in_process_tracing() -> Iterator[Receiver]:
    """Trace in this process into a receiver (and stop tracing after the test)."""
    with otlp_receiver() as (receiver, endpoint), pytest.MonkeyPatch.context() as patch:
        for name, value in otel_env(endpoint).items():
            patch.setenv(name, value)
        tracing.setup()
        try:
            yield receiver
        finally:
            tracing.shutdown()


def test_grpc_calls_carry_the_trace_context_and_record_their_errors(
    in_process_tracing: Receiver,
) -> None:
    seen: list[dict[str, str]] = []

    def answer(request: Any, context: Any) -> Any:
        seen.append(dict(context.invocation_metadata()))
        if request.model_spec.version.value == 9:
            context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
        reply = serving_pb2.PredictResponse()
        reply.model_spec.version.value = request.model_spec.version.value
        return reply

    with predict_server(answer) as target:
        client = GrpcClient(target, retries=0)
        try:
            with tracing.upstream_call(INTENT, 1, None, 3, "grpc"):
                client.predict(INTENT, {}, version=1, timeout_s=5)
            with (
                pytest.raises(UpstreamUnavailable),
                tracing.upstream_call(INTENT, 9, None, 1, "grpc"),
            ):
                client.predict(INTENT, {}, version=9, timeout_s=5)
        finally:
            client.close()

    tracing.shutdown()  # flush
    calls = [s for s in in_process_tracing.spans if s.name == "tfserving.predict"]
    assert len(calls) == 2 and len(seen) == 2
    for call, metadata in zip(calls, seen, strict=True):
        assert metadata["traceparent"].startswith(f"00-{call.trace_id}-{call.span_id}-")
        assert call.attributes["tfserving.replica"] == target
    ok, failed = sorted(calls, key=lambda s: s.attributes["tfserving.version"])
    assert ok.status != 2 and ok.attributes["tfserving.rows"] == 3
    assert failed.status == 2 and "exception" in failed.events


def test_http_calls_carry_the_trace_context(in_process_tracing: Receiver) -> None:
    headers: dict[str, str] = {}
    with tracing.upstream_call(INTENT, 1, None, 1, "rest") as span:
        tracing.inject(headers)
        trace_id = format(span.get_span_context().trace_id, "032x")

    assert headers["traceparent"].split("-")[1] == trace_id


def test_without_otel_variables_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from backend.app import create_app; app = create_app({'model_base_path': "
        f"{str(tmp_path)!r}}}); c = app.test_client(); c.get('/healthz'); "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip

    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_failed_upstream_marks_the_request_span_failed(
    in_process_tracing: Receiver, model_base: Path
) -> None:
    from backend.app import create_app

    app = create_app({
        "upstream": "grpc", "tfs_grpc_target": "127.0.0.1:1", "model_base_path": str(model_base),
        "grpc_retries": 0, "tracing": True,
    })  # fmt: skip
    trace = "2" * 32

    answer = app.test_client().post(
        f"/v1/models/{INTENT}:classify", json={"texts": ["hi"]},
        headers={"traceparent": f"00-{trace}-{CALLER_SPAN}-01"},
    )  # fmt: skip

    assert answer.status_code == 503
    tracing.shutdown()  # flush
    spans = {s.name: s for s in in_process_tracing.spans if s.trace_id == trace}
    root = spans.pop("POST /v1/models/<model>:classify")
    assert root.status == 2 and root.attributes["error.type"] == "upstream_unavailable"
    assert root.attributes["http.response.status_code"] == 503
    # the stage the error left is failed too; none after it ran
    assert sorted(spans) == ["gateway.resolve", "gateway.validate"]
    assert spans["gateway.resolve"].status == 2 and spans["gateway.validate"].status != 2


# -- a client can't turn tracing against the gateway (issue 41 item 4) --------------------------


def test_only_the_w3c_trace_context_goes_upstream_unless_configured(
    in_process_tracing: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's ``baggage`` is not forwarded into TF Serving's gRPC metadata by default (the
    SDK's default propagators would); OTEL_PROPAGATORS names more when an operator wants them."""
    caller = {"traceparent": TRACEPARENT, "baggage": "tenant=evil,x=" + "y" * 100}

    def sent_upstream() -> dict[str, str]:
        handle = tracing.begin_request(caller, "POST /test", {})
        try:
            return dict(tracing.grpc_metadata() or ())
        finally:
            tracing.end_request(handle, 200, {})

    metadata = sent_upstream()
    assert metadata["traceparent"].split("-")[1] == CALLER_TRACE
    assert "baggage" not in metadata
    tracing.shutdown()
    monkeypatch.setenv("OTEL_PROPAGATORS", "tracecontext,baggage")
    tracing.setup()
    assert sent_upstream()["baggage"].startswith("tenant=evil")


def test_a_request_refused_by_authentication_starts_no_span(
    in_process_tracing: Receiver, model_base: Path, tmp_path: Path
) -> None:
    from backend.app import create_app
    from ops import apikeys

    keys = tmp_path / "keys.json"
    key = apikeys.add(keys, "tracer", None, None, None)
    app = create_app({
        "upstream": "grpc", "tfs_grpc_target": "127.0.0.1:1", "model_base_path": str(model_base),
        "grpc_retries": 0, "tracing": True, "api_keys_file": str(keys),
    })  # fmt: skip
    refused, allowed = "3" * 32, "4" * 32
    client = app.test_client()
    for trace, headers in ((refused, {}), (allowed, {"Authorization": f"Bearer {key}"})):
        client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hi"]},
                    headers={"traceparent": f"00-{trace}-{CALLER_SPAN}-01", **headers})  # fmt: skip
    tracing.shutdown()  # flush
    traces = {span.trace_id for span in in_process_tracing.spans}
    assert allowed in traces and refused not in traces


def test_every_line_the_traced_gateway_writes_is_its_json(
    modelserver: ModelServer, model_base: Path, config_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    """A library's warning quoting a client's header (OpenTelemetry's baggage propagator, asked
    for here) is a JSON line of the gateway's log, never raw text on stderr."""
    import json

    logs = tmp_path_factory.mktemp("json-lines")
    with otlp_receiver() as (_, endpoint):
        env = {
            **gateway_env(modelserver, "grpc", model_base, config_file), **otel_env(endpoint),
            "OTEL_PROPAGATORS": "tracecontext,baggage",
        }  # fmt: skip
        gateway = Gateway(env, logs, workers=1)
        try:
            reply = requests.post(
                f"{gateway.url}/v1/models/{INTENT}:classify", json={"texts": ["hi"]},
                headers={"traceparent": TRACEPARENT, "baggage": "}{ fake: log line"},
                timeout=30,
            )  # fmt: skip
            assert reply.status_code == 200
            time.sleep(0.5)
        finally:
            gateway.stop()
    lines = [line for line in gateway.process.log_path.read_text().splitlines() if line]
    raw = [line for line in lines if not line.startswith("{")]
    assert not raw, raw
    records = [json.loads(line) for line in lines]
    assert any("fake: log line" in r.get("message", "") for r in records), lines[-5:]
