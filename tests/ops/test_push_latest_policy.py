"""push_model on the committed layout: `latest { num_versions: 2 }` with stable=1, canary=2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import modelconfig
from ops.lifecycle import push
from tests.ops.conftest import MODEL, OpsServer, serve_tiny_versions
from tests.ops.test_push_model import available, labels, served_version


@pytest.fixture(scope="module")
def latest_server(
    tiny_exports: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpsServer]:
    """Start a model server on tiny v1 + v2 like serving_config/models.config does."""
    yield from serve_tiny_versions(
        tiny_exports, tmp_path_factory.mktemp("latest-server"), {1: "stable", 2: "canary"},
        "latest { num_versions: 2 }",
    )  # fmt: skip


def test_push_pins_the_policy_so_stable_keeps_its_version(
    latest_server: OpsServer, tiny_exports: Path
) -> None:
    args = latest_server.push_args(
        "--from-dir", str(tiny_exports / MODEL / "2"), "--label", "canary"
    )
    assert push.main(args) == 0
    model = modelconfig.find_model(modelconfig.load_config(latest_server.config), MODEL)
    # Without the pin, `latest {2}` would unload version 1 while `stable` still names it.
    assert modelconfig.policy_kind(model) == "specific"
    assert labels(latest_server) == {"stable": 1, "canary": 3}
    assert available(latest_server) == {1, 2, 3}
    assert served_version(latest_server, "stable") == 1
    assert served_version(latest_server, "canary") == 3
