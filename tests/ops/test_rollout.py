"""ops.rollout: steps, decisions from scripted metrics, the gateway metric source, state, --revert.

The metrics come from ``FakeGateway``: a real HTTP server whose ``/metrics`` page (written with
prometheus_client, the names of issue 24's contract) grows on every read by a batch of requests
split the way the routing file says now, each version answering as scripted (errors, latency,
agreement as a shadow). The label move is injected here (a recorder); the real one through
push_model against a model server is in test_rollout_resume.py; the Prometheus source against a
real Prometheus scraping a real gateway is in tests/backend/test_dashboard.py. No TensorFlow.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from modelformat import routing as routing_format
from modelformat.routing import ModelRoute, Shadow
from ops.modelconfig import OpsError
from ops.rollout import engine as rollout
from ops.rollout.decisions import (
    GO,
    HOLD,
    ROLLBACK,
    Reference,
    Step,
    Thresholds,
    decide,
    parse_steps,
)
from ops.rollout.metrics import (
    Figures,
    GatewayMetrics,
    ShadowFigures,
    VersionFigures,
    figures,
    histogram_quantile,
    increase,
)

MODEL = "tiny"
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
CONFIG = (
    'model_config_list { config { name: "tiny" base_path: "/models/tiny" model_platform: '
    '"tensorflow" model_version_policy { specific { versions: 1 versions: 2 } } '
    'version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } } }\n'
)


# ---------------------------------------------------------------------------------------------
# a scripted gateway


@dataclass
class Behaviour:
    """How one version answers: 5xx share, latency, and agreement with v1 when it shadows."""

    error_rate: float = 0.0
    latency_s: float = 0.008
    agreement: float = 1.0
    # share of the default traffic from which on the error rate applies (a version that
    # breaks only under full load)
    errors_from_share: float = 0.0


@dataclass
class FakeGateway:
    """A gateway's /metrics over HTTP, advancing by ``batch`` default requests per read."""

    routing_path: Path
    versions: dict[int, Behaviour] = field(default_factory=lambda: {1: Behaviour(), 2: Behaviour()})
    batch: int = 200
    measure: str = "top1"
    routes_seen: list[ModelRoute | None] = field(default_factory=list)
    # reads during which a shadow backlog drains after the shadow goes (0: none): the queued
    # shadows load the model server, so the new version answers slowly meanwhile
    backlog_reads: int = 0
    backlog: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "gateway_version_requests_total", "", ["model", "version", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.seconds = Histogram(
            "gateway_version_request_seconds", "", ["model", "version"], buckets=BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.shadow = Counter(
            "gateway_shadow_requests_total", "",
            ["model", "served_version", "shadow_version", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.agreement = Histogram(
            "gateway_shadow_agreement", "",
            ["model", "served_version", "shadow_version", "measure"], registry=self.registry,
            buckets=(0.5, 0.9, 1.0),
        )  # fmt: skip
        self.depth = Gauge("gateway_shadow_queue_depth", "", ["model"], registry=self.registry)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def page(self) -> bytes:
        """Serve one batch as the routing file says now; return the exposition text."""
        with self.lock:
            route = routing_format.parse(self.routing_path.read_text()).route(MODEL) if (
                self.routing_path.exists()
            ) else None  # fmt: skip
            if not self.routes_seen or self.routes_seen[-1] != route:
                last = self.routes_seen[-1] if self.routes_seen else None
                if last is not None and last.shadow is not None and route and not route.shadow:
                    self.backlog = self.backlog_reads
                self.routes_seen.append(route)
            self.depth.labels(MODEL).set(self.backlog)
            if route is not None:
                self.serve(route)
            self.backlog = max(0, self.backlog - 1)
            return generate_latest(self.registry)

    def serve(self, route: ModelRoute) -> None:
        for version, _ in route.weights:
            share = route.share(version)
            n = round(self.batch * share)
            how = self.versions[version]
            if self.backlog and version != 1:
                how = replace(how, latency_s=0.3)  # queued behind the draining shadows
            errors = round(n * how.error_rate) if share >= how.errors_from_share else 0
            for status, count in (("200", n - errors), ("503", errors)):
                if count:
                    self.requests.labels(MODEL, str(version), status).inc(count)
            for _ in range(n):
                self.seconds.labels(MODEL, str(version)).observe(how.latency_s)
        if route.shadow is not None and route.weights:
            served = route.weights[0][0]
            how = self.versions[route.shadow.version]
            n = round(self.batch * route.shadow.share)
            pair = (MODEL, str(served), str(route.shadow.version))
            agreeing = round(n * how.agreement)
            self.shadow.labels(*pair, "compared").inc(n)
            for i in range(n):
                value = 1.0 if i < agreeing else 0.0
                if self.measure == "cosine":
                    value = how.agreement
                self.agreement.labels(*pair, self.measure).observe(value)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = gateway.page()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def serving(tmp_path: Path) -> Path:
    """Return a serving_config directory with a models.config: stable=1, canary=2."""
    config_dir = tmp_path / "serving_config"
    config_dir.mkdir()
    (config_dir / "models.config").write_text(CONFIG)
    return config_dir


@pytest.fixture
def gateway(serving: Path) -> Iterator[FakeGateway]:
    fake = FakeGateway(serving / "routing.yaml")
    yield fake
    fake.close()


# ---------------------------------------------------------------------------------------------
# steps and decisions


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("shadow:100,5,25,50,100", [Step(100, True), Step(5, False), Step(25, False),
                                    Step(50, False), Step(100, False)]),
        (" shadow:50 , 100 ", [Step(50, True), Step(100, False)]),
        ("12.5%", [Step(12.5, False)]),
    ],
)  # fmt: skip
def test_parse_steps_reads_shadow_and_weighted_steps(text: str, steps: list[Step]) -> None:
    assert list(parse_steps(text)) == steps


@pytest.mark.parametrize("text", ["", "0", "101", "shadow:", "half", "5,,10", "shadow:-1"])
def test_parse_steps_refuses_a_bad_step_naming_it(text: str) -> None:
    with pytest.raises(OpsError, match="--steps"):
        parse_steps(text)


@pytest.mark.parametrize(
    ("step", "route"),
    [
        (Step(100, True), ModelRoute(((1, 100.0),), Shadow(2, 1.0))),
        (Step(5, False), ModelRoute(((1, 95.0), (2, 5.0)))),
        (Step(100, False), ModelRoute(((2, 100.0),))),
    ],
)
def test_each_step_routes_default_traffic_as_it_says(step: Step, route: ModelRoute) -> None:
    assert step.route(1, 2) == route


def version(requests: int, errors: int = 0, latency_s: float = 0.008) -> VersionFigures:
    """Return figures of ``requests`` all taking ``latency_s``."""
    buckets = tuple((le, float(requests if latency_s <= le else 0)) for le in BUCKETS)
    return VersionFigures(float(requests), float(errors), (*buckets, (float("inf"), requests)))


def shadowed(compared: int, agreeing: int, errors: int = 0, measure: str = "top1") -> Figures:
    shadow = ShadowFigures(compared, errors, 0, {measure: (float(agreeing), float(compared))})
    return Figures(version(compared + errors), version(0), shadow)


def weighted(new: VersionFigures, stable: VersionFigures) -> Figures:
    return Figures(stable, new, ShadowFigures())


T = Thresholds(min_agreement=0.9, max_error_increase=0.01, max_latency_ratio=1.5, min_samples=100)


@pytest.mark.parametrize(
    ("figs", "final", "verdict", "says"),
    [
        (shadowed(500, 490), True, GO, "agreement (top1) 0.980"),
        (shadowed(500, 440), True, ROLLBACK, "too low"),
        (shadowed(500, 440), False, HOLD, "low so far"),  # not clearly broken yet
        (shadowed(500, 250), False, ROLLBACK, "too low"),  # clearly: abort early
        (shadowed(60, 60), True, HOLD, "too few samples: 60 compared"),
        (shadowed(500, 480, errors=60), True, ROLLBACK, "shadow errors"),
        (shadowed(500, 480, measure="cosine"), True, GO, "agreement (cosine) 0.960"),
    ],
)
def test_shadow_step_decides_on_agreement_and_shadow_errors(
    figs: Figures, final: bool, verdict: str, says: str
) -> None:
    decision = decide(Step(100, True), figs, T, None, final=final)
    assert decision.verdict == verdict
    assert says in " | ".join(decision.reasons)


@pytest.mark.parametrize(
    ("figs", "final", "verdict", "says"),
    [
        (weighted(version(300), version(3000)), True, GO, "error rate 0.00 %"),
        (weighted(version(300, errors=30), version(3000, errors=3)), True, ROLLBACK, "too high"),
        (weighted(version(300, errors=6), version(3000)), True, ROLLBACK, "too high"),
        (weighted(version(300, errors=6), version(3000)), False, HOLD, "error rate 2.00 %"),
        (weighted(version(300, latency_s=0.2), version(3000)), True, ROLLBACK, "too slow"),
        (weighted(version(300, latency_s=0.2), version(3000)), False, ROLLBACK, "too slow"),
        (weighted(version(50), version(3000)), True, HOLD, "too few samples: the new version"),
        (weighted(version(300), version(10)), True, HOLD, "too few samples of stable"),
    ],
)
def test_weighted_step_decides_on_error_rate_and_p99(
    figs: Figures, final: bool, verdict: str, says: str
) -> None:
    decision = decide(Step(25, False), figs, T, None, final=final)
    assert decision.verdict == verdict
    assert says in " | ".join(decision.reasons)


def test_full_weight_step_compares_with_the_stable_figures_of_an_earlier_step() -> None:
    reference = Reference.of(Step(50, False), version(1000, errors=1, latency_s=0.02), 100)
    assert reference is not None
    slow = weighted(version(400, latency_s=0.2), version(0))
    decision = decide(Step(100, False), slow, T, reference, final=True)
    assert decision.verdict == ROLLBACK
    assert "(from step 50)" in " | ".join(decision.reasons)
    good = decide(Step(100, False), weighted(version(400), version(0)), T, reference, final=True)
    assert good.verdict == GO


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 50.0), (0.2, 90.0), (0.4, 100.0), (float("inf"), 100.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.7, buckets) == pytest.approx(0.15)
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.38)
    assert histogram_quantile(0.99, [(0.1, 0.0), (float("inf"), 10.0)]) == pytest.approx(0.1)
    assert histogram_quantile(0.99, [(0.1, 0.0), (float("inf"), 0.0)]) is None


def test_increase_treats_a_counter_that_fell_as_reset() -> None:
    a, b = ("x", (("gateway", "a"),)), ("x", (("gateway", "b"),))
    assert increase({a: 10.0, b: 50.0}, {a: 15.0, b: 7.0}) == {a: 5.0, b: 7.0}


# ---------------------------------------------------------------------------------------------
# the two metric sources


def test_gateway_metrics_sum_every_gateway(serving: Path) -> None:
    (serving / "routing.yaml").write_text("tiny: {weights: {1: 75, 2: 25}}\n")
    gateways = [FakeGateway(serving / "routing.yaml", batch=100) for _ in range(2)]
    try:
        source = GatewayMetrics([g.url for g in gateways])
        before = source.snapshot(MODEL)
        figs = figures(increase(before, source.snapshot(MODEL)), MODEL, 1, 2)
    finally:
        for g in gateways:
            g.close()
    assert (figs.stable.requests, figs.new.requests) == (150, 50)
    assert figs.new.timed == 50


def test_gateway_metrics_name_an_unreachable_gateway() -> None:
    with pytest.raises(OpsError, match=r"cannot read http://127\.0\.0\.1:9/metrics"):
        GatewayMetrics(["http://127.0.0.1:9"], timeout_s=1).snapshot(MODEL)


# ---------------------------------------------------------------------------------------------
# whole rollouts in this process, the label move injected


@dataclass
class Promotions:
    calls: list[tuple[str, str, int]] = field(default_factory=list)

    def __call__(self, model: str, label: str, version: int) -> None:
        self.calls.append((model, label, version))


def make_rollout(
    serving: Path,
    source: Any,
    promote: Promotions,
    steps: str = "shadow:100,5,25,50,100",
    **kw: Any,
) -> rollout.Rollout:
    settings = rollout.Settings(
        model=MODEL, version=2, config_path=serving / "models.config", steps=parse_steps(steps),
        thresholds=Thresholds(min_samples=50), hold_s=0.2, poll_s=0.03, progress_s=10,
        reader_wait_s=0.0, step_timeout_s=kw.pop("step_timeout_s", 5.0),
        log_path=serving / "rollout.jsonl", **kw,
    )  # fmt: skip
    return rollout.Rollout(settings, source, promote, lambda model, version: None)


def log_lines(serving: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (serving / "rollout.jsonl").read_text().splitlines()]


STEP_ROUTES = [
    ModelRoute(((1, 100.0),), Shadow(2, 1.0)),
    ModelRoute(((1, 95.0), (2, 5.0))),
    ModelRoute(((1, 75.0), (2, 25.0))),
    ModelRoute(((1, 50.0), (2, 50.0))),
    ModelRoute(((2, 100.0),)),
]


def test_a_good_version_goes_through_every_step_and_is_promoted(
    serving: Path, gateway: FakeGateway
) -> None:
    promote = Promotions()
    outcome = make_rollout(serving, GatewayMetrics([gateway.url]), promote).run()
    assert outcome == "promoted"
    assert promote.calls == [(MODEL, "stable", 2)]
    assert gateway.routes_seen == STEP_ROUTES  # each step in turn, as the gateway read it
    assert routing_format.parse((serving / "routing.yaml").read_text()).route(MODEL) is None
    assert not rollout.state_path_for(serving / "routing.yaml").exists()
    decisions = [line for line in log_lines(serving) if line["event"] == "decision"]
    assert [(d["step"], d["verdict"]) for d in decisions] == [
        ("shadow:100", GO), ("5", GO), ("25", GO), ("50", GO), ("100", GO)
    ]  # fmt: skip
    assert decisions[0]["figures"]["agreement"] == 1.0
    assert decisions[-1]["figures"]["reference"]["step"] == "50"  # v1 has no traffic at 100 %
    assert log_lines(serving)[-1]["event"] == "promoted"


def test_low_agreement_rolls_back_at_the_shadow_step_before_any_client_gets_it(
    serving: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway.versions[2] = Behaviour(agreement=0.6)  # e.g. two labels swapped
    promote = Promotions()
    assert make_rollout(serving, GatewayMetrics([gateway.url]), promote).run() == "rolled back"
    assert promote.calls == []
    assert all(r is None or dict(r.weights).get(2, 0) == 0 for r in gateway.routes_seen)
    # no entry before the rollout: v1 keeps the default traffic (newest AVAILABLE would be v2)
    routing = routing_format.parse((serving / "routing.yaml").read_text())
    assert routing.route(MODEL) == ModelRoute(((1, 100.0),))
    assert not rollout.state_path_for(serving / "routing.yaml").exists()
    out = capsys.readouterr().out
    assert "step 1/5 (shadow:100): ROLL BACK" in out and "agreement (top1) 0.600" in out
    assert log_lines(serving)[-1]["event"] == "rolled_back"


@pytest.mark.parametrize(
    ("behaviour", "says"),
    [(Behaviour(error_rate=0.1), "error rate 10.00 %"), (Behaviour(latency_s=0.3), "p99")],
)
def test_errors_or_a_slow_p99_roll_back_at_the_first_weighted_step(
    serving: Path, gateway: FakeGateway, behaviour: Behaviour, says: str
) -> None:
    gateway.versions[2] = behaviour
    assert make_rollout(serving, GatewayMetrics([gateway.url]), Promotions()).run() == "rolled back"
    decision = [line for line in log_lines(serving) if line["event"] == "decision"][-1]
    assert (decision["step"], decision["verdict"]) == ("5", ROLLBACK)
    assert says in " ".join(decision["reasons"])


def test_a_promotion_keeps_the_new_version_pinned_when_a_newer_one_is_in_the_policy(
    serving: Path, gateway: FakeGateway
) -> None:
    # v3 is loaded too: with the entry removed, the gateways would send default traffic (the
    # newest AVAILABLE version) to v3, which no rollout vetted, not to the promoted v2.
    config = serving / "models.config"
    config.write_text(CONFIG.replace("versions: 2 }", "versions: 2 versions: 3 }"))
    gateway.versions[3] = Behaviour()
    promote = Promotions()
    assert make_rollout(serving, GatewayMetrics([gateway.url]), promote).run() == "promoted"
    assert promote.calls == [(MODEL, "stable", 2)]
    routing = routing_format.parse((serving / "routing.yaml").read_text())
    assert routing.route(MODEL) == ModelRoute(((2, 100.0),))
    assert not rollout.state_path_for(serving / "routing.yaml").exists()


def test_a_step_measures_only_after_the_shadow_backlog_of_the_step_before_drained(
    serving: Path, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    # The shadow step leaves queued shadows behind; while they drain, v2 answers at 0.3 s
    # (p99 far over stable's x 1.5): measured then, the 5 % step would roll a good version back.
    gateway.backlog_reads = 8
    outcome = make_rollout(serving, GatewayMetrics([gateway.url]), Promotions()).run()
    assert outcome == "promoted", capsys.readouterr().out
    out = capsys.readouterr().out
    assert "waiting for 8 queued shadow requests to drain before measuring" in out
    assert "shadow backlog drained after" in out


def test_too_few_samples_hold_until_the_step_timeout_then_roll_back(
    serving: Path, gateway: FakeGateway
) -> None:
    gateway.batch = 1
    run = make_rollout(serving, GatewayMetrics([gateway.url]), Promotions(), step_timeout_s=0.6)
    assert run.run() == "rolled back"
    decision = [line for line in log_lines(serving) if line["event"] == "decision"][-1]
    assert decision["step"] == "shadow:100"
    assert "too few samples" in decision["reasons"][0]
    assert "step timeout" in decision["reasons"][-1]


def test_a_rollback_restores_the_entry_the_model_had_and_leaves_other_models(
    serving: Path, gateway: FakeGateway
) -> None:
    before = "other: {weights: {3: 100}}\ntiny: {weights: {1: 90, 2: 10}}\n"
    (serving / "routing.yaml").write_text(before)
    gateway.versions[2] = Behaviour(agreement=0.5)
    assert make_rollout(serving, GatewayMetrics([gateway.url]), Promotions()).run() == "rolled back"
    assert routing_format.parse((serving / "routing.yaml").read_text()) == routing_format.parse(
        before
    )


def test_a_rollout_in_progress_refuses_other_arguments_naming_resume_and_revert(
    serving: Path, gateway: FakeGateway
) -> None:
    class Interrupt(Exception):
        pass

    class StopAtStep2:
        def __init__(self) -> None:
            self.inner = GatewayMetrics([gateway.url])

        def describe(self) -> str:
            return "scripted"

        def snapshot(self, model: str) -> Any:
            if rollout.load_states(state_path)[MODEL].step == 1:
                raise Interrupt  # the process dies mid-hold of step 2
            return self.inner.snapshot(model)

    state_path = rollout.state_path_for(serving / "routing.yaml")
    with pytest.raises(Interrupt):
        make_rollout(serving, StopAtStep2(), Promotions()).run()
    assert (
        routing_format.parse((serving / "routing.yaml").read_text()).route(MODEL)
        == (STEP_ROUTES[1])
    )
    other = make_rollout(
        serving, GatewayMetrics([gateway.url]), Promotions(), steps="shadow:50,100"
    )
    with pytest.raises(OpsError, match="to resume, or with --revert") as refused:
        other.run()
    assert "--steps shadow:100,5,25,50,100" in str(refused.value)

    assert other.revert() == "reverted"
    assert routing_format.parse((serving / "routing.yaml").read_text()).route(MODEL) == (
        ModelRoute(((1, 100.0),))
    )
    assert not state_path.exists()
    with pytest.raises(OpsError, match="no rollout of tiny to revert"):
        other.revert()


def test_a_rollout_killed_while_promoting_finishes_the_promotion(
    serving: Path, gateway: FakeGateway
) -> None:
    state = rollout.State(
        MODEL, 2, "stable", 1, "shadow:100,5,25,50,100", step=5, phase=rollout.PROMOTING,
        started_at=1.0,
    )  # fmt: skip
    rollout.write_states(rollout.state_path_for(serving / "routing.yaml"), {MODEL: state})
    (serving / "routing.yaml").write_text("tiny: {weights: {2: 100}}\n")
    promote = Promotions()
    assert make_rollout(serving, GatewayMetrics([gateway.url]), promote).run() == "promoted"
    assert promote.calls == [(MODEL, "stable", 2)]
    assert routing_format.parse((serving / "routing.yaml").read_text()).route(MODEL) is None


def test_a_second_process_cannot_drive_the_same_rollout(serving: Path) -> None:
    with rollout.driving(serving / "routing.yaml", MODEL):
        run = make_rollout(serving, GatewayMetrics(["http://127.0.0.1:9"]), Promotions())
        with pytest.raises(OpsError, match="a rollout of tiny is running"):
            run.run()


def test_write_route_changes_only_the_models_entry_and_only_when_it_differs(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    assert not rollout.write_route(path, MODEL, None)
    assert not path.exists()
    path.write_text("other: {weights: {3: 100}}\n")
    assert rollout.write_route(path, MODEL, STEP_ROUTES[1])
    assert not rollout.write_route(path, MODEL, STEP_ROUTES[1])
    assert rollout.write_route(path, MODEL, None)
    assert routing_format.parse(path.read_text()) == routing_format.parse(
        "other: {weights: {3: 100}}"
    )
