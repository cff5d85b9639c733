"""Fixtures for the ops suite: tiny exported versions and a real model server on free ports."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ops.procs import ServerProcess, free_port, port_open, python_cmd
from tests.once import built_once

MODEL = "tiny"


@pytest.fixture(scope="session")
def tiny_exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a base path holding ``tiny/1`` and ``tiny/2`` (classify, different seeds)."""
    from export.tiny import export_tiny_model

    def build(base: Path) -> None:
        for version, seed in ((1, 0), (2, 1)):
            export_tiny_model(base, MODEL, task="classify", version=version, seed=seed)

    return built_once(tmp_path_factory, "exports", build)


@dataclass
class OpsServer:
    """A running model server, the config file it reads and the base path it polls."""

    proc: ServerProcess
    grpc_port: int
    rest_port: int
    config: Path
    base_path: Path

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def push_args(self, *args: str) -> list[str]:
        """Return push_model arguments aimed at this server."""
        return [
            "--name", MODEL, "--config", str(self.config), "--base-path", str(self.base_path),
            "--server", self.grpc_target, "--timeout", "60", *args,
        ]  # fmt: skip


def start_ops_server(work: Path, base: Path, config_text: str) -> OpsServer:
    """Write ``config_text`` and start ``python -m modelserver`` on it; return once it listens."""
    config = work / "models.config"
    config.write_text(config_text)
    grpc_port, rest_port = free_port(), free_port()
    proc = ServerProcess(
        python_cmd(
            "-m", "modelserver", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
            f"--model_config_file={config}", "--file_system_poll_wait_seconds=1",
            "--allow_version_labels_for_unavailable_models=true",
        ),
        work / "modelserver.log",
    )  # fmt: skip
    try:
        proc.wait_until(lambda: port_open(grpc_port) and port_open(rest_port), timeout_s=120)
    except BaseException:
        proc.stop()
        raise
    return OpsServer(proc, grpc_port, rest_port, config, base)


def serve_tiny_versions(
    tiny_exports: Path,
    work: Path,
    versions: dict[int, str],
    policy: str,
    also: tuple[int, ...] = (),
) -> Iterator[OpsServer]:
    """Serve copies of tiny ``versions`` (version -> label) and ``also`` (no label) under
    ``policy``; stop it after."""
    base = work / "models"
    for version in [*versions, *also]:
        shutil.copytree(tiny_exports / MODEL / str(version), base / MODEL / str(version))
    labels = " ".join(
        f'version_labels {{ key: "{label}" value: {version} }}'
        for version, label in versions.items()
    )
    server = start_ops_server(
        work,
        base,
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{base / MODEL}" '
        f'model_platform: "tensorflow" model_version_policy {{ {policy} }} {labels} }} }}\n',
    )
    try:
        yield server
    finally:
        server.proc.stop()


@pytest.fixture(scope="module")
def ops_server(tiny_exports: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsServer]:
    """Start ``python -m modelserver`` on tiny v1 with stable=1 under a ``specific`` policy."""
    yield from serve_tiny_versions(
        tiny_exports, tmp_path_factory.mktemp("ops-server"), {1: "stable"},
        "specific { versions: 1 }",
    )  # fmt: skip


@pytest.fixture(scope="module")
def two_versions_server(
    tiny_exports: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpsServer]:
    """Start ``python -m modelserver`` on tiny v1 + v2: ``specific`` 1, 2; stable=1, canary=2."""
    yield from serve_tiny_versions(
        tiny_exports, tmp_path_factory.mktemp("two-versions"), {1: "stable", 2: "canary"},
        "specific { versions: 1 versions: 2 }",
    )  # fmt: skip


@pytest.fixture(scope="session")
def embed_exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a base path of tiny embedders: ``tiny/1`` (seed 0), ``tiny/2`` (seed 1: another
    vector space) and ``tiny/3`` (seed 0 in bf16: v1's space at another precision)."""
    from export.tiny import export_tiny_model

    def build(base: Path) -> None:
        for version, seed, precision in ((1, 0, "fp32"), (2, 1, "fp32"), (3, 0, "bf16")):
            export_tiny_model(base, MODEL, task="embed", version=version, seed=seed,
                              precision=precision, warmup=False)  # fmt: skip

    return built_once(tmp_path_factory, "embed-exports", build)


@pytest.fixture(scope="module")
def embed_server(
    embed_exports: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpsServer]:
    """Start ``python -m modelserver`` on the tiny embedders v1, v2, v3 with stable=1."""
    yield from serve_tiny_versions(
        embed_exports, tmp_path_factory.mktemp("embed-server"), {1: "stable"},
        "specific { versions: 1 versions: 2 versions: 3 }", also=(2, 3),
    )  # fmt: skip


def rotation_fixing(row: Any, seed: int) -> Any:
    """Return a random orthogonal matrix Q with ``row @ Q == row``: it turns every other
    direction (a version's token vectors turned, its [CLS] row and any x . w kept)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    dim = row.shape[0]
    basis = np.linalg.qr(np.column_stack([row, rng.normal(size=(dim, dim - 1))]))[0]
    along, rest = basis[:, :1], basis[:, 1:]
    turn = np.linalg.qr(rng.normal(size=(dim - 1, dim - 1)))[0]
    return (along @ along.T + rest @ turn @ rest.T).astype(np.float32)


@pytest.fixture(scope="session")
def retrieval_exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a base path of tiny retrieval versions (tests/backend/retrieval_models.py's table
    graphs): ``tiny-m3`` v1, v2 (only its sparse head changed), v3 (only its token vectors
    turned: dense and sparse outputs the same), v4 (v1 again: a re-export); ``tiny-splade`` and
    ``tiny-colbert`` v1 and v2 (another table: another space)."""
    from tests.backend import retrieval_models as rm

    def build(base: Path) -> None:
        made = rm.write_versions(base)

        def again(name: str, version: int, weights: Any, sparse_w: Any) -> None:
            target = base / name / str(version)
            shutil.copytree(base / name / "1", target)
            if weights is not None:
                rm._save_graph(target, weights, sparse_w, made[name]["outputs"])

        m3 = made[rm.M3]
        again(rm.M3, 2, m3["table"], rm.table(99, m3["vocab_size"])[1])
        turn = rotation_fixing(m3["table"][rm.CLS_ID], seed=98)
        again(rm.M3, 3, m3["table"] @ turn, turn.T @ m3["sparse"])
        again(rm.M3, 4, None, None)
        for name, seed in ((rm.SPLADE, 97), (rm.COLBERT, 96)):
            again(name, 2, *rm.table(seed, made[name]["vocab_size"]))

    return built_once(tmp_path_factory, "retrieval-space-exports", build)
