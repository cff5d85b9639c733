"""--rollback against a real model server: back to the label's previous value, from its history."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.lifecycle import labelhistory, push
from tests.ops.conftest import MODEL, OpsServer, serve_tiny_versions
from tests.ops.test_push_model import labels, served_version


@pytest.fixture
def server(tiny_exports: Path, tmp_path: Path) -> Iterator[OpsServer]:
    """Serve tiny v1 with stable=1 under a ``specific`` policy (a fresh one per test)."""
    yield from serve_tiny_versions(
        tiny_exports, tmp_path, {1: "stable"}, "specific { versions: 1 }"
    )


def push_main(server: OpsServer, *args: str) -> int:
    return push.main(server.push_args("--reader-wait", "0", *args))


def test_rollback_after_an_unpromoted_canary_returns_stable_to_its_previous_value(
    server: OpsServer, tiny_exports: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = str(tiny_exports / MODEL / "2")
    assert push_main(server, "--from-dir", source, "--label", "canary") == 0  # v2: never promoted
    assert push_main(server, "--from-dir", source, "--label", "canary") == 0  # v3
    assert push_main(server, "--promote", "canary", "stable") == 0
    assert labels(server) == {"stable": 3, "canary": 3}

    assert push_main(server, "--rollback", "stable") == 0

    assert labels(server)["stable"] == 1  # not 2, the newest older version on disk
    assert served_version(server, "stable") == 1

    # Another round: the history survives pushes and rollbacks, and runs out clearly.
    assert push_main(server, "--from-dir", source, "--label", "canary") == 0  # v4
    assert push_main(server, "--promote", "canary", "stable") == 0
    assert push_main(server, "--rollback", "stable") == 0
    assert labels(server)["stable"] == 1
    history = labelhistory.load(labelhistory.history_path_for(server.config))
    assert history == {MODEL: {"stable": [1], "canary": [2, 3, 4]}}
    capsys.readouterr()
    before = server.config.read_text()

    assert push_main(server, "--rollback", "stable") == 1

    assert "no value of tiny's 'stable' before 1" in capsys.readouterr().err
    assert server.config.read_text() == before


def test_a_corrupt_history_stops_the_push_before_anything_changes(
    server: OpsServer, tiny_exports: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = labelhistory.history_path_for(server.config)
    path.write_text("{half a file")
    before = server.config.read_text()

    source = str(tiny_exports / MODEL / "2")
    assert push_main(server, "--from-dir", source, "--label", "canary") == 1

    assert f"label history {path} is unreadable" in capsys.readouterr().err
    assert server.config.read_text() == before
    assert sorted(p.name for p in (server.base_path / MODEL).iterdir()) == ["1"]
    assert path.read_text() == "{half a file"  # never silently replaced
