"""Fixtures shared by tests/contract (the server under test, modelserver or the real binary) and
tests/modelserver (modelserver's own behaviour): the models both build once a session, and the
servers both directories test, so each starts once a session. Their helpers live in
tests/contract/conftest.py, imported when a fixture is first used (most of the suite needs none).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Put torch on one thread once a test module has imported it (the parity references).

    The references are tiny models whose ops are too small to split: on two threads, OpenMP's
    workers spin between them, and 33 references of tests/export/test_architectures.py took
    4.3 s of CPU rather than 0.7 s on one (AVX-512). Their answers are within the same
    tolerances either way (the saved checkpoints are byte-identical). Only this process: the
    servers and children a test starts keep their own settings.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """Register the per-area clock (tests/areas.py) that prints each area's time at the end; in
    an xdist worker, draw ports from the worker's own slice (ops/procs.py ``PORT_SLICE``; the
    servers its tests start inherit it)."""
    from ops.procs import PORT_SLICE
    from tests.areas import AreaClock

    config.pluginmanager.register(AreaClock(), "area-clock")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit():
        os.environ[PORT_SLICE] = f"{int(worker[2:])}/{count}"


# Under xdist, the longest groups go first, so that the last groups handed out are short and the
# workers end together: the podman group, then the modules that take longest (a minute or more
# under two workers, AVX-512: `make test`'s slowest tests and its time per area say when this
# list is stale), then the areas whose groups run longest (the order within an area is the
# collection's).
SLOWEST_FIRST = (
    "tests/ops/test_rolling_drill.py", "tests/ops/test_rollout_drill.py",
    "tests/backend/test_architectures_e2e.py", "tests/export/test_architectures.py",
    "tests/finetune/test_heads_demo.py", "tests/export/test_export_early_exit.py",
    "tests/backend/test_bucket_batching_e2e.py", "tests/benchmarks/test_e2e_bench.py",
    "tests/ops/test_drills.py", "tests/ops/test_push_replicas.py", "tests/test_readme.py",
    "tests/backend/test_errors_e2e.py", "tests/ops/test_add_model.py",
    "tests/ops/test_replica_drill.py", "tests/ops/test_rollout_resume.py",
)  # fmt: skip
LONGEST_FIRST = ("deploy", "drills", "benchmarks", "hybrid", "export", "finetune")


def group_of(nodeid: str) -> str:
    """Return the group a test runs in under xdist: its module (the module's fixtures start
    once), or "podman" for every test that drives podman (images, compose, kube play: one
    engine, one set of names)."""
    from tests.areas import area_of

    path = nodeid.split("::")[0]
    return "podman" if area_of(path).name.startswith("deploy") else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand xdist's workers whole groups (``group_of``), one at a time as they finish, in the
    collection's order (xdist's own ``loadgroup`` can't: pytest 9 ignores the node ids it
    rewrites)."""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    # in the collection's order (``rank``), not xdist's default of the most tests first, which
    # handed out the one-test drills last
    config.option.loadscopereorder = False
    return Grouped(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In an xdist worker, the longest groups first (the podman group, ``SLOWEST_FIRST``, then
    ``LONGEST_FIRST``'s areas)."""
    from tests.areas import area_of

    if os.environ.get("PYTEST_XDIST_WORKER"):

        def rank(item: pytest.Item) -> int:
            path = item.nodeid.split("::")[0]
            if group_of(path) == "podman":
                return 0
            if path in SLOWEST_FIRST:
                return 1 + SLOWEST_FIRST.index(path)
            name = area_of(item.nodeid).name
            area = next((i for i, a in enumerate(LONGEST_FIRST) if name.startswith(a)), 99)
            return 100 + area

        items.sort(key=rank)  # stable: the collection's order within an area


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In an xdist worker: hand the lines of the run's summary (tests/summary.py) to the
    controller, which prints them."""
    from tests import summary

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["summary"] = summary.SECTIONS


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the xdist controller: take a worker's summary lines."""
    from tests import summary

    summary.merge(getattr(node, "workeroutput", {}).get("summary", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the summary lines the tests added (tests/summary.py), every worker's."""
    from tests import summary

    for section, lines in summary.SECTIONS.items():
        terminalreporter.section(section)
        for line in lines:
            terminalreporter.write_line(line)
