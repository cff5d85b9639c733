"""Timing headers, access/error log lines and the autoscaling gauges, end to end (gunicorn gateway
over grpc and rest → real modelserver), and the stage clock's pure parts."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from backend import timing
from backend.settings import SettingsError, load_settings, otel_traces_configured
from tests.backend.conftest import EMBED, INTENT
from tests.backend.stack import Gateway, ModelServer, gateway_env

TEI_HEADERS = (
    "x-compute-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time",
    "x-compute-tokens", "x-compute-characters",
)  # fmt: skip
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "observability.md"


def _documented_stages() -> list[str]:
    """Return the Server-Timing names the observability guide's example shows, in its order."""
    example = re.search(r"^Server-Timing: (.+)$", GUIDE.read_text(encoding="utf-8"), re.M)
    assert example is not None, f"{GUIDE.name} shows no Server-Timing example"
    return [part.split(";")[0] for part in example.group(1).split(", ")]


def _access_lines(gateway: Gateway, request_id: str) -> list[dict[str, Any]]:
    """Return the gateway's access-log records of the request with ``X-Request-Id``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # gunicorn logs after sending the response
        lines = gateway.process.tail(400).split("\n")
        records = [json.loads(line) for line in lines if line.startswith("{")]
        mine = [r for r in records if r.get("request_id") == request_id]
        if mine:
            return mine
        time.sleep(0.1)
    return []


def _server_timing(header: str) -> dict[str, float]:
    return {
        name: float(dur) for name, dur in re.findall(r"(\w+);dur=([0-9.]+)", header)
    }  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (f"/v1/models/{INTENT}:classify", {"texts": ["hello world", "my card"]}),
        (f"/v1/models/{EMBED}:embed", {"texts": ["hello world", "my card"]}),
    ],
)
def test_every_inference_answer_carries_tei_timing_headers_and_server_timing(
    gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    started = time.perf_counter()
    response = requests.post(f"{gateway.url}{path}", json=body, timeout=30)
    elapsed_ms = (time.perf_counter() - started) * 1000

    assert response.status_code == 200, response.text
    headers = response.headers
    assert all(name in headers for name in TEI_HEADERS), dict(headers)
    assert all(headers[name].isdigit() for name in TEI_HEADERS)  # whole ms and counts, as TEI
    assert int(headers["x-compute-characters"]) == sum(len(t) for t in body["texts"])
    assert int(headers["x-compute-tokens"]) >= 2 * len(body["texts"])  # [CLS] ... [SEP] each
    stages = _server_timing(headers["Server-Timing"])
    assert list(stages) == _documented_stages()  # the stages the guide shows, in its order
    # each one measured (the cache stage looks nothing up: the result cache is off here)
    assert all(dur > 0 for name, dur in stages.items() if name != "cache"), stages
    assert sum(v for k, v in stages.items() if k != "total") <= stages["total"] <= elapsed_ms
    assert int(headers["x-total-time"]) == int(stages["total"])
    # a lone request's call goes at once: no queue, the whole call is inference
    assert headers["x-queue-time"] == "0"
    assert int(headers["x-inference-time"]) == int(stages["call"])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": EMBED, "input": ["hello world", "my card"]}),
        ("/v2/embed", {"model": EMBED, "texts": ["hello"], "input_type": "search_query",
                       "embedding_types": ["float"]}),
        (f"/v1/models/{EMBED}:rerank", {"query": "card", "documents": ["my card", "hello"]}),
        ("/v1/rerank", {"model": EMBED, "query": "card", "documents": ["my card", "hello"]}),
        # a long text in windows, pooled in postprocess
        (f"/v1/models/{EMBED}:embed", {"texts": ["word " * 200, "short"], "long_text": "chunk"}),
        # token ids: no characters were tokenized
        ("/v1/embeddings", {"model": EMBED, "input": [[5, 6, 7], [8]]}),
    ],
)  # fmt: skip
def test_every_inference_route_times_each_of_the_nine_stages(
    gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    response = requests.post(f"{gateway.url}{path}", json=body, timeout=30)

    assert response.status_code == 200, response.text
    stages = _server_timing(response.headers["Server-Timing"])
    assert list(stages) == _documented_stages()  # the stages the guide shows, in its order
    assert all(dur > 0 for name, dur in stages.items() if name != "cache"), stages
    texts = body.get("texts") or body.get("input") or [body["query"], *body["documents"]]
    texts = [texts] if isinstance(texts, str) else texts
    characters = sum(len(t) for t in texts if isinstance(t, str))  # the query once: embedded
    assert int(response.headers["x-compute-characters"]) == characters


def test_answers_that_are_not_inferences_carry_no_timing_headers(gateway: Gateway) -> None:
    response = requests.get(f"{gateway.url}/v1/models/{INTENT}", timeout=10)

    assert response.status_code == 200
    assert "x-total-time" not in response.headers and "Server-Timing" not in response.headers


def test_access_line_names_route_model_version_status_duration_and_the_callers_trace(
    gateway: Gateway,
) -> None:
    secret = "a text nobody may log 31337"
    response = requests.post(
        f"{gateway.url}/v1/models/{INTENT}:classify",
        json={"texts": [secret], "version": 1},
        headers={"X-Request-Id": f"obs-{gateway.port}", "traceparent": TRACEPARENT},
        timeout=30,
    )
    assert response.status_code == 200

    mine = _access_lines(gateway, f"obs-{gateway.port}")

    assert mine, "no access line"
    line = mine[-1]
    assert line["route"] == "/v1/models/<model>:classify"
    assert (line["model"], line["version"], line["status"]) == (INTENT, 1, 200)
    assert line["duration_ms"] > 0 and line["trace_id"] == TRACEPARENT.split("-")[1]
    assert "31337" not in gateway.process.tail(400)  # no request text anywhere in the log


def test_in_flight_and_waiting_gauges_are_exported_per_model(gateway: Gateway) -> None:
    requests.post(
        f"{gateway.url}/v1/models/{INTENT}:classify", json={"texts": ["hi"]}, timeout=30
    ).raise_for_status()

    text = requests.get(f"{gateway.url}/metrics", timeout=10).text

    # livesum gauges: summed over live workers, back to 0 once the requests are answered
    assert f'gateway_requests_in_flight{{model="{INTENT}"}} 0.0' in text
    assert "# TYPE gateway_requests_waiting gauge" in text


def test_timing_headers_and_json_error_log_follow_their_settings(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path
) -> None:
    env = gateway_env(modelserver, "grpc", model_base, config_file)
    plain = Gateway(
        {**env, "GATEWAY_TIMING_HEADERS": "0", "GATEWAY_LOG_FORMAT": "text"}, log_dir, workers=1
    )
    try:
        response = requests.post(
            f"{plain.url}/v1/models/{INTENT}:classify", json={"texts": ["hi"]}, timeout=30
        )
        assert response.status_code == 200
        assert not any(name in response.headers for name in (*TEI_HEADERS, "Server-Timing"))
        time.sleep(0.3)
        assert not any(line.startswith("{") for line in plain.process.tail(100).splitlines())
    finally:
        plain.stop()


def test_error_log_lines_are_json_by_default(gateway: Gateway) -> None:
    # gunicorn's own start-up lines go through the error log
    log = gateway.process.log_path.read_text(errors="replace")
    lines = [line for line in log.splitlines() if line.startswith('{"ts"') and '"level"' in line]

    assert lines, "no JSON error-log line"
    record = json.loads(lines[0])
    assert {"ts", "level", "logger", "message", "pid"} <= set(record)


# -- pure parts --------------------------------------------------------------------------------


def test_clock_headers_split_the_call_into_queue_and_inference() -> None:
    clock = timing.Clock(started=0.0)
    for name, seconds in (
        ("validate", 0.0005),
        ("resolve", 0.0001),
        ("tokenize", 0.002),
        ("plan", 0.0002),
        ("queue", 0.003),
        ("call", 0.010),
        ("reassemble", 0.0001),
        ("postprocess", 0.001),
        ("answer", 0.0004),
    ):
        clock.add(name, seconds)
    clock.tokens, clock.characters = 12, 40

    headers = clock.headers(now=0.020)

    assert headers["x-tokenization-time"] == "2" and headers["x-queue-time"] == "3"
    # compute: tokenize through postprocess (13.3 ms), the queue inside the call
    assert headers["x-inference-time"] == "7" and headers["x-compute-time"] == "13"
    assert headers["x-total-time"] == "20"
    assert (headers["x-compute-tokens"], headers["x-compute-characters"]) == ("12", "40")
    assert headers["Server-Timing"] == (
        "validate;dur=0.500, resolve;dur=0.100, cache;dur=0.000, tokenize;dur=2.000, "
        "plan;dur=0.200, call;dur=10.000, reassemble;dur=0.100, postprocess;dur=1.000, "
        "answer;dur=0.400, total;dur=20.000"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_tracing_is_on_only_when_otel_variables_name_an_endpoint(
    environ: dict[str, str], on: bool
) -> None:
    assert otel_traces_configured(environ) is on
    assert load_settings(environ=environ).tracing is on


def test_unknown_log_format_is_refused() -> None:
    with pytest.raises(SettingsError, match="GATEWAY_LOG_FORMAT"):
        load_settings(environ={"GATEWAY_LOG_FORMAT": "xml"})
