"""/metrics on a port of its own (GATEWAY_METRICS_BIND, issue 34 item 8): a real gunicorn binds
both; the API port answers /metrics with a 404, the metrics port answers nothing else, so a
NetworkPolicy on the port (deploy/k8s/base/networkpolicy.yaml) decides who reads the metrics."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from ops.procs import free_port
from tests.backend.stack import Gateway, gateway_env


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, str]]:
    logs = tmp_path_factory.mktemp("metrics-port")
    metrics_url = f"http://127.0.0.1:{free_port()}"
    env = gateway_env(None, "grpc", logs, logs)
    env.update(GATEWAY_MODEL_CONFIG_FILE="", GATEWAY_METRICS_BIND=metrics_url[len("http://") :])
    gateway = Gateway(env, logs, workers=1)
    yield gateway, metrics_url
    gateway.stop()


def test_metrics_are_served_on_the_metrics_port_only(split: tuple[Gateway, str]) -> None:
    gateway, metrics_url = split

    on_api = requests.get(f"{gateway.url}/metrics", timeout=10)
    on_metrics = requests.get(f"{metrics_url}/metrics", timeout=10)

    assert on_api.status_code == 404 and on_api.json()["error"]["code"] == "not_found"
    assert on_metrics.status_code == 200 and "gateway_requests_total" in on_metrics.text


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/healthz"), ("GET", "/v1/models"), ("POST", "/v1/models/x:classify"),
     ("GET", "/openapi.json")],
)  # fmt: skip
def test_the_metrics_port_serves_nothing_else(
    split: tuple[Gateway, str], method: str, path: str
) -> None:
    gateway, metrics_url = split

    there = requests.request(method, f"{metrics_url}{path}", json={}, timeout=10)
    api = requests.request(method, f"{gateway.url}{path}", json={}, timeout=10)

    assert there.status_code == 404 and there.json()["error"]["code"] == "not_found"
    assert api.status_code != 404 or path.endswith(":classify")  # the API port serves them
