"""Thread counts follow the cores this process may use, never a number written on one machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelserver import config, flags


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_unset_num_batch_threads_is_one_per_usable_core(
    cores: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "usable_cores", lambda: cores)
    path = tmp_path / "batching.txt"
    path.write_text("max_batch_size { value: 32 }\n")
    settings = config.batching_settings(config.read_batching_parameters(path))
    assert settings["num_batch_threads"] == cores


def test_the_shipped_batching_file_leaves_batch_threads_to_the_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "usable_cores", lambda: 5)
    shipped = Path(__file__).resolve().parents[2] / "serving_config" / "batching_parameters.txt"
    settings = config.batching_settings(config.read_batching_parameters(shipped))
    assert settings["num_batch_threads"] == 5


@pytest.mark.parametrize("cores", [1, 2, 16])
def test_server_thread_defaults_are_four_per_usable_core(
    cores: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flags, "usable_cores", lambda: cores)
    parsed = flags.parse_flags(["--port", "0"])
    assert parsed.rest_api_num_threads == parsed.grpc_max_threads == 4 * cores
