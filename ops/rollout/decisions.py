"""A rollout's steps and what it decides at each one, from a step's figures (pure, no I/O).

A step is ``shadow:P`` (the new version also gets P % of the default traffic as a shadow; the
stable version serves all of it) or a bare ``P`` (the new version serves P % of the default
traffic, the stable one the rest). ``decide`` answers ``go``, ``rollback`` or ``hold`` (not enough
samples yet), with one line per check and the figures behind it:

- shadow steps: mean agreement of the deciding measure (top-1 for classifiers, cosine for
  embeddings, MaxSim agreement for multi-vector and top-10 overlap for sparse-only
  embedders: the first that has samples) >= ``min_agreement``; the share of shadow calls that failed
  <= the stable version's error rate + ``max_error_increase``.
- weighted steps: the new version's error rate <= the stable one's + ``max_error_increase``, and
  its p99 latency <= the stable one's p99 x ``max_latency_ratio``. At 100 % the stable version gets
  no default traffic; its figures then come from the last step that measured them (``Reference``).

Before a step's hold is over (``final=False``) only a threshold already clearly broken rolls back:
with at least ``min_samples`` samples, a mean whose Hoeffding bound (values in [0, 1], 99 %
confidence) lies wholly on the wrong side, or a median latency already above the allowed p99.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from modelformat.routing import ModelRoute, Shadow
from ops.modelconfig import OpsError
from ops.rollout.metrics import Figures, VersionFigures

DEFAULT_STEPS = "shadow:100,5,25,50,100"
# 1 - confidence of the early-abort bound: a good version is aborted early at most this often
EARLY_DELTA = 0.01

GO, ROLLBACK, HOLD = "go", "rollback", "hold"


@dataclass(frozen=True)
class Step:
    """One step: ``percent`` of the default traffic to the new version, as a shadow or served."""

    percent: float
    shadow: bool

    def __str__(self) -> str:
        return f"{'shadow:' if self.shadow else ''}{_num(self.percent)}"

    def route(self, stable: int, new: int) -> ModelRoute:
        """Return the model's routing entry during this step."""
        if self.shadow:
            return ModelRoute(((stable, 100.0),), Shadow(new, self.percent / 100.0))
        weights = {stable: 100.0 - self.percent, new: self.percent}
        return ModelRoute(tuple(sorted((v, w) for v, w in weights.items() if w > 0)))

    def describe(self, stable: int, new: int) -> str:
        """Return what the step does, in words."""
        if self.shadow:
            return f"v{new} shadows {_num(self.percent)} % of v{stable}'s default traffic"
        return f"v{new} serves {_num(self.percent)} %, v{stable} {_num(100 - self.percent)} %"


def parse_steps(text: str) -> tuple[Step, ...]:
    """Return the steps ``text`` lists (``shadow:100,5,25,50,100``); OpsError naming a bad one."""
    steps = []
    for item in (part.strip() for part in text.split(",")):
        shadow = item.startswith("shadow:")
        number = item.removeprefix("shadow:").strip().rstrip("%")
        try:
            percent = float(number)
        except ValueError:
            percent = math.nan
        if not 0 < percent <= 100:
            raise OpsError(
                f"--steps: {item!r} is not a step (expected P or shadow:P with 0 < P <= 100, "
                f"e.g. {DEFAULT_STEPS})"
            )
        steps.append(Step(percent, shadow))
    if not steps:
        raise OpsError("--steps names no step")
    return tuple(steps)


def format_steps(steps: tuple[Step, ...]) -> str:
    """Return ``steps`` as ``--steps`` writes them."""
    return ",".join(str(s) for s in steps)


@dataclass(frozen=True)
class Thresholds:
    """When a step goes on (see the module docstring)."""

    min_agreement: float = 0.9
    max_error_increase: float = 0.01
    max_latency_ratio: float = 1.5
    min_samples: int = 100


@dataclass(frozen=True)
class Reference:
    """The stable version's figures a weighted step compares with, and the step they came from."""

    step: str
    requests: float
    error_rate: float
    p99_s: float | None

    @classmethod
    def of(cls, step: Step, stable: VersionFigures, min_samples: int) -> Reference | None:
        """Return the stable figures of ``step``, or None if it measured too few requests."""
        if stable.requests < min_samples or stable.timed < min_samples:
            return None
        return cls(str(step), stable.requests, stable.error_rate or 0.0, stable.quantile(0.99))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Reference | None:
        return cls(**data) if data else None


@dataclass
class Decision:
    """What a step decided, why (one line per check) and the figures behind it."""

    verdict: str
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def hoeffding(n: float, delta: float = EARLY_DELTA) -> float:
    """Return the half-width of a ``1 - delta`` one-sided bound on a mean of n values in [0, 1]."""
    return math.sqrt(math.log(1 / delta) / (2 * n)) if n > 0 else math.inf


def decide(
    step: Step,
    figs: Figures,
    thresholds: Thresholds,
    reference: Reference | None,
    *,
    final: bool,
) -> Decision:
    """Return the decision for ``step`` from its figures so far (``final``: the hold is over)."""
    if step.shadow:
        return _decide_shadow(figs, thresholds, reference, final)
    return _decide_weighted(step, figs, thresholds, reference, final)


def _decide_shadow(
    figs: Figures, t: Thresholds, reference: Reference | None, final: bool
) -> Decision:
    shadow = figs.shadow
    stable_rate = _stable_error_rate(figs.stable, t, reference)
    measured = shadow.measure()
    data: dict[str, Any] = {
        "compared": shadow.compared, "shadow_errors": shadow.errors, "dropped": shadow.dropped,
        "shadow_error_share": shadow.error_share, "stable_requests": figs.stable.requests,
        "stable_error_rate": stable_rate,
    }  # fmt: skip
    if measured is not None:
        data.update(measure=measured[0], agreement=measured[1], agreement_samples=measured[2])
    decision = Decision(HOLD, [], data)
    broken = ok = 0
    if measured is None or measured[2] < t.min_samples:
        samples = 0 if measured is None else measured[2]
        decision.reasons.append(
            f"too few samples: {samples:g} compared shadow requests (need {t.min_samples})"
        )
    else:
        name, mean, n = measured
        line = f"agreement ({name}) {mean:.3f} over {n:g} compared, need >= {t.min_agreement:g}"
        clearly = mean + hoeffding(n) < t.min_agreement
        if mean < t.min_agreement and (final or clearly):
            broken += 1
            decision.reasons.append(f"{line}: too low")
        else:
            ok += mean >= t.min_agreement
            decision.reasons.append(line + ("" if mean >= t.min_agreement else ": low so far"))
    share = shadow.error_share
    ran = shadow.compared + shadow.errors
    if share is not None and stable_rate is not None and ran >= t.min_samples:
        limit = stable_rate + t.max_error_increase
        line = (
            f"shadow errors {_pct(share)} ({shadow.errors:g}/{ran:g}), need <= stable "
            f"{_pct(stable_rate)} + {_pct(t.max_error_increase)}"
        )
        if share > limit and (final or share - hoeffding(ran) > limit):
            broken += 1
            decision.reasons.append(f"{line}: too many")
        else:
            ok += share <= limit
            decision.reasons.append(line)
    elif shadow.errors > 0:
        decision.reasons.append(f"shadow errors {shadow.errors:g}, too few samples to judge yet")
    if shadow.dropped:
        decision.reasons.append(f"{shadow.dropped:g} shadow requests dropped (queue full)")
    if broken:
        decision.verdict = ROLLBACK
    elif final and ok == 2:
        decision.verdict = GO
    elif final and measured is not None and measured[2] >= t.min_samples and stable_rate is None:
        decision.reasons.append("stable's error rate unknown: it served no request in this step")
    return decision


def _decide_weighted(
    step: Step, figs: Figures, t: Thresholds, reference: Reference | None, final: bool
) -> Decision:
    new = figs.new
    ref = Reference.of(step, figs.stable, t.min_samples) or reference
    p99 = new.quantile(0.99)
    p50 = new.quantile(0.5)
    data: dict[str, Any] = {
        "new_requests": new.requests, "new_errors": new.errors, "new_error_rate": new.error_rate,
        "new_p50_s": p50, "new_p99_s": p99, "stable_requests": figs.stable.requests,
        "reference": ref.to_json() if ref else None,
    }  # fmt: skip
    decision = Decision(HOLD, [], data)
    if new.requests < t.min_samples or new.timed < t.min_samples:
        decision.reasons.append(
            f"too few samples: the new version served {new.requests:g} requests, "
            f"{new.timed:g} timed (need {t.min_samples})"
        )
        return decision
    if ref is None:
        decision.reasons.append(
            f"too few samples of stable: {figs.stable.requests:g} requests in this step "
            f"(need {t.min_samples}) and no earlier step measured it"
        )
        return decision
    source = "" if ref.step == str(step) else f" (from step {ref.step})"
    broken = 0
    rate = new.error_rate or 0.0
    limit = ref.error_rate + t.max_error_increase
    line = (
        f"error rate {_pct(rate)} ({new.errors:g}/{new.requests:g}), need <= stable "
        f"{_pct(ref.error_rate)}{source} + {_pct(t.max_error_increase)}"
    )
    if rate > limit and (final or rate - hoeffding(new.requests) > limit):
        broken += 1
        decision.reasons.append(f"{line}: too high")
    else:
        decision.reasons.append(line)
    if ref.p99_s is not None and p99 is not None:
        allowed = ref.p99_s * t.max_latency_ratio
        line = (
            f"p99 {p99 * 1000:.1f} ms, need <= stable {ref.p99_s * 1000:.1f} ms{source} x "
            f"{t.max_latency_ratio:g} = {allowed * 1000:.1f} ms"
        )
        if p99 > allowed and (final or (p50 is not None and p50 > allowed)):
            broken += 1
            decision.reasons.append(f"{line}: too slow")
        else:
            decision.reasons.append(line)
    if broken:
        decision.verdict = ROLLBACK
    elif final:
        decision.verdict = GO
    return decision


def _stable_error_rate(
    stable: VersionFigures, t: Thresholds, reference: Reference | None
) -> float | None:
    if stable.requests >= t.min_samples:
        return stable.error_rate
    return reference.error_rate if reference else stable.error_rate


def _pct(value: float) -> str:
    return f"{value * 100:.2f} %"


def _num(value: float) -> str:
    return f"{value:g}"
