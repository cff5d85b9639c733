"""benchmarks/observability_bench.py: its OTLP sink takes what the SDK's exporter sends."""

from __future__ import annotations

from benchmarks.observability_bench import _otlp_sink


def test_the_otlp_sink_accepts_the_sdks_exports() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

    server, endpoint = _otlp_sink()
    results: list[SpanExportResult] = []

    class Recording(OTLPSpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            results.append(super().export(spans))
            return results[-1]

    try:
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(Recording(endpoint=endpoint, insecure=True))
        )
        with provider.get_tracer("test").start_as_current_span("one"):
            pass
        provider.shutdown()
    finally:
        server.stop(grace=None)

    assert results == [SpanExportResult.SUCCESS]
