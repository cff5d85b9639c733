"""What the gateway benchmarks share: a stack on free ports, a thin HTTP client, interleaved
timing, and the batches the gateway sends upstream (to send the same tensors straight to the
model server: "gateway vs direct", docs/architecture.md "Performance model").

Used by gateway_bench, gateway_load_bench and heads_bench.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import requests

from benchmarks import BenchContext
from ops.procs import REPO, ServerProcess, child_env, free_port, http_ok, python_cmd


def write_config(base: Path, models: list[str], path: Path) -> Path:
    """Write a ModelServerConfig serving the newest version of each model; return its path."""
    entries = "".join(
        f'  config {{ name: "{m}" base_path: "{base / m}" model_platform: "tensorflow" }}\n'
        for m in models
    )
    path.write_text(f"model_config_list {{\n{entries}}}\n", encoding="utf-8")
    return path


class Stack:
    """A modelserver and gunicorn gateways (one per upstream: grpc, rest) on free ports."""

    def __init__(
        self,
        ctx: BenchContext,
        base: Path,
        models: list[str],
        upstreams: Sequence[str] = ("grpc", "rest"),
        load_timeout_s: float = 300,
        settings: dict[str, str] | None = None,
    ) -> None:
        config = write_config(base, models, ctx.work_dir / "gateway-bench.config")
        self.grpc_port, self.rest_port = free_port(), free_port()
        self.processes: list[ServerProcess] = []
        self.server = self._spawn(
            ctx,
            "modelserver",
            python_cmd("-m", "modelserver", f"--port={self.grpc_port}",
                       f"--rest_api_port={self.rest_port}", f"--model_config_file={config}"),
            child_env(),
        )  # fmt: skip
        self.rest_url = f"http://127.0.0.1:{self.rest_port}"
        for model in models:
            self.server.wait_until(lambda m=model: self._available(m) is not None, load_timeout_s)
        self.base = base
        self.gateways: dict[str, str] = {}
        for upstream in upstreams:
            self.gateways[upstream] = self.add_gateway(ctx, upstream, upstream, settings=settings)

    def add_gateway(
        self,
        ctx: BenchContext,
        name: str,
        upstream: str = "grpc",
        *,
        workers: int = 1,
        settings: dict[str, str] | None = None,
    ) -> str:
        """Start a gunicorn gateway of ``workers`` workers on this model server (its log
        ``gateway-NAME.log``) and return its URL once it answers."""
        port = free_port()
        env = child_env(**{
            "GATEWAY_UPSTREAM": upstream,
            "GATEWAY_TFS_GRPC": f"127.0.0.1:{self.grpc_port}",
            "GATEWAY_TFS_REST": self.rest_url,
            "GATEWAY_MODEL_BASE_PATH": str(self.base),
            "GATEWAY_BIND": f"127.0.0.1:{port}",
            "GATEWAY_WORKERS": str(workers),
            "GATEWAY_THREADS": "4",
            "GATEWAY_ACCESS_LOG": "",  # logging every request is not what we measure
            **(settings or {}),  # ``settings`` may set any of these too
        })  # fmt: skip
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        cmd = python_cmd("-m", "gunicorn", "-c", str(REPO / "docker" / "gunicorn.conf.py"),
                         "backend.app:create_app()")  # fmt: skip
        proc = self._spawn(ctx, f"gateway-{name}", cmd, env)
        url = f"http://127.0.0.1:{port}"
        proc.wait_until(lambda: http_ok(f"{url}/healthz"), 60)
        return url

    def _spawn(self, ctx: BenchContext, name: str, cmd: list[str], env: dict[str, str]) -> Any:
        proc = ServerProcess(cmd, ctx.work_dir / f"{name}.log", env=env)
        self.processes.append(proc)
        return proc

    def _available(self, model: str) -> int | None:
        try:
            reply = requests.get(f"{self.rest_url}/v1/models/{model}", timeout=2).json()
        except (requests.RequestException, ValueError):
            return None
        versions = [
            int(s["version"])
            for s in reply.get("model_version_status", [])
            if s["state"] == "AVAILABLE"
        ]
        return max(versions) if versions else None

    def version(self, model: str) -> int:
        found = self._available(model)
        assert found is not None
        return found

    def worker_pids(self, upstream: str) -> list[int]:
        proc = self.processes[1 + list(self.gateways).index(upstream)]
        return [child.pid for child in psutil.Process(proc.proc.pid).children()]

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()


def interleaved(
    calls: Sequence[Callable[[], object]], n: int, warmup: int | None = None
) -> list[list[float]]:
    """Return each call's wall times, the calls taken in turn so all see the same noise, after
    ``warmup`` untimed rounds (default: a tenth of ``n``, at least 5)."""
    for _ in range(max(5, n // 10) if warmup is None else warmup):  # connections, caches, model
        for call in calls:
            call()
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(n):
        for call, samples in zip(calls, times, strict=True):
            started = time.perf_counter()
            call()
            samples.append(time.perf_counter() - started)
    return times


@dataclass(frozen=True)
class Direct:
    """What the gateway sends upstream for some texts: its batch and the signature it calls."""

    inputs: dict[str, np.ndarray]
    signature: str | None
    order: tuple[int, ...]  # the batch's rows by index into the texts (the gateway sorts them)

    def describe(self) -> str:
        shape = "×".join(str(d) for d in self.inputs["input_ids"].shape)
        return f"[{shape}] int32 ×{len(self.inputs)} → {self.signature or 'serving_default'}"


def gateway_batches(
    base: Path, model: str, version: int, encode: Callable[[Any], list[Any]]
) -> list[Direct]:
    """Return every batch the gateway sends for what ``encode(assets)`` makes of a request
    (its ``Encoded`` rows: texts, sentence pairs, tag windows), in the gateway's chunk order,
    built with the gateway's own code (settings, bucketing, padding, signatures)."""
    from backend.bucketing import pad_batch, plan_chunks
    from backend.settings import load_settings
    from backend.versions import load_assets

    settings = load_settings(environ=child_env())  # what the stack's gateways read
    assets = load_assets(base, model, version)
    encoded = encode(assets)
    chunks = plan_chunks(
        [int(e.ids.shape[0]) for e in encoded],
        settings.max_batch_size,
        assets.max_seq_len,
        bucketing=settings.bucketing,
        bucket_lens=sorted(assets.bucket_signatures) or None,
    )
    out = []
    for chunk in chunks:
        rows = [encoded[i] for i in chunk.indices]
        paired = any(e.type_ids is not None for e in rows)  # as the gateway's _run_chunks
        types = [e.type_ids for e in rows] if paired else None
        inputs = pad_batch([e.ids for e in rows], chunk.seq_len, assets.tokenizer.pad_id, types)
        signature = assets.bucket_signatures.get(chunk.seq_len) if settings.bucketing else None
        out.append(Direct(inputs, signature, chunk.indices))
    return out


def gateway_batch(base: Path, model: str, version: int, texts: list[str]) -> Direct:
    """Return the one batch the gateway sends for ``texts`` (ValueError if it sends more)."""
    batches = gateway_batches(base, model, version, lambda assets: assets.tokenizer.encode(texts))
    if len(batches) != 1:
        raise ValueError(f"{len(texts)} texts make {len(batches)} upstream calls; expected one")
    return batches[0]


class Http:
    """One keep-alive HTTP/1.1 connection (http.client: far less client time than requests)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionError):
            # The server closed an idle keep-alive connection (gunicorn: after 5 s): reconnect.
            self.conn.close()
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
        return data
