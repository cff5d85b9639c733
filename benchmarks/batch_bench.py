"""Batch job benchmark: the job's rows/s against the model server's best at batch 32, and the
online p99 while a job runs against the p99 when quiet.

The model server runs as the stack runs it: batching on, with serving_config's parameters (32
rows a call at most).

- the model server's best: the corpus tokenized once (outside the clock), sorted by length and
  sent as batches of 32, each padded to its longest text, straight over gRPC, two calls in flight
  (the job's ``--concurrency`` default), back to back: rows/s (batches in input order, each
  padded to its longest, beside it: what an unsorted client gets);
- the job: ``ops.batch.job.run_job`` on the same corpus as id/text rows (reading, tokenizing,
  length-sorting, bucketing, calling, writing Parquet parts and the manifest all on the clock),
  in process, the same two calls in flight, pacing off: rows/s, and the ratio (aim ≥ 0.9); and
  ``python -m ops.batch`` with default flags (its own process, the yield on, nobody else
  calling): rows/s and the ratio;
- online p99: one-text gRPC Predict calls back to back (as many as quiet), quiet, then while
  ``python -m ops.batch`` runs in its own process, starting once the job's calls run: with its
  default rule (ops/batch/pacing.py ``Yield``: no call until the model server's request count
  says it answered no one else for a second), with probes (``--yield-on probe``), with AIMD
  pacing alone (``--yield-ratio 0``) and with a cap of a quarter of the server's rows/s: the
  ratios (aim ≤ 1.3), and the job's rows/s over its whole run (online traffic stops before it
  ends).

Uses ``minilm`` (an embedder) under ctx.base_path when present, else a tiny random BERT.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from benchmarks import BenchContext, Row, percentile
from ops.procs import ServerProcess, child_env, free_port, port_open, python_cmd
from ops.stack import MONITORING_CONFIG, SERVING_CONFIG

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "rain",
    "falls",
    "on",
    "every",
    "small",
    "house",
    "near",
    "the",
    "river",
    "bank",
    "and",
    "people",
    "walk",
    "home",
    "after",
    "work",
]
BATCH = 32
IN_FLIGHT = 2
# The job's yield rules side by side: the default, then the earlier ones (ops/batch/pacing.py).
RULES = {
    "requests": [],
    "probe": ["--yield-on", "probe"],
    "aimd": ["--yield-ratio", "0", "--slow-ratio", "1.5"],
    "cap": ["--yield-ratio", "0", "--max-rows-per-s", "{cap:.1f}"],
}


def _model(ctx: BenchContext) -> tuple[Path, str]:
    """Return (model base path, name): the demo ``minilm`` or a tiny stand-in."""
    from modelformat.layout import latest_version

    if latest_version(ctx.base_path / "minilm") is not None:
        return ctx.base_path, "minilm"
    from export.tiny import export_tiny_model

    ctx.notes.append("batch_bench: no minilm under --base-path; used a tiny random BERT")
    base = ctx.work_dir / "batch-models"
    export_tiny_model(base, "tiny", task="embed", version=1, max_seq_len=128)
    return base, "tiny"


def corpus(n: int, seed: int = 0) -> list[str]:
    """Return ``n`` texts of 3 to 60 words (seeded): a corpus of mixed lengths."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 60))) for _ in range(n)]


def _served_version(gateway: Any, name: str, timeout_s: float = 300.0) -> int:
    """Return the version the model server serves once it is AVAILABLE."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            states = gateway.client.model_status(name, timeout_s=5)
            available = [s.version for s in states if s.state == "AVAILABLE"]
            if available:
                return max(available)
        except Exception:  # not up yet: the port opens before the model loads
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _server_rows_per_s(
    gateway: Any,
    name: str,
    version: int,
    texts: list[str],
    by_length: bool = True,
    bucketed: bool = False,
) -> float:
    """Return the model server's own rows/s: batches of 32 (sorted by length, else in input
    order), each padded to its longest (``bucketed``: to its length bucket, sent to that
    bucket's fixed-length signature: a few shapes, each warmed first), IN_FLIGHT at once."""
    from backend.bucketing import Chunk
    from backend.plan import chunk_inputs

    assets = gateway.assets.get(name, version)
    encoded = assets.tokenizer.encode(texts)
    order = list(range(len(encoded)))
    if by_length:
        order.sort(key=lambda i: encoded[i].ids.shape[0])
    signatures = assets.bucket_signatures if bucketed else {}
    batches = []
    for start in range(0, len(encoded), BATCH):
        members = tuple(order[start : start + BATCH])
        longest = max(encoded[i].ids.shape[0] for i in members)
        bucket = min((b for b in signatures if b >= longest), default=None)
        inputs = chunk_inputs(Chunk(members, bucket or longest), encoded,
                              assets.tokenizer.pad_id, None)  # fmt: skip
        batches.append((inputs, signatures.get(bucket) if bucket else None))
    # warm: each bucket's signature (its one shape); padded to the longest, the first batch only
    warm = {signature: inputs for inputs, signature in (batches if bucketed else batches[:1])}
    for signature, inputs in warm.items():
        gateway.client.predict(name, inputs, version=version, timeout_s=60,
                               signature_name=signature)  # fmt: skip
    queue = list(batches)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                inputs, signature = queue.pop()
            gateway.client.predict(name, inputs, version=version, timeout_s=60,
                                   signature_name=signature)  # fmt: skip

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(IN_FLIGHT)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(texts) / (time.perf_counter() - started)


def _online_p99(gateway: Any, name: str, version: int, stop: Any, n: int) -> float:
    """Return the p99 (ms) of one-text Predict calls back to back (``n`` calls, or until
    ``stop()``)."""
    from backend.bucketing import Chunk
    from backend.plan import chunk_inputs

    tokenizer = gateway.assets.get(name, version).tokenizer
    encoded = tokenizer.encode(["the quick brown fox jumps"])
    inputs = chunk_inputs(Chunk((0,), encoded[0].ids.shape[0]), encoded, tokenizer.pad_id, None)
    samples: list[float] = []
    while len(samples) < n and not stop():
        started = time.perf_counter()
        gateway.client.predict(name, inputs, version=version, timeout_s=60)
        samples.append(time.perf_counter() - started)
    return percentile(samples, 99) * 1000


def _default_job(source: Path, env: dict[str, str], out: Path, name: str) -> float:
    """Return the rows/s of ``python -m ops.batch`` with default flags, nobody else calling."""
    cmd = python_cmd("-m", "ops.batch", str(source), "--output", str(out), "--model", name)
    done = subprocess.run(cmd, env=child_env(**env), capture_output=True, text=True,
                          timeout=900, check=True)  # fmt: skip
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rows_per_s"])


def _during_job(
    gateway: Any,
    name: str,
    version: int,
    source: Path,
    env: dict[str, str],
    out: Path,
    flags: list[str],
    n: int,
) -> tuple[float, float]:
    """Return (online p99 ms, the job's rows/s) while ``python -m ops.batch`` runs with
    ``flags`` in its own process."""
    cmd = python_cmd("-m", "ops.batch", str(source), "--output", str(out), "--model", name,
                     "--max-batch", "64", *flags)  # fmt: skip
    proc = subprocess.Popen(cmd, env=child_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    time.sleep(3.0)  # past the job's start-up: its calls are running
    p99 = _online_p99(gateway, name, version, lambda: proc.poll() is not None, n)
    stdout, _ = proc.communicate(timeout=900)
    return p99, float(json.loads(stdout.strip().splitlines()[-1])["rows_per_s"])


def run(ctx: BenchContext) -> list[Row]:
    from backend.service import Gateway
    from backend.settings import load_settings
    from ops.batch.job import JobSpec, run_job
    from ops.batch.pacing import Pacer

    base, name = _model(ctx)
    grpc_port, rest_port = free_port(), free_port()
    cmd = python_cmd("-m", "modelserver", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
                     f"--model_name={name}", f"--model_base_path={base / name}",
                     f"--monitoring_config_file={MONITORING_CONFIG}", "--enable_batching=true",
                     f"--batching_parameters_file={SERVING_CONFIG / 'batching_parameters.txt'}",
                     )  # fmt: skip
    server = ServerProcess(cmd, ctx.work_dir / f"batch-ms-{grpc_port}.log", env=child_env())
    n = 512 if ctx.quick else 2048
    texts = corpus(n)
    source = ctx.work_dir / "batch-corpus.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": str(i), "text": t}) + b"\n"
                                for i, t in enumerate(texts)))  # fmt: skip
    env = {"GATEWAY_TFS_GRPC": f"127.0.0.1:{grpc_port}", "GATEWAY_MODEL_BASE_PATH": str(base),
           "GATEWAY_TFS_REST": f"http://127.0.0.1:{rest_port}"}  # fmt: skip
    settings = load_settings({"max_concurrent_chunks": IN_FLIGHT,
                              "group_in_flight": 0, "request_timeout_s": 120,
                              "max_request_rows": 1 << 30, "max_request_tokens": 1 << 40},
                             environ=env)  # fmt: skip
    try:
        server.wait_until(lambda: port_open(grpc_port), timeout_s=180)
        gateway = Gateway(settings)
        try:
            version = _served_version(gateway, name)
            padded = max(_server_rows_per_s(gateway, name, version, texts) for _ in range(2))
            bucketed = max(_server_rows_per_s(gateway, name, version, texts, bucketed=True)
                           for _ in range(2))  # fmt: skip
            own = max(padded, bucketed)  # the model server's best
            unsorted = max(_server_rows_per_s(gateway, name, version, texts, by_length=False)
                           for _ in range(2))  # fmt: skip
            job = max(
                run_job(JobSpec(source, ctx.work_dir / f"batch-out-{i}", model=name,
                                pacer=Pacer(slow_ratio=float("inf"))),
                        settings, open(os.devnull, "w")).as_dict()["rows_per_s"]  # noqa: SIM115
                for i in range(2)
            )  # fmt: skip
            default = _default_job(source, env, ctx.work_dir / "batch-default", name)
            calls = 300 if ctx.quick else 1000
            quiet = _online_p99(gateway, name, version, lambda: False, calls)
            busy = {}
            for rule, flags in RULES.items():
                flags = [f.format(cap=own / 4) for f in flags]
                busy[rule] = _during_job(gateway, name, version, source, env, ctx.work_dir / rule,
                                         flags, calls)  # fmt: skip
        finally:
            gateway.close()
    finally:
        server.stop()
    how = f"{name}, {n} texts of 3-60 words, {IN_FLIGHT} calls in flight, {ctx.cpu.describe()}"
    return [
        Row("model server's best rows/s (batch 32, sorted by length)", f"{own:.0f}", how=how),
        Row(
            "  sorted, each batch padded to its longest",
            f"{padded:.0f}",
            f"{padded / own:.2f}x",
            how=how,
        ),
        Row(
            "  sorted, each batch padded to its length bucket's signature",
            f"{bucketed:.0f}",
            f"{bucketed / own:.2f}x",
            how=how,
        ),
        Row(
            "model server's rows/s (batch 32, input order)",
            f"{unsorted:.0f}",
            f"{unsorted / own:.2f}x",
            how=how,
        ),
        Row(
            "batch job rows/s (ops.batch, in process, no pacing)",
            f"{job:.0f}",
            f"{job / own:.2f}x",
            "≥ 0.9x",
            how,
        ),
        Row(
            "batch job rows/s (python -m ops.batch, default flags)",
            f"{default:.0f}",
            f"{default / own:.2f}x",
            "≥ 0.9x",
            how + ", its own process, nobody else calling",
        ),
        Row("online p99, quiet (ms)", f"{quiet:.1f}", how="one-text gRPC Predict, back to back"),
        *(
            Row(
                f"online p99 during a batch job, {rule} (ms)",
                f"{p99:.1f}",
                f"{p99 / quiet:.2f}x",
                "≤ 1.3x",
                f"python -m ops.batch in its own process ({what}), job at {rate:.0f} rows/s",
            )
            for rule, what in (
                ("requests", "no call until the server answered no one else for 1 s, the default"),
                ("probe", "--yield-on probe: a probe before each call"),
                ("aimd", "--yield-ratio 0 --slow-ratio 1.5: AIMD pacing alone"),
                ("cap", f"--max-rows-per-s {own / 4:.1f}: a quarter of the server's"),
            )
            for p99, rate in [busy[rule]]
        ),
    ]
