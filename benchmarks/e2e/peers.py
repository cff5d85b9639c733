"""The peer the gateway's ``:embed`` is set against: infinity on the same weights, own venv."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import requests

from benchmarks import BenchContext
from benchmarks.e2e.plan import (
    EMBED,
    INFINITY_VENV,
    MINILM_PACKAGE,
    TIMEOUT_S,
)
from ops.procs import ServerProcess, child_env, free_port


class Infinity:
    """infinity's server (``.venv-infinity``) on the demo weights, on a free port."""

    def __init__(self, ctx: BenchContext) -> None:
        import importlib.util

        spec = importlib.util.find_spec(MINILM_PACKAGE)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"{MINILM_PACKAGE} is not installed (make setup installs it)")
        self.model_dir = Path(spec.origin).parent / "model"
        binary = INFINITY_VENV / "bin" / "infinity_emb"
        if not binary.is_file():
            raise RuntimeError(f"{binary} missing: `make infinity-env` makes it")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = child_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                        INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1")  # fmt: skip
        env.pop("PYTHONPATH", None)  # its own venv only
        cmd = [str(binary), "v2", "--model-id", str(self.model_dir), "--served-model-name", EMBED,
               "--port", str(self.port), "--host", "127.0.0.1", "--engine", "torch",
               "--device", "cpu", "--batch-size", "32"]  # fmt: skip
        self.proc = ServerProcess(cmd, ctx.work_dir / "infinity.log", env, name="infinity")
        self.proc.wait_until(self._ready, 300)

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/models", timeout=2).ok
        except requests.RequestException:
            return False

    def embed(self, texts: list[str]) -> np.ndarray:
        reply = requests.post(f"{self.url}/embeddings", json={"model": EMBED, "input": texts},
                              timeout=TIMEOUT_S)  # fmt: skip
        reply.raise_for_status()
        return np.array([d["embedding"] for d in reply.json()["data"]])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


def compare_embeddings(gateway: str, infinity: Infinity, texts: list[str]) -> dict[str, Any]:
    """Return the cosine of ours and infinity's embeddings of the same tickets, and its version."""
    sample = texts[:: max(1, len(texts) // 16)][:16]
    reply = requests.post(f"{gateway}/v1/models/{EMBED}:embed", json={"texts": sample},
                          timeout=TIMEOUT_S)  # fmt: skip
    reply.raise_for_status()
    ours = np.array(reply.json()["embeddings"])
    cos = cosines(ours, infinity.embed(sample))
    version = subprocess.run(
        [str(INFINITY_VENV / "bin" / "python"), "-c",
         "import importlib.metadata as m; print(m.version('infinity-emb'))"],
        capture_output=True, text=True, timeout=60, check=False,
    ).stdout.strip() or "?"  # fmt: skip
    return {"cosine_min": float(cos.min()), "cosine_n": len(sample), "infinity_version": version}
