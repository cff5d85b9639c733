"""push_model.py --add against a real model server: a new model from a checkpoint, served in one
command; the same command again changes nothing; bad names and tasks are clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelformat import serverconfig
from modelformat.layout import list_versions, read_model_info
from ops import modelconfig
from ops.lifecycle import addmodel, push
from ops.procs import REPO, child_env
from ops.server import ModelServer
from tests.ops.conftest import OpsServer

NAME = "my-classifier"


def add_args(server: OpsServer, checkpoint: Path, *more: str) -> list[str]:
    args = server.push_args("--add", "--checkpoint", str(checkpoint), "--task", "classify")
    args[args.index("--name") + 1] = NAME
    return [*args, *more, "--", "--max-seq-len", "32", "--no-warmup"]


def available(server: OpsServer, name: str) -> set[int]:
    client = ModelServer(server.grpc_target)
    try:
        return {s.version for s in client.status(name) if s.state == "AVAILABLE"}
    finally:
        client.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export.tiny import write_hf_checkpoint

    return write_hf_checkpoint(tmp_path_factory.mktemp("ckpt") / "ckpt", task="classify", seed=3)


@pytest.fixture(scope="module")
def committed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the committed serving config (docker layout: /models/<name>)."""
    path = tmp_path_factory.mktemp("committed") / "models.config"
    path.write_text((REPO / "serving_config" / "models.config").read_text())
    return path


def test_add_exports_version_1_adds_the_entry_and_serves_it(
    ops_server: OpsServer, checkpoint: Path, committed: Path
) -> None:
    others = serverconfig.render(modelconfig.load_config(ops_server.config))

    assert push.main(add_args(ops_server, checkpoint, "--also-config", str(committed))) == 0

    assert available(ops_server, NAME) == {1}
    config = modelconfig.load_config(ops_server.config)
    entry = modelconfig.find_model(config, NAME)
    assert entry.base_path == str(ops_server.base_path / NAME)  # beside the other models
    assert entry.model_version_policy.latest.num_versions == addmodel.KEEP_VERSIONS
    assert serverconfig.render(config).startswith(others.rstrip().removesuffix("}"))
    info = read_model_info(ops_server.base_path / NAME / "1")
    assert info is not None and info["task"] == "classify"
    assert info["source"]["sha256"] == addmodel.file_sha256(checkpoint / "model.safetensors")
    kept = modelconfig.find_model(modelconfig.load_config(committed), NAME)
    assert kept.base_path == f"/models/{NAME}"  # the committed file's layout
    assert committed.read_text().startswith("# TF Serving ModelServerConfig")  # header kept


def test_adding_the_same_checkpoint_again_changes_nothing(
    ops_server: OpsServer, checkpoint: Path, committed: Path
) -> None:
    before = (ops_server.config.read_bytes(), committed.read_bytes())
    cmd = [sys.executable, "scripts/push_model.py"]
    args = add_args(ops_server, checkpoint, "--also-config", str(committed))
    result = subprocess.run(
        [*cmd, *args], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stdout
    assert (ops_server.config.read_bytes(), committed.read_bytes()) == before
    assert list_versions(ops_server.base_path / NAME) == [1]


def test_adding_a_changed_checkpoint_pushes_its_next_version(
    ops_server: OpsServer, tmp_path: Path
) -> None:
    from export.tiny import write_hf_checkpoint

    retrained = write_hf_checkpoint(tmp_path / "ckpt", task="classify", seed=4)

    assert push.main(add_args(ops_server, retrained)) == 0

    assert list_versions(ops_server.base_path / NAME) == [1, 2]
    assert 2 in available(ops_server, NAME)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("--name", "../etc"), "a model name must be 1-128 letters"),
        (("--name", "has space"), "a model name must be 1-128 letters"),
        (("--task", "summarize"), "argument --task: invalid choice: 'summarize'"),
    ],
)
def test_a_bad_name_or_task_is_a_clear_error_before_anything_changes(
    ops_server: OpsServer, checkpoint: Path, change: tuple[str, str], message: str
) -> None:
    before = ops_server.config.read_bytes()
    args = add_args(ops_server, checkpoint)
    args[args.index(change[0]) + 1] = change[1]
    cmd = [sys.executable, "scripts/push_model.py", *args]

    result = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )

    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert ops_server.config.read_bytes() == before


def test_add_needs_a_task_for_a_checkpoint(
    ops_server: OpsServer, checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = add_args(ops_server, checkpoint)
    del args[args.index("--task") : args.index("--task") + 2]
    with pytest.raises(SystemExit):
        push.parse_args(args)
    assert "--add --checkpoint needs --task (classify, embed, tag)" in capsys.readouterr().err


def test_offline_add_writes_the_config_a_server_starts_on(checkpoint: Path, tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text((REPO / "serving_config" / "models.config").read_text())
    args = [
        "--add", "--name", NAME, "--checkpoint", str(checkpoint), "--task", "classify",
        "--config", str(config), "--base-path", str(tmp_path / "models"), "--offline",
        "--", "--max-seq-len", "32", "--no-warmup",
    ]  # fmt: skip

    assert push.main(args) == 0
    again = config.read_bytes()
    assert push.main(args) == 0

    assert config.read_bytes() == again
    assert modelconfig.find_model(modelconfig.load_config(config), NAME).base_path == (
        f"/models/{NAME}"
    )
    assert list_versions(tmp_path / "models" / NAME) == [1]


def test_a_model_that_never_loads_leaves_the_config_as_it_was(
    ops_server: OpsServer, checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = serverconfig.render(modelconfig.load_config(ops_server.config))
    args = add_args(ops_server, checkpoint, "--timeout", "3")
    args[args.index("--name") + 1] = "never-loads"
    # Published into a directory the server does not read: the entry points at an empty one.
    args[args.index("--base-path") + 1] = str(tmp_path / "elsewhere")

    assert push.main(args) == 1

    assert "never-loads was not added (the config is as it was" in capsys.readouterr().err
    assert serverconfig.render(modelconfig.load_config(ops_server.config)) == before
    assert list_versions(tmp_path / "elsewhere" / "never-loads") == [1]  # kept, unserved
