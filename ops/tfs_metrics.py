"""TF Serving's Prometheus page (``--monitoring_config_file``, serving_config/monitoring.config):
where it is and what its request counter says, for the drills that count each replica's Predict
calls and the batch job that yields to everyone else's."""

from __future__ import annotations

import re

import requests

METRICS_PATH = "/monitoring/prometheus/metrics"
REQUEST_COUNT = re.compile(
    r'^:tensorflow:serving:request_count\{model_name="(?P<model>[^"]*)",'
    r'status="(?P<status>[^"]*)"\}\s+(?P<value>[0-9.eE+-]+)\s*$',
    re.MULTILINE,
)


def request_counts(metrics_text: str, model: str | None = None) -> dict[str, int]:
    """Return status -> count of ``model``'s requests (every model's, summed, when None) from a
    Prometheus text body."""
    counts: dict[str, int] = {}
    for m in REQUEST_COUNT.finditer(metrics_text):
        if model is None or m["model"] == model:
            counts[m["status"]] = counts.get(m["status"], 0) + int(float(m["value"]))
    return counts


def scrape(url: str, model: str | None = None, timeout_s: float = 2.0) -> dict[str, int] | None:
    """Return the request counts by status on the page ``url``, or None when it does not answer
    (or answers other than 200)."""
    try:
        reply = requests.get(url, timeout=timeout_s)
    except requests.RequestException:
        return None
    return request_counts(reply.text, model) if reply.status_code == 200 else None
