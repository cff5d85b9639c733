"""The reload and fault drills, run small against their own throw-away stacks (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backend.clients.grpc_client import CHANNEL_OPTIONS
from ops.drills import common as drills
from ops.drills import fault as fault_drill
from ops.drills.common import Answer
from ops.procs import REPO, child_env
from tests.ops.conftest import MODEL


def run_drill(
    script: str, out: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], str]:
    """Run a drill script (``env`` on top of its environment: the GATEWAY_* settings its gateway
    and its push_model read); return its exit status, its JSON result and its output."""
    cmd = [sys.executable, f"scripts/{script}", "--json", str(out), *args]
    # A drill stopped at the timeout is interrupted first (SIGINT: its finally blocks stop the
    # model servers and gunicorns it spawned in their own sessions), then its group is killed,
    # rather than leaving its servers to load the rest of the suite.
    drill = subprocess.Popen(
        cmd, cwd=REPO, env=child_env(**(env or {})), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = drill.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        drill.send_signal(signal.SIGINT)
        try:
            stdout, stderr = drill.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(drill.pid, signal.SIGKILL)
            stdout, stderr = drill.communicate()
        pytest.fail(f"{script} ran past 280 s:\n{(stdout + stderr)[-3000:]}")
    output = stdout + stderr
    assert out.is_file(), output[-3000:]
    return drill.returncode, json.loads(out.read_text()), output


# How soon a label move is seen (the drill checks 3 s, its --switch-bound) is this machine's
# figure: reported (switch_delay_s) and held here to 3x that bound; asserted are the behaviours:
# every switch seen, no request failed, no version unloaded under a cached label.
SWITCH_BOUND_S = 9.0


@pytest.mark.slow
def test_reload_drill_under_load_has_no_failed_request(
    tiny_exports: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    # The promote unloads v2 push_model's reader wait after stable moved: the gateway's label
    # staleness plus GATEWAY_TIMEOUT_S (a request that resolved v2 just before ends within it),
    # 12 s at the default 10 s. Tiny models answer in milliseconds: 4 s here, for the drill's
    # gateway and its push_model alike, waits 6 s.
    code, result, output = run_drill(
        "reload_drill.py", tmp_path / "drill.json", "--spawn", str(tiny_exports),
        "--model", MODEL, "--clients", "4", "--pace", "0.05", "--duration", "15",
        env={"GATEWAY_TIMEOUT_S": "4"},
    )  # fmt: skip
    record_property("switch_delay_s", result["switch_delay_s"])
    untimed = {k: ok for k, ok in result["checks"].items() if not k.startswith("each switch")}
    assert untimed and all(untimed.values()), output[-4000:]
    delays = result["switch_delay_s"].values()
    assert delays and all(d is not None and d <= SWITCH_BOUND_S for d in delays), delays
    assert code in (0, 1)  # 1: only a switch seen later than the drill's own 3 s (reported)
    assert result["counts"]["requests"] > 0 and "failed" not in result["counts"]
    assert "Timeline" in output and "rollback stable" in output
    # Two pushes on top of v2: v3 and v4 answered at some point. The promote moved stable 2 -> 4
    # and v2 was unloaded per the policy; the rollback returns stable to v2, its value before
    # the promote (not v3, a canary never promoted), so v2 is loaded again.
    assert {"version 3", "version 4"} <= set(result["counts"])
    assert 2 in result["available_at_end"]
    # v2 lost its label in the promote and was unloaded only after the readers' wait (6 s: the
    # label staleness bound and GATEWAY_TIMEOUT_S; a lower bound, which load can only raise)
    gaps = result["unloaded_after_label_moved_s"]
    assert set(gaps) == {"2"} and gaps["2"] >= 5.0, gaps


def test_unload_gap_runs_from_the_label_moving_off_to_the_last_available_sighting() -> None:
    monitor = drills.StatusMonitor(None, MODEL)  # type: ignore[arg-type]  # never polled
    monitor.seen = [(0.0, frozenset({2, 3})), (5.0, frozenset({2, 3})), (5.1, frozenset({3}))]
    monitor.labelled = [(0.0, frozenset({2, 3})), (1.0, frozenset({3})), (5.0, frozenset({3}))]
    assert monitor.unload_gaps() == {2: 4.0}
    # A label still named v2 in the last config read before it went: no gap at all.
    monitor.labelled = [(0.0, frozenset({2, 3})), (5.0, frozenset({2, 3})), (5.1, frozenset({3}))]
    assert monitor.unload_gaps()[2] < 0


def test_an_answer_is_judged_by_the_sightings_around_it_however_slowly_the_monitor_polls() -> None:
    monitor = drills.StatusMonitor(None, MODEL)  # type: ignore[arg-type]  # never polled
    # a monitor slowed to one sighting every 2 s: v3 appears in the first one after the answer
    monitor.seen = [(0.0, frozenset({2})), (2.0, frozenset({2})), (4.0, frozenset({2, 3}))]
    assert monitor.available_during(3, 2.5, 2.6, 0.3)
    assert monitor.available_during(2, 2.5, 2.6, 0.3)
    # an answer from a version no sighting near it had: not AVAILABLE
    assert not monitor.available_during(5, 2.5, 2.6, 0.3)
    # v3 was gone two sightings before the answer: not AVAILABLE then
    monitor.seen = [(0.0, frozenset({3})), (1.0, frozenset()), (2.0, frozenset()),
                    (4.0, frozenset())]  # fmt: skip
    assert not monitor.available_during(3, 2.5, 2.6, 0.3)


FAULT_TIMEOUT_S = 2.0
# The slow phase holds replies past twice the timeout, the bound a 504 is held to below: a 504
# at the timeout passes it, one that came only with the held reply fails it.
FAULT_DELAY_S = 3 * FAULT_TIMEOUT_S


@pytest.mark.slow
def test_fault_drill_kill_and_slow_model_server(
    tiny_exports: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    _code, result, output = run_drill(
        "fault_drill.py", tmp_path / "fault.json", "--spawn", str(tiny_exports),
        "--model", MODEL, "--clients", "4", "--timeout", f"{FAULT_TIMEOUT_S:g}", "--down", "2",
        "--slow-delay", f"{FAULT_DELAY_S:g}", "--slow-for", "5", "--steady", "2",
    )  # fmt: skip
    figures = result["figures"]
    # Reported, not asserted: the drill's own timing checks (504s between the timeout - 0.2 s
    # and + 1 s, serving again within its bounds, no pile-up, no request hung) measure this
    # machine; its report keeps them. Asserted: what each figure shows of the behaviour, at 2-3x
    # the floor a loaded machine can't go below (the 2 s timeout, the recovery bounds).
    for name, ok in result["checks"].items():
        record_property(f"check: {name}", ok)
    for name, value in figures.items():
        record_property(name, value)
    failed = [name for name, ok in result["checks"].items() if not ok and not _timed(name)]
    assert not failed, f"{failed}\n{output[-4000:]}"
    timeout_s, (restart_bound, fast_bound) = (
        FAULT_TIMEOUT_S,
        figures["recovery bounds: after return / after delay removed (s)"],
    )
    early_504, late_504 = figures["slow: 504 latency min/max (s)"]
    assert early_504 >= timeout_s - 0.2, figures  # never before the timeout: load only delays
    # at the timeout (and no pile-up), not when the held reply came (the 6 s delay)
    assert late_504 <= 2 * timeout_s < FAULT_DELAY_S, figures
    assert figures["kill: slowest answer while down (s)"] <= 2 * timeout_s, figures
    assert figures["slowest answer overall (s)"] <= 3 * timeout_s, figures  # none hung
    assert 0 <= figures["kill: serving again after return (s)"] <= 2 * restart_bound, figures
    assert 0 <= figures["slow: serving again after delay removed (s)"] <= 2 * fast_bound, figures


def test_the_fault_drill_refuses_a_delay_it_could_not_tell_from_the_timeout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        fault_drill.parse_args(["--timeout", "2", "--slow-delay", "3"])

    assert "--slow-delay 3 must exceed --timeout 2" in capsys.readouterr().err
    assert fault_drill.parse_args(["--timeout", "2", "--slow-delay", "3.5"]).slow_delay == 3.5


def _timed(check: str) -> bool:
    """Whether one of the fault drill's checks is a timing bound of this machine (reported)."""
    return check.startswith(("kill: no answer slower", "kill: serving again within",
                             "slow: 504s come at", "slow: no pile-up",
                             "slow: serving again within", "no request hung"))  # fmt: skip


def kill_phase_answers(recovered_after_s: float) -> tuple[list[Answer], dict[str, float]]:
    """Return answers of a kill phase whose first success after the return is that late."""
    kill = {"killed": 10.0, "restarted": 12.0, "returned": 15.0, "end": 30.0}
    answers = [Answer(0, "", t, t + 0.01, 200, 1) for t in (8.0, 9.0)]
    answers += [Answer(0, "", t, t + 0.01, 503, None, "unavailable") for t in (10.5, 14.0, 15.1)]
    back = kill["returned"] + recovered_after_s
    answers += [Answer(0, "", back - 0.1, back, 200, 1), Answer(0, "", 29.0, 29.1, 200, 1)]
    return answers, kill


@pytest.mark.parametrize("late_by_s", [-0.5, 0.5])
def test_fault_drill_recovery_check_fails_past_the_backoff_and_timeout_bound(
    late_by_s: float,
) -> None:
    timeout_s = 2.0
    bound, _ = fault_drill.recovery_bounds(timeout_s)
    backoff_s = dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] / 1000
    assert bound == pytest.approx(backoff_s * 1.2 + timeout_s + fault_drill.MARGIN_S)
    answers, kill = kill_phase_answers(bound + late_by_s)
    slow = {"slow_from": 40.0, "fast_from": 45.0, "end": 50.0}
    result = fault_drill.evaluate(answers, [], kill, slow, {1}, {1}, timeout_s)
    check = next(name for name in result["checks"] if name.startswith("kill: serving again"))
    assert result["checks"][check] is (late_by_s < 0)
