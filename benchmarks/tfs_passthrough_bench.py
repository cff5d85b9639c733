"""What the /tfs passthrough costs a TF Serving :predict: the same body sent to the model server's
REST API directly and through the gateway (over its REST and its gRPC upstream), side by side.

One modelserver serving half_plus_two, one gunicorn gateway per upstream (1 worker, 4 threads);
the three calls taken in turn (the same noise for all) on keep-alive connections, for a 1-row and
a 256-row ``instances`` body. Added cost = gateway p50 − direct p50; the gateway's CPU per request
is utime+stime of its processes over the timed calls.
"""

from __future__ import annotations

from functools import partial

import orjson

from benchmarks import BenchContext, Row, median
from benchmarks.gateway_load_bench import cpu_delta, cpu_snapshot
from benchmarks.stack import Http, Stack, interleaved

MODEL = "half_plus_two"


def run(ctx: BenchContext) -> list[Row]:
    """Return p50 of direct vs passthrough :predict (both upstreams) and the gateway's CPU."""
    from modelserver.half_plus_two import export_half_plus_two

    base = ctx.work_dir / "tfs-models"
    export_half_plus_two(base / MODEL, version=1)
    config = ctx.work_dir / "gateway-bench.config"  # Stack writes it before the gateways start
    stack = Stack(ctx, base, [MODEL], settings={"GATEWAY_MODEL_CONFIG_FILE": str(config)})
    n = 100 if ctx.quick else 600
    rows: list[Row] = []
    try:
        direct = Http(stack.rest_url)
        gateways = {name: Http(url) for name, url in stack.gateways.items()}
        for batch in (1, 256):
            body = orjson.dumps({"instances": [[float(i)] for i in range(batch)]})
            path = f"/v1/models/{MODEL}:predict"
            calls = [partial(direct.call, "POST", path, body)] + [
                partial(http.call, "POST", "/tfs" + path, body) for http in gateways.values()
            ]
            interleaved(calls, 0, warmup=20)
            pids = {name: stack.worker_pids(name) for name in gateways}
            before = {name: cpu_snapshot(p) for name, p in pids.items()}
            times = interleaved(calls, n, warmup=0)
            after = {name: cpu_snapshot(p) for name, p in pids.items()}
            p50 = [median(t) * 1000 for t in times]
            how = (
                f"{n} interleaved POST :predict of {batch} row(s) (half_plus_two, modelserver "
                "REST direct vs gateway /tfs, gunicorn 1 worker × 4 threads, keep-alive)"
            )
            rows.append(Row(f"direct model-server REST :predict, {batch} row(s), p50",
                            f"{p50[0]:.2f} ms", "1.00×", "", how))  # fmt: skip
            for (name, _), p in zip(gateways.items(), p50[1:], strict=True):
                cpu = cpu_delta(before[name], after[name]) / n * 1000
                rows.append(Row(
                    f"  through /tfs over {name}, p50 (+{p - p50[0]:.2f} ms)", f"{p:.2f} ms",
                    f"{p / p50[0]:.2f}× direct", "the relay's cost, never worse",
                    f"gateway CPU {cpu:.2f} ms per request",
                ))  # fmt: skip
    finally:
        stack.stop()
    return rows
