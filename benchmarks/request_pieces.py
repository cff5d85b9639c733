"""What the gateway's own pieces of one one-text request cost, in process (issue 43's levers).

Each piece is timed alone in a loop (µs per call, best of 5 repeats, one core): the body's
validation (``parse_request``, and pydantic-core's ``model_validate`` inside it), the Predict
request's protobuf (``build_predict_request``), the tensors of one row (``pad_batch``), the
answer's JSON (orjson of 384 float32), and one histogram ``observe`` and one counter ``inc`` of
prometheus_client in multiprocess mode (as gunicorn workers write them). They bound what a
compiled validator, prepared TensorProtos or fewer metric writes could save per request.

Run alone: ``python -m benchmarks.request_pieces`` (prints JSON). scripts/bench.py's
``gateway_cost`` group runs it in a child process (the multiprocess metrics need their
directory set before prometheus_client is imported) and adds its rows.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEXT = "my card was charged twice for one order"


def per_call_us(fn: Callable[[], Any], number: int = 5000) -> float:
    """Return the best of 5 repeats of ``number`` calls of ``fn``, in µs per call."""
    fn()
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def measure() -> dict[str, float]:
    """Return µs per call of each piece (needs PROMETHEUS_MULTIPROC_DIR set at import)."""
    import numpy as np
    import orjson
    from prometheus_client import Counter, Histogram

    from backend.bucketing import pad_batch
    from backend.clients.grpc_client import build_predict_request
    from backend.metrics import LATENCY_BUCKETS
    from backend.schemas import ClassifyRequest, EmbedRequest, parse_request
    from backend.settings import load_settings

    settings = load_settings({})
    raw = orjson.dumps({"texts": [TEXT]})
    inputs = pad_batch([np.arange(1, 12, dtype=np.int32)], 16, 0, None)
    vectors = np.random.default_rng(0).random((1, 384), dtype=np.float32)
    answer = {"model": {"name": "minilm", "version": 1}, "dim": 384, "truncated": [False],
              "embeddings": vectors}  # fmt: skip
    histogram = Histogram("pieces_seconds", "", ["stage"], buckets=LATENCY_BUCKETS).labels("x")
    counter = Counter("pieces_total", "", ["route"]).labels("x")
    return {
        "parse_request (:embed body)": per_call_us(
            lambda: parse_request(EmbedRequest, raw, settings)
        ),
        "parse_request (:classify body)": per_call_us(
            lambda: parse_request(ClassifyRequest, raw, settings)
        ),
        "pydantic-core model_validate alone": per_call_us(
            lambda: EmbedRequest.model_validate({"texts": [TEXT]})
        ),
        "build_predict_request (1 × 16 ids)": per_call_us(
            lambda: build_predict_request("minilm", inputs, version=1, signature_name="seq_16")
        ),
        "pad_batch (1 row to 16)": per_call_us(
            lambda: pad_batch([np.arange(1, 12, dtype=np.int32)], 16, 0, None)
        ),
        "orjson answer (384 float32)": per_call_us(
            lambda: orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        ),
        "histogram observe (multiprocess)": per_call_us(lambda: histogram.observe(0.003)),
        "counter inc (multiprocess)": per_call_us(lambda: counter.inc()),
    }


def main() -> int:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        print("set PROMETHEUS_MULTIPROC_DIR to an empty directory first", file=sys.stderr)
        return 2
    print(json.dumps(measure()))
    return 0


def in_child() -> dict[str, float]:
    """Return ``measure()`` from a child process with its own multiprocess metrics directory."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="pieces-") as where:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": where}
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.request_pieces"], env=env, check=True,
            capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


if __name__ == "__main__":
    raise SystemExit(main())
