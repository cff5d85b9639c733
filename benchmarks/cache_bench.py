"""What a result-cache hit costs the worker, beside the relay floor and a miss (issue 50).

One run, one model server, the relay floor (benchmarks/gateway_cost_bench.py's) and one gateway
worker with the result cache on (GATEWAY_CACHE_BYTES, grpc upstream, the product's log and
threads): one-text ``:embed`` of the same text again and again (a hit: no tokenizer, no model
call), and the same request with ``Cache-Control: no-store`` (computed every time: the whole
path, the cache stage a no-op). Figure: worker CPU per request (utime+stime from /proc over a
stretch after a warm-up), sequential and under 16 clients, medians over interleaved rounds, ×
the floor measured in the same run. Run with ``python scripts/bench.py --only cache``.
"""

from __future__ import annotations

import orjson

from benchmarks import BenchContext, Row, median
from benchmarks.gateway_bench import _models
from benchmarks.gateway_cost_bench import (
    GATEWAY_THREADS,
    MODES,
    Floor,
    Reading,
    Target,
    _embed_output,
    compile_floor_protos,
    measure_rounds,
    prepare_requests,
)
from benchmarks.stack import Stack
from ops.load.cells import make_texts

CACHE_BYTES = 64 * 1024 * 1024


def measure(ctx: BenchContext) -> tuple[list[Target], dict[tuple[str, str], list[Reading]], int]:
    """Start the stack and the floor, run the interleaved rounds; return the readings."""
    base, classify_model, embed_model = _models(ctx)
    one = make_texts(1, 8, seed=1)
    settings = {"GATEWAY_ACCESS_LOG": "-", "GATEWAY_THREADS": str(GATEWAY_THREADS),
                "GATEWAY_CACHE_BYTES": str(CACHE_BYTES)}  # fmt: skip
    stack = Stack(ctx, base, [classify_model, embed_model], upstreams=("grpc",),
                  settings=settings)  # fmt: skip
    floor: Floor | None = None
    try:
        version = stack.version(embed_model)
        output = _embed_output(base, embed_model, version)
        protos = compile_floor_protos(ctx.work_dir / "floor-protos")
        prepared = prepare_requests(base, embed_model, version, {1: one},
                                    ctx.work_dir / "floor-requests")  # fmt: skip
        floor = Floor(ctx, stack.grpc_port, protos, prepared, output)
        path = f"/v1/models/{embed_model}:embed"
        body = orjson.dumps({"texts": one})
        measured = [
            Target("floor-1", "floor", "floor, 1 text", path, body, 1),
            Target("hit-1", "gateway", ":embed, 1 text, cache hit", path, body, 1),
            Target("miss-1", "gateway", ":embed, 1 text, no-store (computed)", path, body, 1,
                   (("Cache-Control", "no-store"),)),
        ]  # fmt: skip
        urls = {"floor": floor.url, "gateway": stack.gateways["grpc"]}
        pids = {"floor": floor.worker_pid, "gateway": stack.worker_pids("grpc")[0]}
        readings, rounds = measure_rounds(ctx, "cache", measured, urls, pids)
        return measured, readings, rounds
    finally:
        if floor is not None:
            floor.stop()
        stack.stop()


def run(ctx: BenchContext) -> list[Row]:
    """Run the cache group and return its rows."""
    measured, readings, rounds = measure(ctx)
    tag = " (--quick: not a measurement)" if ctx.quick else ""
    how = (f"worker utime+stime (/proc) per request, median of {rounds} interleaved round(s); "
           f"one gateway worker, {GATEWAY_THREADS} threads, GATEWAY_CACHE_BYTES={CACHE_BYTES}, "
           f"grpc upstream; the floor of gateway_cost{tag}")  # fmt: skip
    cpu: dict[tuple[str, str], float] = {
        key: median([r.cpu_ms for r in found]) for key, found in readings.items()
    }
    out = []
    for target in measured:
        for mode, words in MODES.items():
            ms, floor_ms = cpu[(target.key, mode)], cpu[("floor-1", mode)]
            is_floor = target.server == "floor"
            aim = "≤ 0.5× the floor" if target.key == "hit-1" else ""
            out.append(Row(f"cache {target.label}, {words}: worker CPU per request",
                           f"{ms:.2f} ms", "the floor" if is_floor else
                           f"{ms / floor_ms:.2f}× the floor", aim, how))  # fmt: skip
    return out
