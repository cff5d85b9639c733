"""What a rollout reads from the gateways: metric snapshots, their increases, and the figures.

Two sources behind one interface (``MetricsSource.snapshot(model)``):

- ``GatewayMetrics``: the ``/metrics`` text of every gateway given, parsed with prometheus_client's
  text parser. Each series keeps the gateway it came from, so a gateway that restarts (its counters
  back at 0) is seen as a reset of its own series only.
- ``PrometheusMetrics``: the Prometheus HTTP API (``/api/v1/query``, instant queries of the same
  series summed by the labels a rollout needs), for the k8s deployment where the gateways' pods are
  not addressed one by one. Prometheus lags the gateways by up to one scrape interval.

A step's figures come from the increase of every series between two snapshots (``increase``: a
series that went down was reset, and its increase is its new value, as Prometheus's own
``increase`` counts it), summed by ``figures`` into what the decisions need: requests, errors and
the latency histogram of the stable and the new version, and the shadow comparisons of the new
version against the stable one. Metric names and labels are issue 24's contract (the gateway's
side, ``backend/metrics.py``). No TensorFlow here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests
from prometheus_client.parser import text_string_to_metric_families

from ops.modelconfig import OpsError

# default traffic only (the split): requests naming a version or a label are not the rollout's
REQUESTS = "gateway_version_requests_total"
LATENCY_BUCKET = "gateway_version_request_seconds_bucket"
SHADOW_REQUESTS = "gateway_shadow_requests_total"
AGREEMENT_SUM = "gateway_shadow_agreement_sum"
AGREEMENT_COUNT = "gateway_shadow_agreement_count"
SHADOW_QUEUE = "gateway_shadow_queue_depth"  # a gauge: read as it is, never as an increase

# sample name -> the labels the figures need (besides ``model``); the Prometheus source sums by them
NEEDED_LABELS: dict[str, tuple[str, ...]] = {
    REQUESTS: ("version", "status"),
    LATENCY_BUCKET: ("version", "le"),
    SHADOW_REQUESTS: ("served_version", "shadow_version", "outcome"),
    AGREEMENT_SUM: ("served_version", "shadow_version", "measure"),
    AGREEMENT_COUNT: ("served_version", "shadow_version", "measure"),
    SHADOW_QUEUE: ("model",),
}
# The agreement measure that decides, in this order: the first with samples (a classifier's top-1,
# an embedding model's cosine, else its multi-vector MaxSim agreement, else its sparse top-10
# overlap (backend/outputs/), a tagger's entities).
MEASURES = ("top1", "cosine", "maxsim", "sparse_overlap", "entities")

Labels = tuple[tuple[str, str], ...]
Series = tuple[str, Labels]  # (sample name, sorted label pairs)
Samples = dict[Series, float]


def series(name: str, labels: dict[str, str]) -> Series:
    """Return the key of one series."""
    return name, tuple(sorted(labels.items()))


class MetricsSource(Protocol):
    """Where a rollout reads the gateways' counters from."""

    def snapshot(self, model: str) -> Samples:
        """Return every needed series of ``model`` now; OpsError when it cannot be read."""
        ...

    def describe(self) -> str:
        """Return a few words naming the source, for the rollout's output."""
        ...


class GatewayMetrics:
    """The ``/metrics`` pages of the gateways, read directly (each one's series kept apart)."""

    def __init__(self, urls: Sequence[str], timeout_s: float = 5.0):
        self.urls = [metrics_url(u) for u in urls]
        self.timeout_s = timeout_s
        self._session = requests.Session()

    def describe(self) -> str:
        return f"/metrics of {len(self.urls)} gateway(s): {', '.join(self.urls)}"

    def snapshot(self, model: str) -> Samples:
        samples: Samples = {}
        for url in self.urls:
            try:
                reply = self._session.get(url, timeout=self.timeout_s)
                reply.raise_for_status()
            except requests.RequestException as exc:
                raise OpsError(f"cannot read {url}: {exc}") from exc
            samples.update(parse_metrics_text(reply.text, model, gateway=url))
        return samples


def metrics_url(url: str) -> str:
    """Return ``url``'s /metrics page (a bare ``http://host:port`` gets ``/metrics``)."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else f"{url}/metrics"


def parse_metrics_text(text: str, model: str, gateway: str = "") -> Samples:
    """Return the needed series of ``model`` in a Prometheus text page, labelled ``gateway``."""
    samples: Samples = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in NEEDED_LABELS or sample.labels.get("model") != model:
                    continue
                labels = dict(sample.labels, gateway=gateway) if gateway else dict(sample.labels)
                samples[series(sample.name, labels)] = float(sample.value)
    except ValueError as exc:
        raise OpsError(f"{gateway or 'metrics'}: not a Prometheus text page ({exc})") from exc
    return samples


class PrometheusMetrics:
    """The same series from a Prometheus server's HTTP API (instant queries, summed by label)."""

    def __init__(self, url: str, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = requests.Session()

    def describe(self) -> str:
        return f"Prometheus at {self.url}"

    def snapshot(self, model: str) -> Samples:
        samples: Samples = {}
        for name, by in NEEDED_LABELS.items():
            query = f"sum by ({', '.join(by)}) ({name}{{model={promql_string(model)}}})"
            for item in self.query(query):
                labels = {k: v for k, v in item.get("metric", {}).items() if k != "__name__"}
                samples[series(name, dict(labels, model=model))] = float(item["value"][1])
        return samples

    def query(self, query: str) -> list[dict[str, Any]]:
        """Return the vector an instant query answers; OpsError with Prometheus's reason."""
        try:
            reply = self._session.get(
                f"{self.url}/api/v1/query", params={"query": query}, timeout=self.timeout_s
            )
            body = reply.json()
        except (requests.RequestException, ValueError) as exc:
            raise OpsError(f"Prometheus {self.url}: {query}: {exc}") from exc
        if body.get("status") != "success":
            raise OpsError(
                f"Prometheus {self.url} refused {query}: {body.get('errorType', reply.status_code)}"
                f" {body.get('error', '')}".rstrip()
            )
        data = body.get("data", {})
        if data.get("resultType") != "vector":
            raise OpsError(f"Prometheus {self.url}: {query}: expected a vector, got {data}")
        return list(data.get("result", []))


def promql_string(value: str) -> str:
    """Return ``value`` as a PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def shadow_backlog(samples: Samples, model: str) -> float:
    """Return the shadow requests of ``model`` queued or running in every gateway now."""
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == SHADOW_QUEUE and dict(labels).get("model") == model
    )


def increase(before: Samples, after: Samples) -> Samples:
    """Return each series' increase from ``before`` to ``after`` (a series that fell was reset)."""
    out: Samples = {}
    for key, value in after.items():
        delta = value - before.get(key, 0.0)
        out[key] = value if delta < 0 else delta
    return out


# ---------------------------------------------------------------------------------------------
# the figures the decisions read


@dataclass(frozen=True)
class VersionFigures:
    """One version's requests, 5xx answers and latency histogram over a step."""

    requests: float = 0.0
    errors: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), ascending, +Inf last

    @property
    def error_rate(self) -> float | None:
        """Return errors / requests (None without requests)."""
        return self.errors / self.requests if self.requests > 0 else None

    @property
    def timed(self) -> float:
        """Return how many requests the latency histogram counted."""
        return self.buckets[-1][1] if self.buckets else 0.0

    def quantile(self, q: float) -> float | None:
        """Return the ``q`` quantile of the latency in seconds (Prometheus's histogram_quantile)."""
        return histogram_quantile(q, self.buckets)


@dataclass(frozen=True)
class ShadowFigures:
    """The shadow requests of the new version behind the stable one over a step."""

    compared: float = 0.0
    errors: float = 0.0
    dropped: float = 0.0
    agreement: dict[str, tuple[float, float]] = field(default_factory=dict)  # measure: (sum, n)

    @property
    def error_share(self) -> float | None:
        """Return the share of shadow calls that failed (dropped ones never ran: not counted)."""
        ran = self.compared + self.errors
        return self.errors / ran if ran > 0 else None

    def measure(self) -> tuple[str, float, float] | None:
        """Return (measure, mean agreement, samples) of the deciding measure, or None."""
        for name in (*MEASURES, *sorted(self.agreement)):
            total, count = self.agreement.get(name, (0.0, 0.0))
            if count > 0:
                return name, total / count, count
        return None


@dataclass(frozen=True)
class Figures:
    """A step's figures: the stable version, the new one, and the new one as a shadow."""

    stable: VersionFigures
    new: VersionFigures
    shadow: ShadowFigures


def figures(increases: Samples, model: str, stable: int, new: int) -> Figures:
    """Return the figures of ``model``'s ``stable`` and ``new`` versions from series increases."""
    requests_: dict[str, float] = {}
    errors: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    outcomes: dict[str, float] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    pair = (str(stable), str(new))
    for (name, label_pairs), value in increases.items():
        labels = dict(label_pairs)
        if labels.get("model") != model:
            continue
        version = labels.get("version", "")
        if name == REQUESTS:
            requests_[version] = requests_.get(version, 0.0) + value
            if _is_server_error(labels.get("status", "")):
                errors[version] = errors.get(version, 0.0) + value
        elif name == LATENCY_BUCKET:
            le = float(labels.get("le", "+Inf"))
            per = buckets.setdefault(version, {})
            per[le] = per.get(le, 0.0) + value
        elif (labels.get("served_version"), labels.get("shadow_version")) == pair:
            if name == SHADOW_REQUESTS:
                outcome = labels.get("outcome", "")
                outcomes[outcome] = outcomes.get(outcome, 0.0) + value
            else:
                into = sums if name == AGREEMENT_SUM else counts
                measure = labels.get("measure", "")
                into[measure] = into.get(measure, 0.0) + value

    def version_figures(v: int) -> VersionFigures:
        key = str(v)
        return VersionFigures(
            requests_.get(key, 0.0),
            errors.get(key, 0.0),
            tuple(sorted(buckets.get(key, {}).items())),
        )

    shadow = ShadowFigures(
        compared=outcomes.get("compared", 0.0),
        errors=outcomes.get("error", 0.0),
        dropped=outcomes.get("dropped", 0.0),
        agreement={m: (sums.get(m, 0.0), n) for m, n in counts.items()},
    )
    return Figures(version_figures(stable), version_figures(new), shadow)


def _is_server_error(status: str) -> bool:
    return status.isdigit() and int(status) >= 500


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Return the ``q`` quantile of cumulative ``buckets`` as Prometheus computes it.

    Linear interpolation inside the bucket holding the rank; a rank in the +Inf bucket answers the
    largest finite bound (the histogram cannot say more). None without observations.
    """
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower
