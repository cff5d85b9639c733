"""`make run`'s stack serves the fine-tuned heads that exist (issue 22), and only those."""

from __future__ import annotations

from pathlib import Path

from ops.demo import stack as localstack
from ops.modelconfig import full_config


def _version(base: Path, name: str) -> None:
    (base / name / "1").mkdir(parents=True)
    (base / name / "1" / "saved_model.pb").write_bytes(b"")


def test_heads_that_exist_are_served_and_shown(tmp_path: Path) -> None:
    base, state = tmp_path / "models", tmp_path / "state"
    state.mkdir()
    names = ("minilm", "minilm-intent", "minilm-ner", "minilm-topics")
    for name in names:
        _version(base, name)

    config = full_config(localstack.local_model_config(base, state).read_text())

    served = {m.name: m.base_path for m in config.model_config_list.config}
    assert served == {name: str(base.resolve() / name) for name in names}
    paths = [path for _, path, _ in localstack.demo_requests(base)]
    assert "/v1/models/minilm-ner:tag" in paths and "/v1/models/minilm-topics:classify" in paths
    assert not any("minilm-pairs" in path for path in paths)


def test_without_heads_the_committed_models_are_served(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()

    config = full_config(localstack.local_model_config(tmp_path / "models", state).read_text())

    assert [m.name for m in config.model_config_list.config] == ["minilm", "minilm-intent"]
    assert localstack.demo_requests(tmp_path / "models") == localstack.DEMO_REQUESTS
