"""What a result-cache hit costs the worker, beside the relay floor and a miss (issue 50).

One run, one model server, the relay floor (benchmarks/gateway_cost_bench.py's) and one gateway
worker with the result cache on (GATEWAY_CACHE_BYTES, grpc upstream, the product's log and
threads): one-text ``:embed`` of the same text again and again (a hit: no tokenizer, no model
call), and the same request with ``Cache-Control: no-store`` (computed every time: the whole
path, the cache stage a no-op). Figure: worker CPU per request (utime+stime from /proc over a
stretch after a warm-up), sequential and under 16 clients, medians over interleaved rounds, ×
the floor measured in the same run.

And a power-law workload (search queries): one-text ``:embed`` requests whose texts are drawn
from a Zipf distribution (s = 1.1) over 10,000 distinct texts, sent by 16 client threads (one
keep-alive connection each) to three gateways of two workers on the same model server: the cache
off, in process only (each worker its own), and shared through Redis (a redis-server started
here: a text one worker computed is a hit in the other). Figures: texts/s, p99 latency and the
share of texts answered from a cache, medians over repeats (at most ZIPF_REPEATS: with 1,600
requests per gateway and repeat the group takes about a minute and a half on 2 cores); each
repeat draws its texts afresh under a tag of its own, so every repeat starts from cold caches.
Run with ``python scripts/bench.py --only cache``.
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time

import numpy as np
import orjson
import redis

from benchmarks import BenchContext, Row, median, percentile
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
from benchmarks.stack import Http, Stack
from ops.load.cells import make_texts
from ops.procs import ServerProcess, free_port

CACHE_BYTES = 64 * 1024 * 1024
ZIPF_S, DISTINCT, CLIENTS, WORKERS = 1.1, 10_000, 16, 2
ZIPF_REQUESTS, QUICK_REQUESTS = 1_600, 160  # per gateway and repeat (one text each)
ZIPF_REPEATS = 3  # at most (--repeats): the group stays well under 2 minutes on 2 cores
# name, what it is, the gateway's settings (besides the cache's bytes)
CONFIGS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("off", "cache off", {"GATEWAY_CACHE_BYTES": "0"}),
    ("local", "in process (each worker its own)", {}),
    ("shared", "shared through Redis", {"GATEWAY_CACHE_REDIS": "1"}),
)


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


def _redis(ctx: BenchContext) -> tuple[ServerProcess, str]:
    """Return a redis-server on a free port, in memory only, and its URL."""
    port = free_port()
    process = ServerProcess(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(ctx.work_dir)],
        ctx.work_dir / "cache-bench-redis.log",
    )  # fmt: skip

    def ready() -> bool:
        try:
            return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    process.wait_until(ready, 30)
    return process, f"redis://127.0.0.1:{port}/0"


def zipf_draws(requests: int, seed: int) -> np.ndarray:
    """Return ``requests`` text indices drawn from Zipf(s=ZIPF_S) over DISTINCT texts."""
    weights = np.arange(1, DISTINCT + 1, dtype=np.float64) ** -ZIPF_S
    rng = np.random.default_rng(seed)
    return rng.choice(DISTINCT, size=requests, p=weights / weights.sum())


def drive(url: str, path: str, bodies: list[bytes]) -> tuple[float, list[float]]:
    """Send ``bodies`` from CLIENTS threads; return the wall time and each request's latency."""
    latencies: list[float] = []
    lock = threading.Lock()
    turn = itertools.count()

    def client() -> None:
        http, mine = Http(url), []
        while (index := next(turn)) < len(bodies):
            started = time.perf_counter()
            http.call("POST", path, bodies[index])
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, latencies


def _cached_texts(url: str) -> tuple[float, float]:
    """Return the texts a gateway answered from a cache (either tier) and those it looked up."""
    hits = looked = 0.0
    for line in Http(url).call("GET", "/metrics").decode().splitlines():
        if line.startswith("gateway_cache_lookups_total{"):
            labels, value = line.rsplit(" ", 1)
            if 'result="hit"' in labels:
                hits += float(value)
            if 'tier="local"' in labels:
                looked += float(value)
    return hits, looked


def measure_zipf(
    ctx: BenchContext,
) -> tuple[dict[str, list[tuple[float, float, float]]], int, str]:
    """Return each configuration's (texts/s, p99 s, share of texts from a cache) per repeat,
    the requests per repeat and a note; configurations taken in turn within each repeat, every
    repeat with texts of its own."""
    tiny = ctx.work_dir / "gateway-models"
    base, embed_model = (tiny, "tiny-embed") if tiny.is_dir() else _models(ctx)[::2]
    requests = QUICK_REQUESTS if ctx.quick else ZIPF_REQUESTS
    texts = list(dict.fromkeys(make_texts(DISTINCT * 2, 8, seed=7)))[:DISTINCT]
    path = f"/v1/models/{embed_model}:embed"
    redis_server, redis_url = _redis(ctx)
    stack = Stack(ctx, base, [embed_model], upstreams=(), settings={})
    try:
        urls = {
            name: stack.add_gateway(ctx, f"cache-{name}", workers=WORKERS, settings={
                "GATEWAY_THREADS": str(GATEWAY_THREADS), "GATEWAY_CACHE_BYTES": str(CACHE_BYTES),
                **env, "GATEWAY_CACHE_REDIS_URL": redis_url,
            })
            for name, _, env in CONFIGS
        }  # fmt: skip
        warm = [orjson.dumps({"texts": [f"warm-up {i}"]}) for i in range(4 * CLIENTS)]
        for url in urls.values():
            drive(url, path, warm)
        found: dict[str, list[tuple[float, float, float]]] = {name: [] for name in urls}
        hits = []
        for repeat in range(1 if ctx.quick else min(ctx.repeats, ZIPF_REPEATS)):
            draws = zipf_draws(requests, seed=repeat)
            hits.append(1 - len(set(draws.tolist())) / requests)
            bodies = [orjson.dumps({"texts": [f"r{repeat} {texts[i]}"]}) for i in draws]
            for name, url in urls.items():
                before = _cached_texts(url)
                wall, latencies = drive(url, path, bodies)
                after = _cached_texts(url)
                cached = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                found[name].append((requests / wall, percentile(latencies, 99), cached))
        note = (f"{len(set(zipf_draws(requests, 0).tolist()))} distinct texts in a repeat's "
                f"draws: at most {median(hits):.0%} of requests can hit")  # fmt: skip
        return found, requests, note
    finally:
        stack.stop()
        redis_server.stop()


def zipf_rows(ctx: BenchContext) -> list[Row]:
    """Return the power-law workload's rows: texts/s and p99 per configuration."""
    if shutil.which("redis-server") is None:
        ctx.notes.append("cache_bench: no redis-server (make sysdeps): no power-law rows")
        return []
    found, requests, note = measure_zipf(ctx)
    tag = " (--quick: not a measurement)" if ctx.quick else ""
    how = (f"{requests} one-text :embed requests per repeat, Zipf s={ZIPF_S} over {DISTINCT:,} "
           f"texts, {CLIENTS} client threads; gateways of {WORKERS} workers, "
           f"{GATEWAY_THREADS} threads, grpc upstream, GATEWAY_CACHE_BYTES={CACHE_BYTES}; "
           f"median of {len(found['off'])} repeat(s), cold caches each; {note}{tag}")  # fmt: skip
    rate = {name: median([run[0] for run in runs]) for name, runs in found.items()}
    p99 = {name: median([run[1] for run in runs]) for name, runs in found.items()}
    cached = {name: median([run[2] for run in runs]) for name, runs in found.items()}
    out = []
    for name, words, _ in CONFIGS:
        ratio = "" if name == "off" else f"{rate[name] / rate['off']:.2f}× off"
        answered = "" if name == "off" else f"; {cached[name]:.0%} of texts answered from a cache"
        out.append(Row(f"cache power-law workload, {words}: texts/s", f"{rate[name]:.0f} texts/s",
                       ratio, "", how + answered))  # fmt: skip
        ratio = "" if name == "off" else f"{p99[name] / p99['off']:.2f}× off"
        out.append(Row(f"cache power-law workload, {words}: p99 latency",
                       f"{p99[name] * 1000:.1f} ms", ratio, "", how))  # fmt: skip
    return out


def run(ctx: BenchContext) -> list[Row]:
    """Run the cache group and return its rows."""
    return cpu_rows(ctx) + zipf_rows(ctx)


def cpu_rows(ctx: BenchContext) -> list[Row]:
    """Return worker CPU per one-text :embed on a hit and computed, beside the floor."""
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
