"""push_model against several replicas of one model server: each reloads, labels wait for all."""

from __future__ import annotations

import functools
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import backend.clients.endpoints as endpoints
from ops import modelconfig
from ops.lifecycle import push
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


V1_ONLY = "specific { versions: 1 }"


def config_text(base: Path, policy: str) -> str:
    """Return a models.config of tiny (stable=1) under ``base`` with ``policy``."""
    return (
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{base / MODEL}" '
        f'model_platform: "tensorflow" model_version_policy {{ {policy} }} '
        'version_labels { key: "stable" value: 1 } } }\n'
    )


class Replicas:
    """Model servers reading one models.config (no config poll: only reloads change them)."""

    def __init__(self, config: Path, base: Path, procs: list[tuple[ServerProcess, int]]) -> None:
        self.config = config
        self.base = base
        self.procs = procs

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{port}" for _, port in self.procs]

    def push_args(self, *args: str, server: str = "") -> list[str]:
        return [
            "--name", MODEL, "--config", str(self.config), "--base-path", str(self.base),
            "--timeout", "60", "--reader-wait", "0", "--server", server or ",".join(self.targets),
            *args,
        ]  # fmt: skip

    def available(self, targets: list[str] | None = None) -> list[set[int]]:
        out = []
        for target in targets or self.targets:
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

    def published(self) -> list[str]:
        return sorted(p.name for p in (self.base / MODEL).iterdir())


class ReplicaPool:
    """The module's model servers, started once and handed to each test as replicas that serve
    tiny v1 alone (stable=1), as freshly started ones would: a server start costs seconds of CPU.

    Before each test every live server is reloaded with the v1-only config and waited on until
    v1 is all it serves, then the versions a test published are removed from disk; a server a
    test killed is started again (on that config), as is one more when a test needs more.
    """

    def __init__(self, tiny_exports: Path, work: Path) -> None:
        self.work = work
        self.base = work / "models"
        shutil.copytree(tiny_exports / MODEL / "1", self.base / MODEL / "1")
        self.start_config = work / "start.config"
        self.start_config.write_text(config_text(self.base, V1_ONLY))
        self.procs: list[tuple[ServerProcess, int]] = []

    def _start(self, index: int) -> tuple[ServerProcess, int]:
        port = free_port()
        cmd = python_cmd(
            "-m", "modelserver", f"--port={port}", f"--model_config_file={self.start_config}",
            "--file_system_poll_wait_seconds=1",
            "--allow_version_labels_for_unavailable_models=true",
        )  # fmt: skip
        return ServerProcess(cmd, self.work / f"replica-{index}-{port}.log"), port

    def take(self, work: Path, count: int, policy: str) -> Replicas:
        """Return ``count`` replicas serving tiny v1 under ``policy`` (work/models.config)."""
        fresh = []
        for index, (proc, _) in enumerate(self.procs):
            if proc.proc.poll() is not None:  # a test killed it
                proc.stop()
                self.procs[index] = self._start(index)
                fresh.append(index)
        while len(self.procs) < count:
            self.procs.append(self._start(len(self.procs)))
            fresh.append(len(self.procs) - 1)
        for proc, port in self.procs:
            proc.wait_until(functools.partial(port_open, port), timeout_s=120)
        v1_only = modelconfig.load_config(self.start_config)
        for index, (proc, port) in enumerate(self.procs):
            if index not in fresh:
                self._reset(proc, f"127.0.0.1:{port}", v1_only)
        for version in (self.base / MODEL).iterdir():
            if version.name != "1":
                shutil.rmtree(version)
        config = work / "models.config"
        config.write_text(config_text(self.base, policy))
        replicas = Replicas(config, self.base, self.procs[:count])
        if policy != V1_ONLY:
            wanted = modelconfig.load_config(config)
            for target in replicas.targets:
                _reload(target, wanted)
        return replicas

    def _reset(self, proc: ServerProcess, target: str, config: object) -> None:
        """Reload ``config`` (v1 only) at ``target``; return once v1 is all it serves."""
        _reload(target, config)
        server = ModelServer(target)
        try:
            proc.wait_until(
                lambda: {(s.version, s.state) for s in server.status(MODEL)
                         if s.state != "END"} == {(1, "AVAILABLE")},
                timeout_s=60,
            )  # fmt: skip
        finally:
            server.close()

    def stop(self) -> None:
        for proc, _ in self.procs:
            proc.stop()


def _reload(target: str, config: object) -> None:
    server = ModelServer(target)
    try:
        server.reload(config)
    finally:
        server.close()


@pytest.fixture(scope="module")
def pool(tiny_exports: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaPool]:
    """Return the module's model servers (stopped after its last test)."""
    servers = ReplicaPool(tiny_exports, tmp_path_factory.mktemp("replica-pool"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def replicas(pool: ReplicaPool, tmp_path: Path) -> Replicas:
    """Return two replicas serving tiny v1 (stable=1, ``specific``) from one config."""
    return pool.take(tmp_path, 2, V1_ONLY)


@pytest.fixture
def three_replicas(pool: ReplicaPool, tmp_path: Path) -> Replicas:
    """Return three replicas serving tiny v1 (stable=1, ``specific``) from one config."""
    return pool.take(tmp_path, 3, V1_ONLY)


@pytest.fixture
def latest_replicas(pool: ReplicaPool, tmp_path: Path) -> Replicas:
    """Return two replicas serving tiny v1 (stable=1) under ``latest { num_versions: 2 }``."""
    return pool.take(tmp_path, 2, "latest { num_versions: 2 }")


# What a headless Service's DNS answer does while the autoscaler works: a name whose addresses
# change between two look-ups. It cannot be made for real here (every replica is 127.0.0.1 on
# its own port), so the one resolver call push_model makes answers from a list the test changes.
DNS_NAME = "dns:///tf-serving-headless.test:8500"


class ChangingDns:
    """``endpoints.resolve`` for DNS_NAME: ``before`` until the new version is on disk, then
    ``after`` from the ``on_call``-th look-up after that (calling ``then`` once, at the switch)."""

    def __init__(
        self,
        replicas: Replicas,
        before: list[str],
        after: list[str],
        on_call: int,
        then: Callable[[], None] = lambda: None,
    ) -> None:
        self.replicas, self.before, self.after = replicas, before, after
        self.on_call, self.then = on_call, then
        self.calls_after_publish = 0
        self.real = endpoints.resolve

    def __call__(self, target: str) -> list[str]:
        if target != DNS_NAME:
            return self.real(target)
        if not (self.replicas.base / MODEL / "2").exists():
            return self.before
        self.calls_after_publish += 1
        if self.calls_after_publish == self.on_call:
            self.then()
        return self.after if self.calls_after_publish >= self.on_call else self.before


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
def test_a_replica_down_at_start_stops_the_push_before_anything_is_published(
    replicas: Replicas, tiny_exports: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = replicas.config.read_bytes()
    down, port = replicas.procs[1]
    down.kill(signal.SIGKILL)
    source = str(tiny_exports / MODEL / "2")

    assert push.main(replicas.push_args("--from-dir", source, "--label", "canary")) == 1

    err = capsys.readouterr().err
    assert f"replica down: 127.0.0.1:{port}" in err and "nothing was published" in err
    assert replicas.published() == ["1"]  # no new version directory
    assert replicas.config.read_bytes() == before  # config unchanged
    assert replicas.available(replicas.targets[:1]) == [{1}]


@pytest.mark.slow
def test_a_replica_that_joins_mid_wait_gets_the_config_and_is_waited_on(
    three_replicas: Replicas,
    tiny_exports: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first_two, joiner = three_replicas.targets[:2], three_replicas.targets[2]
    # The third look-up after publishing is the wait's first poll (1: the load write's reload).
    dns = ChangingDns(three_replicas, first_two, three_replicas.targets, on_call=2)
    monkeypatch.setattr(endpoints, "resolve", dns)
    source = str(tiny_exports / MODEL / "2")

    assert push.main(three_replicas.push_args("--from-dir", source, "--label", "canary",
                                              server=DNS_NAME)) == 0  # fmt: skip

    out = capsys.readouterr().out
    assert f"replica {joiner} joined the set" in out
    assert f"{MODEL} v2 AVAILABLE on {joiner}" in out
    # It was started with v1 only and polls no config: only the push's reload loads v2 there.
    assert three_replicas.available() == [{1, 2}, {1, 2}, {1, 2}]
    assert three_replicas.labels() == {"stable": 1, "canary": 2}


@pytest.mark.slow
@pytest.mark.parametrize("on_call", [1, 2], ids=["before-the-load-reload", "mid-wait"])
def test_a_replica_removed_mid_push_is_not_waited_for_and_the_push_succeeds(
    replicas: Replicas,
    tiny_exports: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    on_call: int,
) -> None:
    stays, (removed, removed_port) = replicas.targets[0], replicas.procs[1]
    dns = ChangingDns(
        replicas, replicas.targets, [stays], on_call, then=lambda: removed.kill(signal.SIGKILL)
    )
    monkeypatch.setattr(endpoints, "resolve", dns)
    source = str(tiny_exports / MODEL / "2")

    assert push.main(replicas.push_args("--from-dir", source, "--label", "canary",
                                        server=DNS_NAME)) == 0  # fmt: skip

    assert f"replica 127.0.0.1:{removed_port} left the set" in capsys.readouterr().out
    assert replicas.published() == ["1", "2"]  # one version published, no retry's second
    assert replicas.labels() == {"stable": 1, "canary": 2}
    assert replicas.available([stays]) == [{1, 2}]


@pytest.mark.slow
def test_a_push_that_fails_under_latest_never_puts_the_new_version_live(
    latest_replicas: Replicas, tiny_exports: Path
) -> None:
    # `latest {2}` with v1 on disk serves v2 as soon as a replica's file-system poll sees it.
    # A replica dies right after the version is published (still named: it is not gone), so
    # the push fails; the live replica must not serve v2, now or on a later poll.
    live, (dying, _) = latest_replicas.targets[0], latest_replicas.procs[1]
    published = latest_replicas.base / MODEL / "2"

    def kill_once_published() -> None:
        deadline = time.monotonic() + 120
        while not published.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        dying.kill(signal.SIGKILL)

    killer = threading.Thread(target=kill_once_published, daemon=True)
    killer.start()
    args = latest_replicas.push_args("--from-dir", str(tiny_exports / MODEL / "2"))
    args[args.index("--timeout") + 1] = "8"

    assert push.main(args) == 1

    killer.join(10)
    model = modelconfig.find_model(modelconfig.load_config(latest_replicas.config), MODEL)
    assert modelconfig.policy_versions(model, [1, 2]) == {1}
    time.sleep(3)  # three file-system polls of the live replica
    assert latest_replicas.available([live]) == [{1}]


@pytest.mark.slow
def test_a_push_under_latest_gives_the_policy_back_once_it_succeeds(
    latest_replicas: Replicas, tiny_exports: Path
) -> None:
    source = str(tiny_exports / MODEL / "2")

    assert push.main(latest_replicas.push_args("--from-dir", source, "--label", "canary")) == 0

    model = modelconfig.find_model(modelconfig.load_config(latest_replicas.config), MODEL)
    assert modelconfig.policy_kind(model) == "latest"
    assert latest_replicas.available() == [{1, 2}, {1, 2}]
