"""The rolling drill, run short on tiny exports (real processes): replicas come and go, one hangs,
one answers slowly, a push and a rollback run, and no client request fails (issue 20's drill)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ops.drills import rolling as rolling_drill
from tests.ops.conftest import MODEL
from tests.ops.test_drills import run_drill

# The hang (6 s) outlasts the gateway's deadline: a request left waiting on the hung replica
# fails, so the drill sees a gateway that does not route around it (at the default 10 s it would
# only be slow, and pass).
GATEWAY_TIMEOUT_S = 4


def test_the_probe_timeout_default_is_the_gateways_readiness_probe() -> None:
    import yaml

    gateway = yaml.safe_load(
        (rolling_drill.REPO / "deploy" / "k8s" / "base" / "gateway.yaml")
        .read_text()
        .split("---")[0]
    )
    (container,) = gateway["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["timeoutSeconds"] == rolling_drill.PROBE_TIMEOUT_S


@pytest.mark.slow
def test_rolling_drill_has_no_failed_request(
    tiny_exports: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    # /readyz is probed with 3x the readiness probe's timeout: that every probe answers 200 is
    # asserted, how fast is this machine's figure (readyz_max_s, reported; `make drills` and the
    # drill's report keep the probe's own timeout)
    probe_timeout_s = 3 * rolling_drill.PROBE_TIMEOUT_S
    # Two replicas, the fewest the drill takes (one hangs while the other and the slow one
    # serve): each replacement is a model server started and loaded under load (~15-35 s on 2
    # busy cores), and a third one only repeats the second. 1 s of load between steps: every
    # step itself runs under the load, the gaps only separate them on the timeline. The clients
    # are paced (a request each 50 ms: 120 a second) rather than back to back: every step still
    # runs under load, and the replicas it starts load on cores the load leaves them.
    code, result, output = run_drill(
        "rolling_drill.py", tmp_path / "rolling.json", "--spawn", str(tiny_exports),
        "--model", MODEL, "--replicas", "2", "--clients", "6", "--pace", "0.05", "--gap", "1",
        "--hang", "6", "--slow-for", "5", "--slow-delay", "2",
        "--probe-timeout", str(probe_timeout_s),
        env={"GATEWAY_TIMEOUT_S": str(GATEWAY_TIMEOUT_S)},
    )  # fmt: skip
    record_property("readyz_max_s", result["readyz_max_s"])
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed, f"{failed}\n{output[-5000:]}"
    assert code == 0
    assert result["counts"]["requests"] > 0 and "failed" not in result["counts"]
    assert all(result["by_kind"].values()), result["by_kind"]  # every kind of request answered
    assert {"version 1", "version 2"} <= set(result["counts"])
    assert "hang r" in output and "rollback canary" in output
    # both original replicas were replaced, and each replacement served (a check above)
    assert len(result["replicas"]) == 5, result["replicas"]  # 2, their 2 replacements, the slow
    assert sum(name.startswith("replace ") for name in result["steps"]) == 2, result["steps"]
