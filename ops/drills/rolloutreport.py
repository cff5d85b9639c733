"""The rollout drill's plot (agreement and each version's share of the answers over time) and its
markdown section of the drills report."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from export.hardware import cpu_info
from ops.drills.tickets import Reply, Sampler


def plot(
    args: argparse.Namespace,
    t0: float,
    events: list[tuple[float, str]],
    replies: list[Reply],
    sampler: Sampler,
    versions: dict[str, Any],
) -> None:
    """Draw agreement and each version's share of the answers per 2 s over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = 2.0
    t_end = max((r.finished for r in replies), default=t0) - t0
    edges = [i * step for i in range(int(t_end / step) + 1)]
    shares: dict[int, list[float]] = {}
    buckets: list[Counter[int]] = [Counter() for _ in edges]
    for r in replies:
        if r.version is not None and r.ok and r.finished >= t0:
            buckets[min(len(edges) - 1, int((r.finished - t0) / step))][r.version] += 1
    for v in sorted({v for b in buckets for v in b}):
        shares[v] = [b[v] / max(1, sum(b.values())) * 100 for b in buckets]
    agree_t: list[float] = []
    agree: list[float] = []
    rows = [row for row in sampler.rows if row[0] >= t0]
    for (t1, s1, c1, _), (t2, s2, c2, _) in zip(rows, rows[2:], strict=False):
        if c2 > c1:
            if agree_t and (t2 + t1) / 2 - t0 - agree_t[-1] > 3 * step:
                agree_t.append(float("nan"))  # no shadow in between: no line across
                agree.append(float("nan"))
            agree_t.append((t2 + t1) / 2 - t0)
            agree.append((s2 - s1) / (c2 - c1))
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    top.plot(agree_t, agree, ".-", color="tab:purple")
    top.axhline(args.min_agreement, color="grey", ls="--", lw=1)
    top.set_ylabel("shadow top-1 agreement")
    top.set_ylim(-0.05, 1.05)
    names = {1: "v1 (stable)", versions["good"]: f"v{versions['good']} (good)",
             versions["bad"]: f"v{versions['bad']} (labels swapped)"}  # fmt: skip
    for v in sorted({*shares, *(v for v in versions.values() if v is not None)}):
        values = shares.get(v, [0.0] * len(edges))
        bottom.plot(edges, values, label=names.get(v, f"v{v}") + ("" if v in shares else
                    ": no answer"), ls="-" if v in shares else ":")  # fmt: skip
    bottom.set_ylabel("share of client answers (%)")
    bottom.set_xlabel("seconds since the clients started")
    bottom.legend(loc="center left")
    for t, text in events:
        if any(word in text for word in ("decision", "promoted", "rolled_back")):
            for ax in (top, bottom):
                ax.axvline(t, color="tab:red" if "rolled" in text else "lightgrey", lw=0.8)
        if text.startswith(("good: promoted", "bad: rolled_back", "shadow cost: ")):
            top.annotate(text.split(":")[0] + (" rolled back" if "rolled" in text else
                         " promoted" if "promoted" in text else ""), (t, 0.45),
                         rotation=90, fontsize=8, ha="right")  # fmt: skip
    fig.suptitle(f"rollout drill: {args.model}, {args.clients} clients")
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=100)


def append_report(
    args: argparse.Namespace, wall0: float, lines: list[str], result: dict[str, Any]
) -> None:
    """Append the run as a section of ``--report`` (markdown)."""
    a = args
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(wall0))
    own = a.shadow_server == "own"
    rows = "\n".join(
        f"| {i + 1} | {'100 %' if w['shadow'] else 'off'} | {w['p50_ms']} | "
        f"{w['requests']} | {w['server_cpu_s_per_s']} |"
        + (f" {w.get('shadow_server_cpu_s_per_s', '')} |" if own else "")
        for i, w in enumerate(result["windows"])
    )
    shadow_where = (
        "a model server of their own at the lowest CPU priority (`--shadow-server own`)"
        if own
        else "the clients' model server (`--shadow-server shared`)"
    )
    text = f"""
## Rollout drill: a good version promoted, a bad one rolled back at the shadow step (issue 24)

`python scripts/rollout_drill.py --spawn {a.spawn} --model {a.model} --clients {a.clients}
--windows {a.windows} --shadow-server {a.shadow_server}`
(measured {when} on {cpu_info().describe()}, shared with other jobs).
Stable v1, good v{result["versions"]["good"]} and bad v{result["versions"]["bad"]} are exports
of one fine-tuned checkpoint ({a.checkpoint.name}); the bad one has two labels swapped.
Load: open-loop at {a.load_fraction:g} of the capacity measured with {a.clients} closed-loop
clients (`--load-fraction`; ops/drills/rollout.py's docstring says why), shadow queue
{a.shadow_queue} per gateway worker; shadow calls on {shadow_where}.
Steps `{a.steps}`, hold {a.hold_s:g} s, at least {a.min_samples} samples, agreement >=
{a.min_agreement:g}.

```
{chr(10).join(lines)}
```

Shadow cost, interleaved windows of {a.window_s:g} s (client p50 of requests inside the window,
model-server CPU seconds per second):

| window | shadow | client p50 (ms) | requests | model server CPU (s/s) |{
        " the shadow's model server CPU (s/s) |" if own else ""
    }
|---:|---|---:|---:|---:|{"---:|" if own else ""}
{rows}
"""
    with open(a.report, "a", encoding="utf-8") as fh:
        fh.write(text)
