"""push_model against several replicas of one model server: each reloads, labels wait for all."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import modelconfig, push
from ops.modelconfig import OpsError
from ops.procs import ServerProcess, free_port, port_open, python_cmd
from ops.server import ModelServer, replica_targets
from tests.ops.conftest import MODEL


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (["127.0.0.1:1"], ["127.0.0.1:1"]),
        (["127.0.0.1:1", "127.0.0.1:2"], ["127.0.0.1:1", "127.0.0.1:2"]),
        (["127.0.0.1:1,127.0.0.1:2", "127.0.0.1:1"], ["127.0.0.1:1", "127.0.0.1:2"]),
        (["ipv4:127.0.0.1:1,127.0.0.1:2"], ["127.0.0.1:1", "127.0.0.1:2"]),
        (["dns:///127.0.0.1:3"], ["127.0.0.1:3"]),
    ],
)
def test_server_flags_name_each_replica_once(specs: list[str], expected: list[str]) -> None:
    assert replica_targets(specs) == expected


def test_a_name_stands_for_every_address_it_resolves_to() -> None:
    assert "127.0.0.1:8500" in replica_targets(["localhost:8500"])


def test_server_flag_is_repeatable_and_defaults_to_one_local_server() -> None:
    args, _ = push.parse_args(["--name", MODEL, "--promote", "a", "b"])
    assert args.server == ["127.0.0.1:8500"]
    args, _ = push.parse_args(
        ["--name", MODEL, "--promote", "a", "b", "--server", "h:1", "--server", "h:2,h:3"]
    )
    assert args.server == ["h:1", "h:2,h:3"]


class Replicas:
    """Two modelservers reading one models.config."""

    def __init__(self, work: Path, base: Path) -> None:
        self.config = work / "models.config"
        self.base = base
        self.procs: list[tuple[ServerProcess, int]] = []
        for index in range(2):
            port = free_port()
            cmd = python_cmd(
                "-m", "modelserver", f"--port={port}", f"--model_config_file={self.config}",
                "--file_system_poll_wait_seconds=1",
                "--allow_version_labels_for_unavailable_models=true",
            )  # fmt: skip
            self.procs.append((ServerProcess(cmd, work / f"replica-{index}.log"), port))
        for proc, port in self.procs:
            proc.wait_until(lambda port=port: port_open(port), timeout_s=120)

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{port}" for _, port in self.procs]

    def push_args(self, *args: str) -> list[str]:
        return [
            "--name", MODEL, "--config", str(self.config), "--base-path", str(self.base),
            "--timeout", "60", "--server", ",".join(self.targets), *args,
        ]  # fmt: skip

    def available(self) -> list[set[int]]:
        out = []
        for target in self.targets:
            server = ModelServer(target)
            try:
                out.append({s.version for s in server.status(MODEL) if s.state == "AVAILABLE"})
            finally:
                server.close()
        return out

    def labels(self) -> dict[str, int]:
        return dict(
            modelconfig.find_model(modelconfig.load_config(self.config), MODEL).version_labels
        )


@pytest.fixture
def replicas(tiny_exports: Path, tmp_path: Path) -> Iterator[Replicas]:
    """Return two replicas serving tiny v1 (stable=1, ``specific``) from one config."""
    base = tmp_path / "models"
    shutil.copytree(tiny_exports / MODEL / "1", base / MODEL / "1")
    (tmp_path / "models.config").write_text(
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{base / MODEL}" '
        'model_platform: "tensorflow" model_version_policy { specific { versions: 1 } } '
        'version_labels { key: "stable" value: 1 } } }\n'
    )
    running = Replicas(tmp_path, base)
    try:
        yield running
    finally:
        for proc, _ in running.procs:
            proc.stop()


@pytest.mark.slow
def test_push_reloads_every_replica_and_labels_once_all_report_available(
    replicas: Replicas, tiny_exports: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = str(tiny_exports / MODEL / "2")
    push.run(*push.parse_args(replicas.push_args("--from-dir", source, "--label", "canary")))

    assert replicas.available() == [{1, 2}, {1, 2}]
    assert replicas.labels() == {"stable": 1, "canary": 2}
    out = capsys.readouterr().out
    for target in replicas.targets:  # each replica's wait is reported
        assert f"{MODEL} v2 AVAILABLE on {target}" in out


@pytest.mark.slow
def test_push_with_a_replica_down_moves_no_label_and_names_the_replica(
    replicas: Replicas, tiny_exports: Path
) -> None:
    before = replicas.labels()
    down, port = replicas.procs[1]
    down.kill(signal.SIGKILL)
    source = str(tiny_exports / MODEL / "2")

    with pytest.raises(OpsError, match=f"127.0.0.1:{port}"):
        push.run(*push.parse_args(replicas.push_args("--from-dir", source, "--label", "canary")))

    assert replicas.labels() == before
    # The live replica was put back to the config it had.
    first = ModelServer(replicas.targets[0])
    try:
        assert {s.version for s in first.status(MODEL) if s.state == "AVAILABLE"} == {1}
    finally:
        first.close()
