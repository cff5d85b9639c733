"""Fixtures shared by tests/contract (the server under test, modelserver or the real binary) and
tests/modelserver (modelserver's own behaviour): the models both build once a session."""

from __future__ import annotations

from pathlib import Path

import pytest


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
