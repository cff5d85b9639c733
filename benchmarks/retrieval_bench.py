"""Hybrid retrieval through the gateway: what sparse and multi-vector outputs cost beside dense.

One BGE-M3-shaped model (a random checkpoint in FlagEmbedding's layout, export/tiny_retrieval.py
``save_m3_checkpoint``: MiniLM-L6's dims, or the tests' tiny one under --quick), exported by
export.build and served by the model server behind a gunicorn gateway (one worker) per upstream.
``:embed`` of the same batch of texts asking for dense alone, sparse alone and all three outputs
(the vectors as JSON floats, the default; as base64 of their float32 bytes, ``encoding_format``;
and the multi-vectors as int8 in base64), interleaved request by request: end-to-end wall time
and the gateway worker's CPU (psutil, as gateway_cost_bench reads it) per text, each as a ratio
to dense alone; answer bytes per text.
Then SPLADE's top-k in the graph against the pooled vocabulary vector (splade_bench.compare).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks import BenchContext, Row, median
from benchmarks.gateway_cost_bench import worker_cpu_s
from benchmarks.stack import Http, Stack

MODEL = "bge-m3-bench"
MINILM = {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536,
          "num_hidden_layers": 6, "max_position_embeddings": 130,
          "initializer_range": 0.1}  # fmt: skip
MAX_SEQ_LEN = 128
ALL = ["dense", "sparse", "multivector"]
# each output set's :embed fields; "all three" answers its vectors as JSON floats (the default),
# "all three b64" as base64 of their float32 bytes (encoding_format), "all three int8 b64" its
# multi-vectors as int8 (embedding_types) in base64
MODES: dict[str, dict[str, object]] = {
    "dense": {"outputs": ["dense"]}, "sparse": {"outputs": ["sparse"]},
    "all three": {"outputs": ALL},
    "all three b64": {"outputs": ALL, "encoding_format": "base64"},
    "all three int8 b64": {"outputs": ALL, "encoding_format": "base64",
                           "embedding_types": ["int8"]},
}  # fmt: skip
TEXTS = [
    "where is my order? it is three days late and nobody answers my emails.",
    "my card was charged twice for the same subscription, please refund one of them",
    "how do I reset my password when the reset link has already expired",
    "the quick brown fox jumps over the lazy dog near the river bank",
    "cancel my subscription today and confirm it by email",
    "the app crashes every time I open the settings page on my phone",
    "change the delivery address of an order that has not shipped yet",
    "my invoice shows the wrong amount and the wrong tax rate",
]  # fmt: skip


def export_model(ctx: BenchContext) -> tuple[Path, str]:
    """Return (a base path holding MODEL exported, what it is) built from a random checkpoint."""
    from export.build import build
    from export.tiny_retrieval import save_m3_checkpoint

    base = ctx.work_dir / "retrieval-models"
    size = None if ctx.quick else MINILM
    colbert_dim = 16 if ctx.quick else int(MINILM["hidden_size"])  # BGE-M3's own: its hidden size
    checkpoint = save_m3_checkpoint(ctx.work_dir / "retrieval-m3", size=size,
                                    colbert_dim=colbert_dim)  # fmt: skip
    build(checkpoint, MODEL, base, version=1, task="embed", max_seq_len=MAX_SEQ_LEN,
          warmup=False)  # fmt: skip
    what = ("tiny random BGE-M3 layout (hidden 32, 2 layers)" if ctx.quick else
            "random BGE-M3 layout at MiniLM-L6's dims (hidden 384, 6 layers, 12 heads; the "
            "tests' tiny xlm-roberta tokenizer)")  # fmt: skip
    return base, what + f", colbert dim {colbert_dim}, fp32"


def measure(url: str, pid: int, n: int) -> dict[str, dict[str, float]]:
    """Return per mode the median wall ms, the worker's CPU ms per text and the answer bytes per
    text of ``n`` :embed calls of TEXTS per mode, the modes interleaved call by call."""
    http = Http(url)
    bodies = {m: json.dumps({"texts": TEXTS, **o}).encode() for m, o in MODES.items()}
    path = f"/v1/models/{MODEL}:embed"
    for body in bodies.values():  # warm: tokenizer, channels, each signature
        for _ in range(3):
            http.call("POST", path, body)
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu = dict.fromkeys(MODES, 0.0)
    size = dict.fromkeys(MODES, 0)
    for _ in range(n):
        for mode, body in bodies.items():
            before, started = worker_cpu_s(pid), time.perf_counter()
            answer = http.call("POST", path, body)
            wall[mode].append(time.perf_counter() - started)
            cpu[mode] += worker_cpu_s(pid) - before
            size[mode] = len(answer)
    per = len(TEXTS)
    return {m: {"wall_ms": 1e3 * median(wall[m]) / per, "cpu_ms": 1e3 * cpu[m] / n / per,
                "bytes": size[m] / per} for m in MODES}  # fmt: skip


def run(ctx: BenchContext) -> list[Row]:
    """Return the rows: per upstream, time, worker CPU and bytes per text of sparse and all three
    outputs against dense alone; then SPLADE's top-k against the pooled vector."""
    from benchmarks import splade_bench

    base, what = export_model(ctx)
    n = 10 if ctx.quick else 20 * ctx.repeats
    rows: list[Row] = []
    stack = Stack(ctx, base, [MODEL], upstreams=("grpc", "rest"), load_timeout_s=600)
    try:
        results = {up: measure(url, stack.worker_pids(up)[0], n)
                   for up, url in stack.gateways.items()}  # fmt: skip
    finally:
        stack.stop()
    how = (f"{what}; :embed of {len(TEXTS)} texts (~20 tokens) per call, {n} calls per output "
           "set interleaved; one gunicorn worker; wall: median per call / texts; CPU: the "
           "worker's utime+stime (psutil) over all calls / texts")  # fmt: skip
    what = ("dense / sparse / all three as float JSON / all three base64 / all three, "
            "multi-vectors int8, base64")  # fmt: skip
    for upstream, r in results.items():
        rows += [
            Row(f"BGE-M3 :embed time per text, {what} ({upstream})", _figures(r, "wall_ms", "ms"),
                _ratios(r, "wall_ms"), "all three ≤ 1.25× dense", how),
            Row(f"BGE-M3 :embed gateway CPU per text, {what} ({upstream})",
                _figures(r, "cpu_ms", "ms"), _ratios(r, "cpu_ms"), "sparse ≤ 1.3× dense", how),
            Row(f"BGE-M3 :embed answer bytes per text, {what} ({upstream})",
                _figures(r, "bytes", "B", 0), _ratios(r, "bytes"), "", how),
        ]  # fmt: skip
    rows += splade_bench.run(ctx)[:2]
    return rows


def _figures(r: dict[str, dict[str, float]], key: str, unit: str, digits: int = 2) -> str:
    """Return each mode's ``key`` figure, in MODES' order."""
    return " / ".join(f"{r[m][key]:.{digits}f}" for m in MODES) + f" {unit}"


def _ratios(r: dict[str, dict[str, float]], key: str) -> str:
    """Return sparse's and each all-three mode's ``key`` figure as a ratio to dense alone ("n/a"
    where dense's is 0: a quick run's CPU can fall under the clock's 10 ms tick)."""
    d = r["dense"][key]

    def ratio(mode: str) -> str:
        return f"{r[mode][key] / d:.2f}×" if d > 0 else "n/a"

    return (f"sparse {ratio('sparse')}, all three {ratio('all three')} (float JSON), "
            f"{ratio('all three b64')} (base64), {ratio('all three int8 b64')} (int8 base64) "
            "dense")  # fmt: skip
