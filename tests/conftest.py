"""Fixtures shared by tests/contract (the server under test, modelserver or the real binary) and
tests/modelserver (modelserver's own behaviour): the models both build once a session, and the
servers both directories test, so each starts once a session. Their helpers live in
tests/contract/conftest.py, imported when a fixture is first used (most of the suite needs none).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.contract.conftest import Server


@pytest.fixture(scope="session")
def contract_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a scratch directory for the contract suite."""
    return tmp_path_factory.mktemp("contract")


@pytest.fixture(scope="session")
def hp2_base(contract_root: Path) -> Path:
    """Return the base path of half_plus_two with versions 1 (y=0.5x+2) and 2 (y=0.5x+3)."""
    from modelserver.half_plus_two import export_half_plus_two

    base = contract_root / "models" / "half_plus_two"
    export_half_plus_two(base, version=1, offset=2.0)
    export_half_plus_two(base, version=2, offset=3.0)
    return base


@pytest.fixture(scope="session")
def tiny_base(contract_root: Path) -> Path:
    """Return the base path of a tiny BERT embedding model (version 1)."""
    from export.tiny import export_tiny_model

    base = contract_root / "models"
    export_tiny_model(base, "tiny", task="embed", version=1, warmup=True)
    return base / "tiny"


@pytest.fixture(scope="session")
def life_root(contract_root: Path, hp2_base: Path) -> Path:
    """Return a directory with model bases ``hot`` and ``steady`` (v1 each) to mutate."""
    from tests.contract.conftest import copy_version

    root = contract_root / "life"
    for name in ("hot", "steady"):
        copy_version(hp2_base, 1, root / name, 1)
    return root


@pytest.fixture(scope="session")
def life_server(contract_root: Path, life_root: Path) -> Iterator[Server]:
    """A server whose models the lifecycle tests change (1 s file-system polling)."""
    from tests.contract.conftest import base_models, start_server, write_config

    config = write_config(contract_root / "life.config", base_models(life_root))
    # No load retries: the binary would otherwise retry a broken version 5 × 60 s before END.
    flags = [
        f"--model_config_file={config}",
        "--file_system_poll_wait_seconds=1",
        "--max_num_load_retries=0",
    ]
    server = start_server(contract_root, flags)
    yield server
    server.stop()


def pytest_configure(config: pytest.Config) -> None:
    """Register the per-area clock (tests/areas.py) that prints each area's time at the end."""
    from tests.areas import AreaClock

    config.pluginmanager.register(AreaClock(), "area-clock")
