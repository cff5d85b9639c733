"""scripts/rollout.py as a process: killed (SIGKILL) at each step and resumed, Ctrl-C, --revert, and
a promotion through push_model's label move against a real model server (tests/ops/conftest.py).

The gateway is test_rollout's scripted ``FakeGateway`` (real HTTP, counters that follow the routing
file). In the kill tests v2 fails under full load, so the resumed run ends rolled back at the last
step without importing TensorFlow; the promotion test moves the label for real.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from modelformat import routing as routing_format
from modelformat import serverconfig
from modelformat.routing import ModelRoute
from ops.lifecycle import labelhistory
from ops.procs import REPO, child_env
from ops.rollout import engine as rollout
from tests.ops.conftest import MODEL, OpsServer
from tests.ops.test_rollout import STEP_ROUTES, Behaviour, FakeGateway


def config_text(server: OpsServer) -> str:
    """Return a models.config for the server's tiny v1 + v2: stable=1, canary=2."""
    return (
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{server.base_path / MODEL}" '
        'model_platform: "tensorflow" '
        "model_version_policy { specific { versions: 1 versions: 2 } } "
        'version_labels { key: "stable" value: 1 } '
        'version_labels { key: "canary" value: 2 } } }\n'
    )


@pytest.fixture
def serving(tmp_path: Path, two_versions_server: OpsServer) -> Path:
    config_dir = tmp_path / "serving_config"
    config_dir.mkdir()
    (config_dir / "models.config").write_text(config_text(two_versions_server))
    return config_dir


@pytest.fixture
def gateway(serving: Path) -> Iterator[FakeGateway]:
    fake = FakeGateway(serving / "routing.yaml", batch=100)
    # v2 is fine until it serves all default traffic: the rollout ends rolled back at step 100
    fake.versions[2] = Behaviour(error_rate=0.3, errors_from_share=1.0)
    yield fake
    fake.close()


def command(
    serving: Path, gateway: FakeGateway, server: OpsServer, *extra: str, hold_s: float = 0.5
) -> list[str]:
    return [
        sys.executable, "scripts/rollout.py", "--name", MODEL, "--version", "2",
        "--gateway", gateway.url, "--server", server.grpc_target,
        "--config", str(serving / "models.config"), "--base-path", str(server.base_path),
        "--log", str(serving / "rollout.jsonl"), "--hold-s", str(hold_s), "--poll-s", "0.05",
        "--reader-wait", "0.1", "--min-samples", "40", "--step-timeout", "30", "--timeout", "60",
        *extra,
    ]  # fmt: skip


def state(serving: Path) -> dict[str, Any] | None:
    path = rollout.state_path_for(serving / "routing.yaml")
    try:
        return dict(json.loads(path.read_text())["rollouts"][MODEL])
    except (FileNotFoundError, KeyError, ValueError):
        return None


def _ctrl_c_as_in_a_terminal() -> None:
    # A test run started in the background (`make test &`, nohup, some CI runners) hands its
    # children SIGINT ignored, and Python then keeps ignoring it: Ctrl-C would never arrive.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_until_live(cmd: list[str], serving: Path, step: int) -> subprocess.Popen[str]:
    """Start the rollout; return it once the state says ``step`` is live (mid-hold)."""
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=child_env(PYTHONFAULTHANDLER="1"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=_ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        now = state(serving)
        if now and now["step"] == step and now["live_at"] is not None:
            return proc
        if now and now["step"] > step:
            break
        time.sleep(0.01)
    proc.kill()
    out, _ = proc.communicate()
    raise AssertionError(f"the rollout never held step {step} (rc {proc.returncode}):\n{out}")


def route_now(serving: Path) -> ModelRoute | None:
    return routing_format.parse((serving / "routing.yaml").read_text()).route(MODEL)


def events(serving: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (serving / "rollout.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("step", range(5))
def test_a_rollout_killed_at_any_step_resumes_there(
    serving: Path, gateway: FakeGateway, two_versions_server: OpsServer, step: int
) -> None:
    cmd = command(serving, gateway, two_versions_server)
    proc = start_until_live(cmd, serving, step)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert route_now(serving) == STEP_ROUTES[step]  # the step it was killed at is still owned
    assert state(serving)["step"] == step  # type: ignore[index]

    again = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert again.returncode == rollout.EXIT_ROLLED_BACK, again.stdout + again.stderr
    assert f"resuming the rollout of tiny v2 at step {step + 1}/5" in again.stdout
    resumed = events(serving)
    after = resumed[max(i for i, e in enumerate(resumed) if e["event"] == "resume") :]
    decided = [(e["step_index"], e["verdict"]) for e in after if e["event"] == "decision"]
    assert decided == [*((i, "go") for i in range(step, 4)), (4, "rollback")]
    assert after[-1]["event"] == "rolled_back"
    assert route_now(serving) == ModelRoute(((1, 100.0),))
    assert state(serving) is None


def test_ctrl_c_leaves_a_state_that_resumes_or_reverts(
    serving: Path, gateway: FakeGateway, two_versions_server: OpsServer
) -> None:
    cmd = command(serving, gateway, two_versions_server, hold_s=5)
    proc = start_until_live(cmd, serving, 0)
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # where it hangs: faulthandler dumps every thread on SIGABRT
        proc.send_signal(signal.SIGABRT)
        out, _ = proc.communicate(timeout=30)
        raise AssertionError(f"no exit 30 s after Ctrl-C:\n{out}") from None
    assert proc.returncode == rollout.EXIT_INTERRUPTED, out
    assert "run the same command again to resume, or add --revert" in out
    assert route_now(serving) == STEP_ROUTES[0]
    assert state(serving)["step"] == 0  # type: ignore[index]

    other = subprocess.run(
        [*cmd, "--steps", "shadow:100,100"], cwd=REPO, env=child_env(), capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert other.returncode == rollout.EXIT_ERROR
    assert "to resume, or with --revert" in other.stderr

    reverted = subprocess.run(
        [*cmd, "--revert"], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert reverted.returncode == rollout.EXIT_ROLLED_BACK, reverted.stdout + reverted.stderr
    assert route_now(serving) == ModelRoute(((1, 100.0),))
    assert state(serving) is None
    assert events(serving)[-1]["event"] == "reverted"


def test_a_good_version_is_promoted_through_push_models_label_move(
    serving: Path, gateway: FakeGateway, two_versions_server: OpsServer
) -> None:
    gateway.versions[2] = Behaviour()
    cmd = command(serving, gateway, two_versions_server, "--steps", "shadow:100,100", hold_s=0.3)
    done = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=240
    )
    assert done.returncode == rollout.EXIT_PROMOTED, done.stdout + done.stderr
    labels = serverconfig.version_labels(serverconfig.read(serving / "models.config"))
    assert labels[MODEL] == {"stable": 2, "canary": 2}
    history = labelhistory.load(labelhistory.history_path_for(serving / "models.config"))
    assert history[MODEL]["stable"] == [1, 2]
    assert route_now(serving) is None
    assert state(serving) is None
