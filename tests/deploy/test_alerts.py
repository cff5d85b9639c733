"""deploy/k8s/base/monitoring: the alerting rules checked and unit-tested with promtool (Debian
package prometheus), and what the overlays provision from it (dashboard, rules, the autoscalers'
custom metrics) compared with the files."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.debian import needs
from tests.deploy.test_k8s import OVERLAYS, find, render

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base" / "monitoring"
PROMTOOL = shutil.which("promtool")
pytestmark = needs("promtool", "prometheus")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL, "promtool is not installed: `make sysdeps` (Debian package prometheus)"
    return subprocess.run(
        [PROMTOOL, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60
    )


def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", "alerts.yaml")

    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_fires_on_its_synthetic_series_and_stays_quiet_on_healthy_ones() -> None:
    result = promtool("test", "rules", "alerts_test.yaml")

    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    names = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    tests = yaml.safe_load((MONITORING / "alerts_test.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }

    assert names == fired


@pytest.fixture(scope="module", params=OVERLAYS)
def objs(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


@pytest.mark.parametrize(
    ("configmap", "file"),
    [
        ("grafana-dashboard-bert-gateway", "gateway-dashboard.json"),
        ("prometheus-rules-bert-gateway", "alerts.yaml"),
        ("prometheus-adapter-rules", "prometheus-adapter.yaml"),
    ],
)
def test_overlays_provision_the_monitoring_files(
    objs: list[dict[str, Any]], configmap: str, file: str
) -> None:
    found = find(objs, "ConfigMap", configmap)

    assert found["data"][file] == (MONITORING / file).read_text()
    if file.endswith(".json"):
        assert found["metadata"]["labels"]["grafana_dashboard"] == "1"  # Grafana's sidecar


def test_autoscalers_scale_on_metrics_the_adapter_serves(objs: list[dict[str, Any]]) -> None:
    adapter = yaml.safe_load((MONITORING / "prometheus-adapter.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]}
    wanted = {
        name: {
            m["pods"]["metric"]["name"]
            for m in find(objs, "HorizontalPodAutoscaler", name)["spec"]["metrics"]
            if m["type"] == "Pods"
        }
        for name in ("gateway", "tf-serving")
    }

    assert wanted == {"gateway": {"gateway_requests_in_flight"},
                      "tf-serving": {"tfserving_requests_per_second"}}  # fmt: skip
    assert set().union(*wanted.values()) <= served


def test_dashboard_panels_each_have_a_query_and_a_unique_title() -> None:
    dashboard = json.loads((MONITORING / "gateway-dashboard.json").read_text())
    titles = [panel["title"] for panel in dashboard["panels"]]

    assert len(titles) == len(set(titles)) >= 10
    assert all(t["expr"] for panel in dashboard["panels"] for t in panel["targets"])
