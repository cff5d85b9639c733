"""What observability costs the gateway: CPU per request and p50 with the timing headers on and
off, and with OpenTelemetry tracing off and on (every request sampled), side by side in one run.

One modelserver serving a tiny model and three gunicorn gateways (1 worker each, grpc) that
differ only in GATEWAY_TIMING_HEADERS and the OTEL_* variables: the traced one exports every
span over OTLP/gRPC to a sink in this process that accepts and drops them (its export thread's
CPU counts: it runs in the worker). Calls go to the three in turn (same noise for all); CPU is
utime+stime of each gateway's process tree over the run, divided by its requests.
"""

from __future__ import annotations

from concurrent import futures
from functools import partial
from pathlib import Path

import grpc
import orjson

from benchmarks import BenchContext, Row, median
from benchmarks.gateway_load_bench import cpu_delta, cpu_snapshot
from benchmarks.stack import Http, Stack, interleaved
from ops.procs import REPO, ServerProcess, child_env, free_port, http_ok, python_cmd

TEXT = "my card was charged twice"
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _otlp_sink() -> tuple[grpc.Server, str]:
    """Start an OTLP trace endpoint that answers every Export with an empty (OK) response."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service, method = EXPORT.strip("/").split("/")
    handler = grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"",
        request_deserializer=None,  # bytes in, bytes out: nothing decoded
        response_serializer=None,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"http://127.0.0.1:{port}"


def _model(ctx: BenchContext) -> tuple[Path, str]:
    from export.tiny import export_tiny_model

    base = ctx.work_dir / "observability-models"
    export_tiny_model(base, "tiny-intent", task="classify", version=1, warmup=False)
    return base, "tiny-intent"


def run(ctx: BenchContext) -> list[Row]:
    """Return CPU per request and p50 for headers on/off and tracing off/on."""
    base, model = _model(ctx)
    stack = Stack(ctx, base, [model], upstreams=())
    sink, endpoint = _otlp_sink()
    variants = {
        "headers on, tracing off (default)": {},
        # the default again: the spread between two identical gateways is this run's noise
        "headers on, tracing off (default, 2nd gateway)": {},
        "headers off, tracing off": {"GATEWAY_TIMING_HEADERS": "0"},
        "headers on, tracing on (100 %)": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on",
        },
    }  # fmt: skip
    try:
        gateways: dict[str, tuple[Http, int]] = {}
        for name, extra in variants.items():
            port = free_port()
            env = child_env(
                GATEWAY_UPSTREAM="grpc", GATEWAY_TFS_GRPC=f"127.0.0.1:{stack.grpc_port}",
                GATEWAY_MODEL_BASE_PATH=str(base), GATEWAY_BIND=f"127.0.0.1:{port}",
                GATEWAY_WORKERS="1", GATEWAY_THREADS="4", GATEWAY_ACCESS_LOG="", **extra,
            )  # fmt: skip
            env.pop("PROMETHEUS_MULTIPROC_DIR", None)
            proc = ServerProcess(
                python_cmd("-m", "gunicorn", "-c", str(REPO / "docker" / "gunicorn.conf.py"),
                           "backend.app:create_app()"),
                ctx.work_dir / f"observability-{port}.log", env=env,
            )  # fmt: skip
            stack.processes.append(proc)
            url = f"http://127.0.0.1:{port}"
            proc.wait_until(partial(http_ok, f"{url}/healthz"), 60)
            gateways[name] = (Http(url), proc.pid)
        n = 150 if ctx.quick else 1000
        body = orjson.dumps({"texts": [TEXT]})
        path = f"/v1/models/{model}:classify"
        calls = [partial(http.call, "POST", path, body) for http, _ in gateways.values()]
        interleaved(calls, 0, warmup=20)
        pids = [pid for _, pid in gateways.values()]
        before = [cpu_snapshot([pid]) for pid in pids]
        times = interleaved(calls, n, warmup=0)
        after = [cpu_snapshot([pid]) for pid in pids]
    finally:
        sink.stop(grace=None)
        stack.stop()
    cpu_ms = [cpu_delta(b, a) / n * 1000 for b, a in zip(before, after, strict=True)]
    p50 = [median(t) * 1000 for t in times]
    how = (
        f"{n} interleaved :classify calls per gateway (1 text, tiny model, grpc, gunicorn 1 "
        "worker each, http.client keep-alive); CPU = utime+stime of the gateway's processes / "
        "requests; tracing exports every span over OTLP/gRPC to a sink that drops them"
    )
    aims = ["", "the noise", "within the noise", "OTLP export's cost, when on"]
    rows = []
    for (name, _), cpu, p, aim in zip(variants.items(), cpu_ms, p50, aims, strict=True):
        rows.append(Row(f"gateway CPU per request, {name}", f"{cpu:.2f} ms",
                        f"{cpu / cpu_ms[0]:.2f}× the default", aim, how))  # fmt: skip
        rows.append(Row(f"  p50, {name}", f"{p:.2f} ms", f"{p / p50[0]:.2f}× the default"))
    return rows
