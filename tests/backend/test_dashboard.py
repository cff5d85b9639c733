"""Every dashboard panel's query returns data on a real Prometheus (Debian package prometheus)
scraping a real gunicorn gateway and a real model server (batching and monitoring on) under a
short load; the autoscalers' adapter queries and the alert rules load there too.

With OBSERVABILITY_FIGURES=<dir> the panels are also rendered to <dir>/dashboard.png from
Prometheus's query_range answers (matplotlib; docs/images/dashboard.png is made so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import requests
import yaml

from ops.modelconfig import OpsError
from ops.procs import REPO, ServerProcess, free_port
from ops.rollout.metrics import GatewayMetrics, PrometheusMetrics, figures
from tests.backend.conftest import EMBED, INTENT
from tests.backend.stack import Gateway, ModelServer, gateway_env
from tests.debian import needs

MONITORING = REPO / "deploy" / "k8s" / "base" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
pytestmark = needs("prometheus", "prometheus")
LOAD_S = 12.0


class Prometheus:
    """``prometheus`` scraping the given jobs every second, with the stack's alert rules."""

    def __init__(self, jobs: dict[str, tuple[str, str]], workdir: Path) -> None:
        assert PROMETHEUS, "prometheus is not installed: `make sysdeps` (Debian package prometheus)"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(MONITORING / "alerts.yaml")],
            "scrape_configs": [
                {"job_name": job, "metrics_path": path, "static_configs": [{"targets": [target]}]}
                for job, (target, path) in jobs.items()
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.process = ServerProcess(
            [
                PROMETHEUS, f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
            ],
            workdir / "prometheus.log",
        )  # fmt: skip
        self.process.wait_until(self._ready, 60)

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=1).ok
        except requests.RequestException:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Return an instant query's result (asserting Prometheus accepted it)."""
        reply = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = reply.json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        reply = requests.get(
            f"{self.url}/api/v1/query_range",
            params={"query": expr, "start": start, "end": end, "step": 1},
            timeout=10,
        )
        result: list[dict[str, Any]] = reply.json()["data"]["result"]
        return result

    def stop(self) -> None:
        self.process.stop()


class Monitored(NamedTuple):
    prometheus: Prometheus
    started: float  # the load's start and end (time.time())
    ended: float
    gateway: Gateway  # the gateway Prometheus scraped (v1 serves INTENT, v2 shadows it)


def _load(gateway: Gateway, seconds: float) -> None:
    """Send classify (default: v1 serves, v2 shadows; and v2), embed and probe requests."""
    stop = time.monotonic() + seconds
    calls = [
        (f"/v1/models/{INTENT}:classify", {"texts": ["hello world", "my card was charged"]}),
        (f"/v1/models/{INTENT}:classify", {"texts": ["where is my package"], "version": 2}),
        (f"/v1/models/{EMBED}:embed", {"texts": ["hello world"]}),
    ]

    def worker(index: int) -> None:
        with requests.Session() as session:
            n = index
            while time.monotonic() < stop:
                path, body = calls[n % len(calls)]
                session.post(f"{gateway.url}{path}", json=body, timeout=30).raise_for_status()
                if n % 20 == 0:
                    session.get(f"{gateway.url}/readyz", timeout=10)
                n += 1

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(worker, range(6)))


@pytest.fixture(scope="module")
def monitored(
    model_base: Path, config_file: Path, log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Monitored]:
    """Yield Prometheus after a short load on a gateway and a batching model server, with the
    load's start and end times and the gateway it scraped."""
    work = tmp_path_factory.mktemp("prometheus")
    config = REPO / "serving_config"
    server = ModelServer(config_file, log_dir, extra_flags=(
        "--enable_batching", f"--batching_parameters_file={config / 'batching_parameters.txt'}",
        f"--monitoring_config_file={config / 'monitoring.config'}",
    ))  # fmt: skip
    gateway = prometheus = None
    try:
        server.wait_available(INTENT, 2)
        server.wait_available(EMBED, 1)
        routing_file = work / "routing.yaml"
        routing_file.write_text(f"{INTENT}:\n  weights: {{1: 1}}\n  shadow: {{version: 2}}\n")
        env = {
            **gateway_env(server, "grpc", model_base, config_file),
            "GATEWAY_ROUTING_FILE": str(routing_file),
            "GATEWAY_SHADOW_QUEUE": "16",
        }
        gateway = Gateway(env, log_dir, workers=2)
        prometheus = Prometheus({
            "gateway": (f"127.0.0.1:{gateway.port}", "/metrics"),
            "tf-serving": (f"127.0.0.1:{server.rest_port}", "/monitoring/prometheus/metrics"),
        }, work)  # fmt: skip
        started = time.time()
        _load(gateway, LOAD_S)
        ended = time.time()
        time.sleep(3)  # the last scrapes
        yield Monitored(prometheus, started, ended, gateway)
    finally:
        for process in (prometheus, gateway, server):
            if process is not None:
                process.stop()


def _targets() -> list[tuple[str, str]]:
    dashboard = json.loads((MONITORING / "gateway-dashboard.json").read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def test_every_dashboard_query_returns_data(monitored: Monitored) -> None:
    prometheus = monitored[0]
    empty = []
    for title, expr in _targets():
        result = prometheus.query(expr)
        values = [float(series["value"][1]) for series in result]
        if not values or all(v != v for v in values):  # nothing, or only NaN
            empty.append(f"{title}: {expr}")

    assert not empty, "panels without data:\n" + "\n".join(empty)
    _figures(monitored)


def test_the_autoscalers_adapter_queries_return_data_per_target(
    monitored: Monitored,
) -> None:
    prometheus = monitored[0]
    adapter = yaml.safe_load((MONITORING / "prometheus-adapter.yaml").read_text())
    for rule in adapter["rules"]:
        name = rule["name"]["matches"].strip("^$")
        expr = (
            rule["metricsQuery"].replace("<<.Series>>", f'{{__name__="{name}"}}')
            .replace("{{__name__", "{__name__").replace("}{<<.LabelMatchers>>}", ',job!=""}')
            .replace("<<.GroupBy>>", "instance")
        )  # fmt: skip
        result = prometheus.query(expr)
        assert result, expr


def test_the_alert_rules_load_and_none_fires_on_a_healthy_stack(
    monitored: Monitored,
) -> None:
    prometheus = monitored[0]
    groups = requests.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]

    alerts = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
    assert len(rules) == sum(len(group["rules"]) for group in alerts) >= 8, rules
    assert all(rule["health"] == "ok" for rule in rules), rules
    assert not [rule["name"] for rule in rules if rule["state"] == "firing"]


def _figures(monitored: Monitored) -> None:
    """Render every panel from query_range answers into $OBSERVABILITY_FIGURES/dashboard.png."""
    where = os.environ.get("OBSERVABILITY_FIGURES")
    if not where:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prometheus, started, ended, _ = monitored
    dashboard = json.loads((MONITORING / "gateway-dashboard.json").read_text())
    panels = dashboard["panels"]
    rows = (len(panels) + 1) // 2
    figure, axes = plt.subplots(rows, 2, figsize=(14, 2.6 * rows))
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            for series in prometheus.query_range(target["expr"], started, ended + 3):
                label = target["legendFormat"]
                for key, value in series["metric"].items():
                    label = label.replace("{{" + key + "}}", value)
                label = re.sub(r"\{\{\w+\}\}", "(none)", label)
                xs = [float(t) - started for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, label=label[:40])
        ax.set_title(panel["title"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlabel(f"s ({panel['fieldConfig']['defaults']['unit']})", fontsize=7)
        ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    figure.suptitle(dashboard["title"] + " (a 12 s load on tiny models, scraped every 1 s)")
    figure.tight_layout(rect=(0, 0, 1, 0.98))
    Path(where).mkdir(parents=True, exist_ok=True)
    figure.savefig(Path(where) / "dashboard.png", dpi=80)
    plt.close(figure)


def test_the_rollouts_prometheus_source_reads_what_the_gateway_counts(
    monitored: Monitored,
) -> None:
    """ops.rollout's Prometheus source (real PromQL on the real Prometheus that scraped the
    gateway) and its gateway source (the gateway's own /metrics page) read the same figures of
    the load: the default traffic v1 served, the shadow comparisons v2 made, their agreement and
    the latency buckets (the load is over and scraped: the counters stand still)."""
    prometheus, _, _, gateway = monitored
    direct = GatewayMetrics([gateway.url]).snapshot(INTENT)
    scraped = PrometheusMetrics(prometheus.url).snapshot(INTENT)
    read = figures(direct, INTENT, 1, 2), figures(scraped, INTENT, 1, 2)
    assert read[0].stable.requests > 0 and read[0].shadow.compared > 0, read[0]
    assert read[1] == read[0]
    # series by series, the gateway label summed away as Prometheus sums its instances
    summed: dict[object, float] = {}
    for (name, labels), value in direct.items():
        key = (name, tuple(pair for pair in labels if pair[0] != "gateway"))
        summed[key] = summed.get(key, 0.0) + value
    assert scraped == summed


def test_the_rollouts_prometheus_source_reports_a_refused_query(monitored: Monitored) -> None:
    with pytest.raises(OpsError, match="bad_data"):
        PrometheusMetrics(monitored.prometheus.url).query("sum by (version (")
