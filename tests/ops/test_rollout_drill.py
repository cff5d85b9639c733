"""rollout.py --from-dir/--checkpoint (the pin before publishing) and the rollout drill, run short
on tiny exports (real model server, gunicorn gateway, rollout.py as a process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelformat import routing as routing_format
from modelformat.routing import ModelRoute
from ops.modelconfig import OpsError
from ops.procs import free_port
from ops.rollout import cli as rolloutcli
from ops.rollout import engine as rollout
from ops.rollout import push as rolloutpush
from tests.ops.test_drills import run_drill

MODEL = "tiny"
CONFIG = (
    'model_config_list { config { name: "tiny" base_path: "/models/tiny" model_platform: '
    '"tensorflow" model_version_policy { specific { versions: 1 } } '
    'version_labels { key: "stable" value: 1 } } }\n'
)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """Return a models.config of tiny with stable=1 (no routing file beside it)."""
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    return path


def settings(config: Path, **changes: object) -> rollout.Settings:
    return rollout.Settings(model=MODEL, version=0, config_path=config, reader_wait_s=0.0,
                            lock_timeout_s=5.0, **changes)  # type: ignore[arg-type]  # fmt: skip


def route_of(config: Path) -> ModelRoute | None:
    return rollout.read_routing(rollout.routing_path_for(config)).route(MODEL)


def test_pin_sends_default_traffic_to_stable_before_the_new_version_exists(config: Path) -> None:
    assert rolloutpush.pin_to_stable(settings(config)) is True
    assert route_of(config) == ModelRoute(((1, 100.0),))
    # The file is a routing file the gateway parses.
    routing_format.parse(rollout.routing_path_for(config).read_text(), "routing.yaml")


def test_pin_keeps_an_existing_routing_entry(config: Path) -> None:
    entry = ModelRoute(((1, 70.0), (2, 30.0)))
    rollout.write_route(rollout.routing_path_for(config), MODEL, entry)
    assert rolloutpush.pin_to_stable(settings(config)) is False
    assert route_of(config) == entry


def test_pin_refuses_a_model_without_the_label(config: Path) -> None:
    with pytest.raises(OpsError, match="no label 'gold'"):
        rolloutpush.pin_to_stable(settings(config, from_label="gold"))
    assert route_of(config) is None


def test_pin_refuses_while_a_rollout_of_the_model_is_in_progress(config: Path) -> None:
    state_path = rollout.state_path_for(rollout.routing_path_for(config))
    rollout.write_states(state_path, {MODEL: rollout.State(MODEL, 2, "stable", 1, "shadow:100")})
    with pytest.raises(OpsError, match="resume it with --version 2"):
        rolloutpush.pin_to_stable(settings(config))
    assert route_of(config) is None


def test_a_failed_push_removes_the_pin_it_wrote(config: Path, tmp_path: Path) -> None:
    exported = tmp_path / "exported"
    exported.mkdir()
    args = rolloutcli.parse_args([
        "--name", MODEL, "--from-dir", str(exported), "--gateway", "http://127.0.0.1:1",
        "--server", f"127.0.0.1:{free_port()}", "--config", str(config),
        "--base-path", str(tmp_path / "models"), "--reader-wait", "0", "--timeout", "1",
    ])  # fmt: skip
    with pytest.raises(OpsError):
        rolloutpush.push_new_version(args, rolloutcli.settings_from(args), [])
    assert route_of(config) is None
    assert not (tmp_path / "models" / MODEL / "1").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--version", "2", "--from-dir", "x"], "not allowed with argument"),
        (["--from-dir", "x", "--", "--precision", "bf16"], "they need --checkpoint"),
        (["--revert", "--from-dir", "x"], "--revert takes no"),
        ([], "--version is required"),
    ],
)
def test_rollout_arguments_for_a_push_are_checked(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        rolloutcli.parse_args(["--name", MODEL, "--gateway", "http://gw:8000", *argv])
    assert message in capsys.readouterr().err


def test_arguments_after_the_dashes_go_to_the_exporter_with_a_checkpoint() -> None:
    args = rolloutcli.parse_args([
        "--name", MODEL, "--checkpoint", "ckpt", "--gateway", "http://gw:8000", "--",
        "--precision", "bf16",
    ])  # fmt: skip
    assert args.checkpoint == Path("ckpt") and args.extra == ["--precision", "bf16"]
    assert args.version is None


@pytest.mark.slow
def test_rollout_drill_promotes_the_good_version_and_rolls_the_swapped_one_back(
    tmp_path: Path,
) -> None:
    from export.tiny import write_hf_checkpoint

    checkpoint = write_hf_checkpoint(tmp_path / "ckpt", seed=0)
    report, plot = tmp_path / "drills.md", tmp_path / "drill.png"
    code, result, output = run_drill(
        "rollout_drill.py", tmp_path / "drill.json", "--checkpoint", str(checkpoint),
        "--model", MODEL, "--clients", "4", "--steps", "shadow:100,50,100", "--hold-s", "2",
        "--min-samples", "30", "--gap", "1", "--windows", "1", "--window-s", "2",
        "--probe", "40", "--report", str(report), "--plot", str(plot), "--capacity-s", "2",
        # a tiny model answers in milliseconds: its p99 is scheduling noise, not the version's
        "--max-latency-ratio", "20",
        # the gateway re-reads routing within 0.25 s: each routing write waits 1 s, not 3
        "--labels-cache-s", "0.25", "--reader-wait", "1",
        # The load runs for the whole drill, so its CPU grows with the drill's wall time: 0.15
        # of the capacity (~25 requests/s here) still puts every 2 s step over --min-samples,
        # and leaves the shadow's nice-19 model server the CPU to load each version, which a
        # busy machine otherwise starves for minutes while the load goes on.
        "--load-fraction", "0.15",
        # longer tickets are truncated (the gateway's default) as they were at 128: three
        # bucket signatures and their warmup per version to export and load, not four
        "--max-seq-len", "64",
    )  # fmt: skip
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed, f"{failed}\n{output[-5000:]}"
    assert code == 0
    versions = result["versions"]
    assert result["counts"]["requests"] > 0 and "failed" not in result["counts"]
    # Clients got the good version (after its shadow step) and never the bad one.
    assert f"version {versions['good']}" in result["counts"]
    assert f"version {versions['bad']}" not in result["counts"]
    bad = [d for d in result["decisions"] if d["rollout"] == "bad"]
    assert [d["step"] for d in bad] == ["shadow:100"] and bad[0]["verdict"] == "rollback"
    assert any("agreement (top1)" in reason for reason in bad[0]["reasons"])
    assert {w["shadow"] for w in result["windows"]} == {True, False}
    # the shadow's own model server (the default): every window measures its CPU too
    assert all("shadow_server_cpu_s_per_s" in w for w in result["windows"])
    assert "shadow calls go to a model server of their own" in output
    assert "pinned tiny's default traffic to stable=v1" in output
    assert "requests/s open-loop" in output
    assert "## Rollout drill" in report.read_text() and plot.stat().st_size > 0
