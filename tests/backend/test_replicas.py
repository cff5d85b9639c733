"""Several model-server replicas behind one client: gRPC round_robin targets, REST URL lists."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend.clients import endpoints
from backend.clients.grpc_client import GrpcClient
from backend.clients.replicas import ReplicaSet
from backend.clients.rest_client import RestClient
from backend.errors import (
    ModelNotFound,
    Saturated,
    UpstreamTimeout,
    UpstreamUnavailable,
    VersionNotFound,
)
from modelformat.status import VersionStatus, merge_replicas, newest_available
from ops.drills.replica import scrape
from ops.procs import REPO, port_open
from tests.backend.conftest import INTENT
from tests.backend.stack import ModelServer

MONITORING = f"--monitoring_config_file={REPO / 'serving_config' / 'monitoring.config'}"
INPUTS = {
    "input_ids": np.array([[2, 7, 8, 3]], dtype=np.int32),
    "attention_mask": np.ones((1, 4), dtype=np.int32),
    "token_type_ids": np.zeros((1, 4), dtype=np.int32),
}


def status(*pairs: tuple[int, str]) -> list[VersionStatus]:
    return [VersionStatus(v, s) for v, s in pairs]


# -- targets and merged states (no servers) ------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("ipv4:127.0.0.1:1,127.0.0.1:2", ["127.0.0.1:1", "127.0.0.1:2"]),
        ("ipv6:[::1]:5,[::1]:6", ["[::1]:5", "[::1]:6"]),
        ("dns:///127.0.0.1:8500", ["127.0.0.1:8500"]),
        ("dns:127.0.0.1:8500", ["127.0.0.1:8500"]),
        ("10.0.0.1:8500,10.0.0.2:8500,10.0.0.1:8500", ["10.0.0.1:8500", "10.0.0.2:8500"]),
    ],
)
def test_resolve_lists_every_replica_a_target_names(target: str, expected: list[str]) -> None:
    assert endpoints.resolve(target) == expected


def test_resolve_looks_names_up_in_dns() -> None:
    assert "127.0.0.1:9" in endpoints.resolve("dns:///localhost:9")


def test_only_resolver_schemes_count_as_several_replicas() -> None:
    assert endpoints.is_multi("dns:///tf-serving-headless:8500")
    assert endpoints.is_multi("ipv4:127.0.0.1:1,127.0.0.1:2")
    assert not endpoints.is_multi("127.0.0.1:8500")


def test_a_version_is_available_only_when_every_replica_reports_it() -> None:
    merged = merge_replicas(
        [
            status((3, "AVAILABLE"), (2, "AVAILABLE")),
            status((3, "LOADING"), (2, "AVAILABLE")),
            status((2, "AVAILABLE")),
        ]
    )
    assert [(s.version, s.state) for s in merged] == [(3, "LOADING"), (2, "AVAILABLE")]
    assert newest_available(merged) == 2


def test_a_version_missing_on_one_replica_is_not_available() -> None:
    merged = merge_replicas([status((3, "AVAILABLE")), status()])
    assert newest_available(merged) is None


def replica_set(answers: dict[str, Any], **kwargs: Any) -> ReplicaSet[str]:
    """A ReplicaSet over fake replicas: address -> states, or an exception its status raises."""

    def ask(address: str, model: str, timeout_s: float) -> list[VersionStatus]:
        answer = answers[address]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    return ReplicaSet(
        ",".join(answers), resolve=lambda: list(answers), connect=str,
        disconnect=lambda _: None, status=ask, transport="test", **kwargs,
    )  # fmt: skip


def test_merged_status_leaves_out_unreachable_replicas() -> None:
    down = UpstreamUnavailable("replica down")
    merged = replica_set({"a": down, "b": status((1, "AVAILABLE"))}).status(INTENT)
    assert newest_available(merged) == 1
    with pytest.raises(UpstreamUnavailable):
        replica_set({"a": down, "b": down}).status(INTENT)


def test_merged_status_raises_other_errors_as_they_are() -> None:
    unknown = ModelNotFound("no such model")
    with pytest.raises(ModelNotFound):
        replica_set({"a": unknown, "b": status((1, "AVAILABLE"))}).status(INTENT)


def test_calls_take_turns_and_skip_a_replica_that_could_not_be_reached() -> None:
    replicas = replica_set({a: status((1, "AVAILABLE")) for a in "abc"})
    deadline = time.monotonic() + 5
    firsts = [replicas.call(INTENT, None, lambda r, _: r.address, deadline) for _ in range(3)]
    assert sorted(firsts) == ["a", "b", "c"]

    def flaky(replica: Any, _: float) -> str:
        if replica.address == "b":
            raise UpstreamUnavailable("connection refused")
        return str(replica.address)

    answers = [replicas.call(INTENT, None, flaky, deadline) for _ in range(6)]
    assert "b" not in answers and len(answers) == 6  # failed over, then skipped while down


def test_a_saturated_answer_is_not_failed_over() -> None:
    replicas = replica_set({a: status((1, "AVAILABLE")) for a in "ab"})
    asked: list[str] = []

    def full(replica: Any, _: float) -> str:
        asked.append(replica.address)
        raise Saturated("The batch scheduling queue to which this task was submitted is full")

    with pytest.raises(Saturated):
        replicas.call(INTENT, 1, full, time.monotonic() + 5)
    assert len(asked) == 1  # every replica carries the same load: trying the others adds to it


# -- real replicas ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicas(config_file: Path, log_dir: Path) -> Iterator[list[ModelServer]]:
    """Return two modelservers on the same models.config, each counting its requests."""
    servers = [ModelServer(config_file, log_dir, extra_flags=[MONITORING]) for _ in range(2)]
    try:
        for server in servers:
            server.wait_available(INTENT, 2)
        yield servers
    finally:
        for server in servers:
            server.stop()


def served(server: ModelServer) -> int:
    """Return the Predict calls ``server`` answered OK since it started."""
    counts = scrape(server.rest_port, INTENT)
    return (counts or {}).get("OK", 0)


def make_client(transport: str, servers: list[ModelServer]) -> GrpcClient | RestClient:
    if transport == "grpc":
        return GrpcClient("ipv4:" + ",".join(s.grpc_target for s in servers))
    return RestClient(",".join(s.rest_url for s in servers))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["grpc", "rest"])
def test_requests_spread_over_replicas_and_survive_one_being_killed(
    transport: str, replicas: list[ModelServer]
) -> None:
    client = make_client(transport, replicas)
    try:
        before = [served(s) for s in replicas]
        for _ in range(20):
            outputs, _version = client.predict(INTENT, INPUTS, version=2, timeout_s=10)
            assert outputs["probabilities"].shape[0] == 1
        spread = [served(s) - b for s, b in zip(replicas, before, strict=True)]
        assert sum(spread) == 20 and min(spread) >= 8, spread  # round robin: 10 each
        assert newest_available(client.model_status(INTENT, timeout_s=5)) == 2

        victim = replicas[1]
        victim.process.kill(signal.SIGKILL)
        for _ in range(20):
            client.predict(INTENT, INPUTS, version=2, timeout_s=10)  # none fails
        assert newest_available(client.model_status(INTENT, timeout_s=5)) == 2

        victim.process.restart()
        victim.wait_available(INTENT, 2)
        deadline = time.monotonic() + 20
        while served(victim) == 0 and time.monotonic() < deadline:
            client.predict(INTENT, INPUTS, version=2, timeout_s=10)
            time.sleep(0.05)
        assert served(victim) > 0, "the restarted replica got no request back"
    finally:
        client.close()
        for server in replicas:
            if not port_open(server.grpc_port):
                server.process.restart()
                server.wait_available(INTENT, 2)


def test_a_version_not_found_asks_the_replicas_only_within_the_calls_deadline() -> None:
    """A NOT_FOUND makes the set ask every replica's states before calling it the client's 404:
    that look-up used to take the whole status deadline, whatever was left of the call's."""

    def hangs(address: str, model: str, timeout_s: float) -> list[VersionStatus]:
        time.sleep(timeout_s)  # replicas that answer nothing before the deadline they are given
        raise UpstreamTimeout("no answer")

    def missing(replica: Any, left: float) -> Any:
        raise VersionNotFound(f"model {INTENT!r} has no version 5")

    replicas = ReplicaSet(
        "a,b", resolve=lambda: ["a", "b"], connect=str, disconnect=lambda _: None,
        status=hangs, transport="test", status_deadline_s=3.0,
    )  # fmt: skip
    try:
        started = time.monotonic()
        with pytest.raises(VersionNotFound):
            replicas.call(INTENT, 5, missing, started + 0.4)
        assert time.monotonic() - started < 1.2  # 3x the call's 0.4 s; not the 3 s status deadline
    finally:
        replicas.close()
