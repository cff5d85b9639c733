"""ModelManager with a stand-in loader: lookups, states, labels, failed loads, removal."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import text_format

from modelserver.config import ModelServerConfig
from modelserver.errors import ServingError
from modelserver.manager import ModelManager
from modelserver.versions import AVAILABLE, END


class FakeVersion:
    """What the manager needs of a loaded version."""

    def __init__(self, path: Path) -> None:
        if (path / "broken").exists():
            raise ValueError("cannot load")
        self.path = path
        self.version = int(path.name)


def config(base: Path, extra: str = "") -> Any:
    text = (
        f'model_config_list {{ config {{ name: "m" base_path: "{base}" '
        f'model_platform: "tensorflow" {extra} }} }}'
    )
    return text_format.Parse(text, ModelServerConfig())


def make(tmp_path: Path, versions: list[int], allow: bool = False) -> tuple[ModelManager, Path]:
    base = tmp_path / "m"
    for version in versions:
        (base / str(version)).mkdir(parents=True)
    return ModelManager(FakeVersion, allow_labels_for_unavailable=allow), base  # type: ignore[arg-type]


def test_latest_available_serves_and_unknowns_are_not_found(tmp_path: Path) -> None:
    manager, base = make(tmp_path, [1, 2])
    manager.apply_config(config(base, "model_version_policy { all {} }"), initial=True)

    assert manager.servable("m").version == 2
    assert manager.servable("m", version=1).version == 1
    with pytest.raises(ServingError, match=r"Specific\(m, 3\)"):
        manager.servable("m", version=3)
    with pytest.raises(ServingError, match=r"Latest\(x\)"):
        manager.servable("x")
    assert [s.version for s in manager.status("m")] == [2, 1]


def test_labels_on_unloaded_versions_need_the_flag_at_startup(tmp_path: Path) -> None:
    labelled = 'version_labels { key: "stable" value: 1 }'
    strict, base = make(tmp_path, [1])
    with pytest.raises(ServingError) as info:
        strict.apply_config(config(base, labelled), initial=True)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION

    allowed = ModelManager(FakeVersion, allow_labels_for_unavailable=True)  # type: ignore[arg-type]
    allowed.apply_config(config(base, labelled), initial=True)
    assert allowed.servable("m", label="stable").version == 1
    with pytest.raises(ServingError, match="Unrecognized servable version label: gold"):
        allowed.servable("m", label="gold")


def test_failed_newer_version_ends_while_older_keeps_serving(tmp_path: Path) -> None:
    manager, base = make(tmp_path, [1])
    manager.apply_config(config(base), initial=True)
    (base / "2").mkdir()
    (base / "2" / "broken").touch()

    manager.poll_once()

    states = {s.version: (s.state, s.error) for s in manager.status("m")}
    assert states[2][0] == END and states[2][1] is not None
    assert states[1] == (AVAILABLE, None)
    assert manager.servable("m").version == 1


def test_initial_load_failure_is_reported(tmp_path: Path) -> None:
    manager, base = make(tmp_path, [1])
    (base / "1" / "broken").touch()

    with pytest.raises(ServingError, match="did not become available"):
        manager.apply_config(config(base), initial=True)


def test_removed_model_unloads_and_keeps_end_states(tmp_path: Path) -> None:
    manager, base = make(tmp_path, [1])
    manager.apply_config(config(base), initial=True)

    manager.apply_config(text_format.Parse("model_config_list {}", ModelServerConfig()))
    manager.poll_once()

    assert [(s.version, s.state) for s in manager.status("m")] == [(1, END)]
    with pytest.raises(ServingError, match=r"Latest\(m\)"):
        manager.servable("m")


def two_models(base: Path, other: Path, extra: str = "") -> Any:
    text = (
        f'model_config_list {{ config {{ name: "m" base_path: "{base}" '
        f'model_platform: "tensorflow" {extra} }} '
        f'config {{ name: "other" base_path: "{other}" model_platform: "tensorflow" }} }}'
    )
    return text_format.Parse(text, ModelServerConfig())


def test_reload_without_a_deadline_is_bounded_and_names_the_missing_base_path(
    tmp_path: Path,
) -> None:
    manager, base = make(tmp_path, [1])
    manager.apply_config(config(base), initial=True)
    manager.wait_s = 1.0  # the bound a reload with no client deadline gets (300 s by default)
    manager.start_polling(0.05)
    try:
        with pytest.raises(ServingError) as info:
            manager.apply_config(two_models(base, tmp_path / "nowhere"), timeout_s=None)
    finally:
        manager.stop()
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert f"Could not find base path {tmp_path / 'nowhere'} for servable other" in (
        info.value.message
    )
    assert manager.servable("m").version == 1  # the others kept serving


class GatedVersion(FakeVersion):
    """Loads of a version directory holding a ``gate`` file block until ``release`` is set."""

    release = threading.Event()

    def __init__(self, path: Path) -> None:
        if (path / "gate").exists():
            assert GatedVersion.release.wait(20), "the test never released the load"
        super().__init__(path)


def loading(manager: ModelManager, name: str) -> bool:
    try:
        return bool(manager.status(name))
    except ServingError:  # no version known yet
        return False


def test_a_reload_waiting_on_a_stuck_model_does_not_hold_up_the_next(tmp_path: Path) -> None:
    base, slow = tmp_path / "m", tmp_path / "slow"
    (base / "1").mkdir(parents=True)
    (base / "2").mkdir(parents=True)
    (slow / "1").mkdir(parents=True)
    (slow / "1" / "gate").touch()
    manager = ModelManager(GatedVersion, allow_labels_for_unavailable=False)  # type: ignore[arg-type]
    manager.apply_config(config(base, "model_version_policy { all {} }"), initial=True)
    manager.start_polling(0.05)
    stuck: list[BaseException] = []

    def first() -> None:
        labels = 'model_version_policy { all {} } version_labels { key: "stable" value: 1 }'
        try:
            manager.apply_config(two_models(base, slow, labels), timeout_s=30)
        except BaseException as exc:
            stuck.append(exc)

    thread = threading.Thread(target=first)
    try:
        thread.start()
        wait_until = time.monotonic() + 10
        while not loading(manager, "other"):
            assert time.monotonic() < wait_until, "the slow model never started loading"
            time.sleep(0.01)
        newer = 'model_version_policy { all {} } version_labels { key: "stable" value: 2 }'
        manager.apply_config(two_models(base, slow, newer), timeout_s=30)
        # It returned while the first reload still waits on the stuck load: it did not wait.
        assert thread.is_alive() and not GatedVersion.release.is_set()
        GatedVersion.release.set()
        thread.join(20)
    finally:
        GatedVersion.release.set()
        manager.stop()
    assert not stuck, stuck
    assert manager.servable("m", label="stable").version == 2  # the newer config's label stands


def test_a_reload_stops_waiting_for_a_model_a_newer_config_dropped(tmp_path: Path) -> None:
    manager, base = make(tmp_path, [1])
    manager.apply_config(config(base), initial=True)
    manager.start_polling(0.05)
    outcome: list[BaseException | None] = []

    def with_missing_model() -> None:
        try:
            manager.apply_config(two_models(base, tmp_path / "nowhere"), timeout_s=60)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=with_missing_model)
    try:
        thread.start()
        wait_until = time.monotonic() + 10
        while "other" not in manager.model_names():
            assert time.monotonic() < wait_until, "the first config was never applied"
            time.sleep(0.01)
        manager.apply_config(config(base), timeout_s=10)  # drops "other" again
        thread.join(20)  # far less than the 60 s the first reload would otherwise wait
    finally:
        manager.stop()
    assert not thread.is_alive() and outcome == [None]
    assert manager.model_names() == ["m"]
