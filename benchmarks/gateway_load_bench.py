"""Gateway load benchmarks: CPU per request beside the model server's, throughput at saturation.

All figures come from one run: one modelserver and one gunicorn gateway (grpc upstream),
the stack ``gateway_bench`` starts, with 8-word texts (``ops.load.cells.make_texts``), and a second
stack serving a tiny 2-layer model for the CPU rows of a model that answers in ~1 ms:
- CPU per request: utime+stime (``/proc/<pid>/stat``) of the gunicorn master and its workers and
  of the model server, over a fixed number of sequential ``:classify`` requests after a warm-up,
  1 and 8 texts per request; the aim is gateway ≤ 10 % of the model server for one text;
- throughput at saturation: closed-loop clients through the gateway vs straight at the model
  server over gRPC with exactly the tensors the gateway sends (the version's own tokenizer, the
  gateway's chunking and bucket padding, the bucket's ``seq_<L>`` signature; checked first: the
  direct call must return the gateway's logits), cells alternating;
- the load generator's own CPU per request on each side (an HTTP and a gRPC client differ), and
  how much of a core it used, since on a shared host it takes CPU from the servers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import psutil
import requests

from benchmarks import BenchContext, Row, median
from benchmarks.gateway_bench import _models
from benchmarks.stack import Direct, Stack, gateway_batch
from export.hardware import usable_cores
from ops.load.cells import (
    Cell,
    CellResult,
    Sender,
    gateway_http_sender,
    grpc_sender,
    make_texts,
    run_cell,
)

WORDS = 8
TEXT_COUNTS = (1, 8)
CONCURRENCY = 16
TIMEOUT_S = 60.0
# One Python process holds one GIL: a generator near a full core is what limits the figure.
GENERATOR_BUSY_CORES = 0.8

# CPU seconds so far per process, keyed by (pid, start time) so a reused pid is a new process.
CpuSnapshot = dict[tuple[int, float], float]


def cpu_snapshot(root_pids: list[int]) -> CpuSnapshot:
    """Return utime+stime in seconds of each root process and all its descendants."""
    snapshot: CpuSnapshot = {}
    for pid in root_pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in tree:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    snapshot[(proc.pid, proc.create_time())] = times.user + times.system
            except psutil.NoSuchProcess:
                continue
    return snapshot


def cpu_delta(before: CpuSnapshot, after: CpuSnapshot) -> float:
    """Return the CPU seconds spent between two snapshots by the processes alive at the second.

    A process started in between counts from zero; one that ended in between is lost (its time
    went to a parent's children counters, which are not read).
    """
    return sum(seconds - before.get(key, 0.0) for key, seconds in after.items())


def check_same_answers(
    stack: Stack, model: str, version: int, texts: list[str], direct: Direct
) -> None:
    """Raise unless the direct call returns the logits the gateway returns for ``texts``."""
    from backend.clients.grpc_client import GrpcClient

    reply = requests.post(
        f"{stack.gateways['grpc']}/v1/models/{model}:classify",
        json={"texts": texts, "return_logits": True},
        timeout=TIMEOUT_S,
    )
    reply.raise_for_status()
    via_gateway = np.array([p["logits"] for p in reply.json()["predictions"]])
    client = GrpcClient(f"127.0.0.1:{stack.grpc_port}")
    try:
        outputs, served = client.predict(
            model, direct.inputs, version=version, timeout_s=TIMEOUT_S,
            signature_name=direct.signature,
        )  # fmt: skip
    finally:
        client.close()
    straight = np.empty_like(via_gateway)
    straight[list(direct.order)] = outputs["logits"]
    if served != version or not np.allclose(straight, via_gateway, atol=1e-4):
        raise RuntimeError(
            f"the direct batch does not reproduce the gateway's answer (v{served}): "
            f"{straight.tolist()} vs {via_gateway.tolist()}"
        )


class _Pids:
    """The process trees measured: the grpc gateway (master + workers) and the model server."""

    def __init__(self, stack: Stack) -> None:
        self.workers = len(stack.worker_pids("grpc"))
        self.gateway = [psutil.Process(stack.worker_pids("grpc")[0]).ppid()]
        self.server = [stack.server.pid]

    def snapshot(self) -> tuple[CpuSnapshot, CpuSnapshot]:
        return cpu_snapshot(self.gateway), cpu_snapshot(self.server)


def _check(send: Sender, version: int) -> None:
    ok, _, _, served, error = send()
    if not ok or served != version:
        raise RuntimeError(f"warm-up request failed or served v{served}, not v{version}: {error}")


def _cpu_rows(
    ctx: BenchContext,
    stack: Stack,
    pids: _Pids,
    model: str,
    version: int,
    texts: int,
    kind: str = "",
) -> list[Row]:
    """Return gateway and model server CPU ms per sequential request, and their ratio.

    ``kind`` names a model other than the bench's main one in the figures (no aim then).
    """
    n = 60 if ctx.quick else 300
    url = stack.gateways["grpc"]
    send = gateway_http_sender(url, model, "classify", make_texts(texts, WORDS), TIMEOUT_S)
    _check(send, version)
    for _ in range(max(5, n // 10)):
        send()
    idle_s = 0.5 if ctx.quick else 2.0
    idle_before = pids.snapshot()
    time.sleep(idle_s)
    before = pids.snapshot()
    idle = [cpu_delta(b, a) / idle_s * 1000 for b, a in zip(idle_before, before, strict=True)]
    started = time.perf_counter()
    for _ in range(n):
        ok, *_, error = send()
        if not ok:
            raise RuntimeError(f"gateway request failed: {error}")
    wall = time.perf_counter() - started
    after = pids.snapshot()
    gateway_ms, server_ms = (cpu_delta(b, a) / n * 1000 for b, a in zip(before, after, strict=True))
    plural = "s" if texts > 1 else ""
    which = f"{texts} text{plural}" + (f", {kind}" if kind else "")
    how = (
        f"{n} sequential :classify requests of {texts} {WORDS}-word text{plural} after warm-up "
        f"({model} v{version}, grpc upstream, {pids.workers} gunicorn worker(s)), one keep-alive "
        f"client; utime+stime from /proc/<pid>/stat over the same requests: gunicorn master + "
        f"worker(s) vs the model server "
        f"(all its threads); wall {wall / n * 1000:.2f} ms/request; idle rate, not subtracted: "
        f"gateway {idle[0]:.1f}, model server {idle[1]:.1f} CPU ms/s"
    )
    return [
        Row(f"gateway CPU per request ({which})", f"{gateway_ms:.2f} ms",
            f"{gateway_ms / server_ms * 100:.1f} % of model server",
            "≤ 10 %" if texts == 1 and not kind else "", how),
        Row(f"  model server CPU per request ({which})", f"{server_ms:.2f} ms",
            how="same requests, same reading"),
    ]  # fmt: skip


@dataclass(frozen=True)
class _Cell:
    """One saturation cell: the load generator's figures and the servers' CPU over its window."""

    result: CellResult
    gateway_cpu_s: float
    server_cpu_s: float

    @property
    def rps(self) -> float:
        return self.result.throughput_rps

    def cores(self, cpu_s: float) -> float:
        return cpu_s / self.result.duration_s

    def per_request_ms(self, cpu_s: float) -> float:
        return cpu_s * 1000 / max(1, self.result.requests)

    @property
    def generator_cpu_s(self) -> float:
        return self.result.client_cpu_ms * self.result.requests / 1000


def _measure(
    pids: _Pids, cell: Cell, make: Callable[[], Sender], duration_s: float, warmup_s: float
) -> _Cell:
    """Return one cell's result with the servers' CPU read at its window's edges."""
    marks: dict[str, tuple[CpuSnapshot, CpuSnapshot]] = {}

    def on_window(mark: str) -> None:
        marks[mark] = pids.snapshot()

    result = run_cell(cell, make, duration_s, warmup_s, on_window)
    if result.errors:
        raise RuntimeError(f"{cell}: {result.errors} failed requests: {result.first_error}")
    gateway_s, server_s = (
        cpu_delta(b, a) for b, a in zip(marks["start"], marks["end"], strict=True)
    )
    return _Cell(result, gateway_s, server_s)


def _saturation_rows(
    ctx: BenchContext, stack: Stack, pids: _Pids, base: Path, model: str, version: int, texts: int
) -> list[Row]:
    """Return gateway ÷ direct gRPC throughput at saturation and the generator's CPU rows."""
    text_list = make_texts(texts, WORDS)
    direct = gateway_batch(base, model, version, text_list)
    check_same_answers(stack, model, version, text_list, direct)
    url = stack.gateways["grpc"]
    # One channel for all client threads, as a real client process holds (HTTP/2 streams).
    channel = grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}")
    makers: dict[str, Callable[[], Sender]] = {
        "gateway": lambda: gateway_http_sender(url, model, "classify", text_list, TIMEOUT_S),
        "modelserver": lambda: grpc_sender(
            channel, model, direct.inputs, TIMEOUT_S, version, direct.signature
        ),
    }
    _check(makers["gateway"](), version)
    _check(makers["modelserver"](), version)
    duration_s, warmup_s = (1.5, 0.5) if ctx.quick else (5.0, 1.0)
    repeats = 1 if ctx.quick else max(3, ctx.repeats)
    runs: dict[str, list[_Cell]] = {"gateway": [], "modelserver": []}
    try:
        for repeat in range(repeats):
            order = ["gateway", "modelserver"]  # ABBA: drift over the run hits both alike
            for target in order if repeat % 2 == 0 else reversed(order):
                cell = Cell(target, "grpc", CONCURRENCY, texts, WORDS)
                runs[target].append(_measure(pids, cell, makers[target], duration_s, warmup_s))
    finally:
        channel.close()
    gw, dr = runs["gateway"], runs["modelserver"]
    g_rps, d_rps = median([c.rps for c in gw]), median([c.rps for c in dr])
    plural = "s" if texts > 1 else ""

    def cores(cells: list[_Cell], attr: str) -> float:
        return median([c.cores(getattr(c, attr)) for c in cells])

    def use(cells: list[_Cell], attr: str) -> str:
        per_request = median([c.per_request_ms(getattr(c, attr)) for c in cells])
        return f"{cores(cells, attr):.2f} ({per_request:.2f} ms/request)"

    how = (
        f"{CONCURRENCY} closed-loop clients, {texts} {WORDS}-word text{plural}/request, "
        f"{duration_s:g} s cells after {warmup_s:g} s warm-up, gateway and direct alternating "
        f"(ABBA) × {repeats}, medians; gateway: HTTP keep-alive (http.client) to gunicorn "
        f"({pids.workers} worker(s), grpc upstream); direct: grpc stub, the gateway's own batch "
        f"({direct.describe()}, {model} v{version}); CPU cores used over the cells: gateway "
        f"{use(gw, 'gateway_cpu_s')} + model server {use(gw, 'server_cpu_s')} through the "
        f"gateway vs model server {use(dr, 'server_cpu_s')} direct; {usable_cores()} cores, "
        f"shared with the generator"
    )
    g_cpu = median([c.result.client_cpu_ms for c in gw])
    d_cpu = median([c.result.client_cpu_ms for c in dr])
    g_cores, d_cores = cores(gw, "generator_cpu_s"), cores(dr, "generator_cpu_s")
    busy = [name for name, c in (("HTTP", g_cores), ("gRPC", d_cores)) if c >= GENERATOR_BUSY_CORES]
    verdict = (
        f"near a full core ({', '.join(busy)}): the generator may cap the figure"
        if busy
        else "under one core on both sides, so its GIL does not cap the figure (the CPU it does "
        "use is taken from the servers' host alike)"
    )
    gen_how = (
        f"process CPU time of the one generator process (all its threads) over each measured "
        f"window ÷ requests in it, medians; it used {g_cores:.2f} cores driving the gateway, "
        f"{d_cores:.2f} driving the model server: {verdict}"
    )
    return [
        Row(f"gateway ÷ direct gRPC throughput at saturation ({texts} text{plural})",
            f"{g_rps:.0f} vs {d_rps:.0f} req/s", f"{g_rps / d_rps * 100:.0f} %", "", how),
        Row(f"  load generator CPU per request ({texts} text{plural})",
            f"HTTP {g_cpu:.2f} ms, gRPC {d_cpu:.2f} ms", f"HTTP ÷ gRPC {g_cpu / d_cpu:.1f}×", "",
            gen_how),
    ]  # fmt: skip


def run(ctx: BenchContext) -> list[Row]:
    """Run the gateway load benchmarks and return their rows."""
    base, classify_model, _ = _models(ctx)
    print("gateway_load_bench: starting modelserver + gateways ...", flush=True)
    stack = Stack(ctx, base, [classify_model])
    try:
        version = stack.version(classify_model)
        pids = _Pids(stack)
        rows: list[Row] = []
        for texts in TEXT_COUNTS:
            print(f"gateway_load_bench: CPU per request, {texts} text(s) ...", flush=True)
            rows += _cpu_rows(ctx, stack, pids, classify_model, version, texts)
        for texts in TEXT_COUNTS:
            print(f"gateway_load_bench: saturation, {texts} text(s) ...", flush=True)
            rows += _saturation_rows(ctx, stack, pids, base, classify_model, version, texts)
    finally:
        stack.stop()
    print("gateway_load_bench: CPU per request, fast model ...", flush=True)
    return rows + _fast_model_rows(ctx)


def _fast_model_rows(ctx: BenchContext) -> list[Row]:
    """Return the one-text CPU rows against a tiny 2-layer model: the gateway's cost when the
    model answers in about a millisecond (a GPU, an early exit, a small model) — the same
    gateway code, waiting ~15× less between receiving a request and answering it."""
    from export.tiny import export_tiny_model

    base = ctx.work_dir / "fast-model"
    export_tiny_model(base, "tiny-intent", task="classify", version=1, max_seq_len=128)
    stack = Stack(ctx, base, ["tiny-intent"])
    try:
        return _cpu_rows(ctx, stack, _Pids(stack), "tiny-intent", 1, 1, kind="tiny 2-layer model")
    finally:
        stack.stop()
