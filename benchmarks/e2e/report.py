"""The report of a run: its rows for the bench table, the breakdown page (markdown) and its plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import Row
from benchmarks.e2e.plan import (
    ALONE,
    ALONE_SETTING,
    ALONE_SPEED,
    BATCHES,
    CLIENTS,
    COMPARED,
    EXITS,
    FULL,
    GTHREAD,
    INTRA,
    INTRA_DIRECT,
    INTRA_FLAG,
    INTRA_GATEWAY,
    LONE_TEXTS,
    PLOT,
    SPEEDS,
    WORKER_SETTING,
)


def _cpu_text(summary: dict[str, Any], roles: Sequence[str]) -> str:
    return ", ".join(f"{r} {summary['cpu_ms'][r]:.2f}" for r in roles if r in summary["cpu_ms"])


def rows_of(result: dict[str, Any], cpu_class: str) -> list[Row]:
    """Return the benchmark table's rows for ``result`` (pure)."""
    s = result["settings"]
    acc = result["accuracy"]
    d = s["direct"]
    how = (f"{CLIENTS} closed-loop clients, 1 test ticket/request (200 cycled), "
           f"{d['cells']} × {d['duration_s']:g} s cells per setting, interleaved, medians; "
           f"{result['source']}; CPU ms/request: ")  # fmt: skip
    roles = ("gateway", "model server", "load generator")
    out = [
        Row(f"e2e direct gRPC, full model v{FULL} (client tokenizes, bucket signature)",
            f"{d['texts_s']:.0f} texts/s, p50 {d['p50']:.1f} / p99 {d['p99']:.1f} ms",
            "1.00×", "", f"accuracy {acc['direct']['accuracy']:.3f}; {cpu_class}; " + how +
            _cpu_text(d, ("model server", "load generator"))),
    ]  # fmt: skip
    for speed in SPEEDS:
        g = s[f"gateway {speed:g}"]
        a = acc[f"gateway {speed:g}"]
        aim = "≥ 0.9×" if speed == 0 else ("≥ 2×, ≤ 1 point lost" if speed == 0.8 else "")
        out.append(Row(
            f"e2e gateway, early-exit v{EXITS} at speed {speed:g}",
            f"{g['texts_s']:.0f} texts/s, p50 {g['p50']:.1f} / p99 {g['p99']:.1f} ms",
            f"{g['texts_s'] / d['texts_s']:.2f}× direct", aim,
            f"accuracy {a['accuracy']:.3f} (direct {acc['direct']['accuracy']:.3f}), mean exit "
            f"layer {a['layers']:.2f}; {cpu_class}; " + how + _cpu_text(g, roles)))  # fmt: skip
    if ALONE in s:
        a, g = s[ALONE], s[COMPARED]
        out.append(Row(
            f"  the same at speed {ALONE_SPEED:g} with every request its own upstream call "
            f"({ALONE_SETTING}=0)",
            f"{a['texts_s']:.0f} texts/s, p50 {a['p50']:.1f} / p99 {a['p99']:.1f} ms",
            f"grouped ÷ alone {g['texts_s'] / a['texts_s']:.2f}×", "",
            f"rows per model call {a['rows_per_call']:.2f} (grouped {g['rows_per_call']:.2f}); "
            f"{cpu_class}; CPU ms/request: " + _cpu_text(a, roles)))  # fmt: skip
    if GTHREAD in s:
        w, g = s[GTHREAD], s[COMPARED]
        f = result["breakdown"]["floor"]
        out.append(Row(
            f"  the same at speed {ALONE_SPEED:g} on gunicorn's gthread worker "
            f"({WORKER_SETTING}=gthread, not backend/httpworker.py's)",
            f"{w['texts_s']:.0f} texts/s, p50 {w['p50']:.1f} / p99 {w['p99']:.1f} ms",
            f"lingering ÷ gthread {g['texts_s'] / w['texts_s']:.2f}×", "",
            f"gateway CPU ms/request under load {w['cpu_ms']['gateway']:.2f} (lingering "
            f"{g['cpu_ms']['gateway']:.2f}), sequential on tiny "
            f"{f.get('gateway_gthread_cpu_ms', float('nan')):.2f} (lingering "
            f"{f['gateway_cpu_ms']:.2f}); {cpu_class}; CPU ms/request: "
            + _cpu_text(w, roles)))  # fmt: skip
    if INTRA_GATEWAY in s and "intra_lone" in result:
        out.append(_intra_row(result, cpu_class))
    if "one_client" in result:
        one = result["one_client"]
        out.append(Row(
            f"  p50 at 1 client, speed {ALONE_SPEED:g}: grouped vs every request alone",
            f"{one['grouped']:.2f} vs {one['alone']:.2f} ms",
            f"{one['grouped'] / one['alone']:.2f}×", "no worse",
            "one client's sequential one-ticket requests through each gateway, interleaved",
        ))  # fmt: skip
    if "embed ours" in s and "embed infinity" in s:
        o, i = s["embed ours"], s["embed infinity"]
        ours_idle = i["cores"]["model server"] + i["cores"]["gateway"]
        out.append(
            Row(
                "e2e :embed minilm through the gateway vs infinity /embeddings (same weights)",
                f"{o['texts_s']:.0f} vs {i['texts_s']:.0f} texts/s; p50 {o['p50']:.1f} vs "
                f"{i['p50']:.1f} ms",
                f"{o['texts_s'] / i['texts_s']:.2f}×",
                "≥ 1.5×",
                f"cosine of the two answers min {result['cosine_min']:.6f} over "
                f"{result['cosine_n']} tickets; infinity-emb {result['infinity_version']} (torch, "
                f"CPU, batch 32); {cpu_class}; "
                + how.split("; CPU")[0]
                + "; CPU ms/request: ours "
                + _cpu_text(o, roles)
                + "; infinity "
                + _cpu_text(i, ("infinity", "load generator"))
                + f"; idle neighbour: infinity {o['cores'].get('infinity', 0.0):.2f} cores "
                f"during our cells, model server + gateway {ours_idle:.2f} during infinity's",
            )
        )
    else:
        out.append(Row("e2e :embed vs infinity", f"skipped: {result.get('infinity_skip')}"))
    b = result["breakdown"]
    g0, g8 = s["gateway 0"], s["gateway 0.8"]
    out += [
        Row("  rows per model call at this load (processed_batch_size)",
            f"direct {d['rows_per_call']:.2f}, gateway speed 0 {g0['rows_per_call']:.2f}, 0.8 "
            f"{g8['rows_per_call']:.2f}", "", "",
            f"model server's histogram over each cell (every queue together: it has no "
            f"signature label); bucket mix of the test tickets {result['bucket_mix']}"),
        Row("  exit machinery at speed 0 vs non-exit export, fixed per call / per row",
            f"{b['graph']['exits, speed 0']['fixed'] - b['graph']['full']['fixed']:+.2f} ms / "
            f"{b['graph']['exits, speed 0']['per_row'] - b['graph']['full']['per_row']:+.3f} ms",
            "", "", "in process, seq_32 signature, batch " + "/".join(map(str, BATCHES)) + ": "
            + "; ".join(f"{name} " + "/".join(f"{ms:.1f}" for ms in g["ms"].values()) + " ms"
                        for name, g in b["graph"].items() if name != "seq_len")),
        Row("  model server per call (tiny 2-layer model, 1 row)",
            f"p50 {b['floor']['direct_p50_ms']:.2f} ms, CPU {b['floor']['server_cpu_ms']:.2f} ms",
            "", "", f"{b['floor']['calls']} sequential gRPC calls, one client"),
        Row("  gateway CPU per one-text request (sequential, tiny model / under load at 0.8)",
            f"{b['floor']['gateway_cpu_ms']:.2f} / {g8['cpu_ms']['gateway']:.2f} ms", "",
            "≤ 1.2 ms", f"master + workers utime+stime; gateway p50 on tiny "
            f"{b['floor']['gateway_p50_ms']:.2f} ms vs direct "
            f"{b['floor']['direct_p50_ms']:.2f} ms"),
    ]  # fmt: skip
    f = b["floor"]
    if "flask_cpu_ms" in f:
        floor = f["flask_cpu_ms"] + f["grpc_client_cpu_ms"]
        out.append(Row(
            "  the floor under it: gunicorn + bare WSGI / + Flask route / + one gRPC call",
            f"{f['wsgi_cpu_ms']:.2f} / {f['flask_cpu_ms']:.2f} / {floor:.2f} ms", "", "",
            f"CPU per sequential request of benchmarks/floor_app.py under gunicorn (the "
            f"gateway's worker class, 8 threads; gunicorn's gthread: "
            f"{f.get('wsgi_gthread_cpu_ms', float('nan')):.2f} / "
            f"{f.get('flask_gthread_cpu_ms', float('nan')):.2f}), plus a bare Predict call's "
            f"client CPU ({f['grpc_client_cpu_ms']:.2f} ms: bytes in, bytes out); the gateway's "
            f"own work is {f['gateway_cpu_ms'] - floor:.2f} ms over it"))  # fmt: skip
    return out


def _intra_row(result: dict[str, Any], cpu_class: str) -> Row:
    """Return the row of the direct and speed-0.8 cells on one intra-op thread per call."""
    s, lone = result["settings"], result["intra_lone"]
    d, g = s["direct"], s[COMPARED]
    di, gi = s[INTRA_DIRECT], s[INTRA_GATEWAY]
    lone_text = ", ".join(
        f"{n} text{'s' if n != '1' else ''} {t['default']:.1f} vs {t[INTRA]:.1f} ms"
        for n, t in lone.items()
    )
    return Row(
        f"  direct and speed {ALONE_SPEED:g} with the model server on one intra-op thread per "
        f"call ({INTRA_FLAG})",
        f"direct {di['texts_s']:.0f}, gateway {gi['texts_s']:.0f} texts/s (default threading "
        f"{d['texts_s']:.0f}, {g['texts_s']:.0f})",
        f"direct {di['texts_s'] / d['texts_s']:.2f}×, gateway {gi['texts_s'] / g['texts_s']:.2f}×"
        f" default; gateway ÷ direct {gi['texts_s'] / di['texts_s']:.2f}×",
        "",
        f"p50 of one client (default vs {INTRA}): {lone_text}; rows per model call direct "
        f"{di['rows_per_call']:.2f}, gateway {gi['rows_per_call']:.2f}; {cpu_class}; CPU "
        f"ms/request: direct model server {di['cpu_ms']['model server']:.2f} (default "
        f"{d['cpu_ms']['model server']:.2f}), gateway path " + _cpu_text(
            gi, ("gateway", "model server", "load generator")),
    )  # fmt: skip


def markdown_table(rows: list[Row], cpu_class: str) -> str:
    """Return rows as scripts/bench.py prints them (markdown, the CPU class beside each)."""
    out = ["| figure | value | ratio | aim | CPU | how measured |", "|---|---|---|---|---|---|"]
    out += [f"| {r.figure} | {r.value} | {r.ratio} | {r.aim} | {cpu_class} | {r.how} |"
            for r in rows]  # fmt: skip
    return "\n".join(out)


def _setting_names(settings: dict[str, Any]) -> list[str]:
    """Return the one-text load cells measured, in the order the plot and the note show them."""
    names = ["direct"] + [f"gateway {x:g}" for x in SPEEDS]
    return names + [n for n in (ALONE, GTHREAD, INTRA_DIRECT, INTRA_GATEWAY) if n in settings]


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    """Two panels: CPU ms per request by process under load; one request's time at 1 client."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["settings"]
    b = result["breakdown"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6))
    names = _setting_names(s)
    roles = (("model server", "tab:blue"), ("gateway", "tab:orange"),
             ("load generator", "tab:grey"))  # fmt: skip
    bottoms = np.zeros(len(names))
    for role, colour in roles:
        vals = np.array([s[n]["cpu_ms"].get(role, 0.0) for n in names])
        left.barh(names, vals, left=bottoms, color=colour, label=role)
        bottoms += vals
    for y, n in enumerate(names):
        left.text(bottoms[y], y, f" {s[n]['texts_s']:.0f} texts/s", va="center", fontsize=8)
    left.set_xlabel(f"CPU ms per one-text request ({CLIENTS} clients)")
    left.legend(fontsize=8, loc="lower right")
    left.set_xlim(0, float(bottoms.max()) * 1.3)  # room for the texts/s labels
    left.invert_yaxis()
    graph = b["graph"]
    floor = b["floor"]
    gw_added = max(0.0, floor["gateway_p50_ms"] - floor["direct_p50_ms"])
    bars = {"full model, direct": (graph["full"]["ms"][1], 0.0),
            "exits 0, gateway": (graph["exits, speed 0"]["ms"][1], gw_added),
            "exits 0.8, gateway": (graph["exits, speed 0.8"]["ms"][1], gw_added)}  # fmt: skip
    labels = list(bars)
    graph_ms = np.array([v[0] for v in bars.values()])
    call_ms = np.full(len(labels), floor["direct_p50_ms"])
    gw_ms = np.array([v[1] for v in bars.values()])
    right.barh(labels, graph_ms, color="tab:green", label="graph in process (batch 1, seq 32)")
    right.barh(labels, call_ms, left=graph_ms, color="tab:blue",
               label="model server per call (tiny model p50)")  # fmt: skip
    right.barh(labels, gw_ms, left=graph_ms + call_ms, color="tab:orange",
               label="gateway added (tiny model p50 − direct)")  # fmt: skip
    right.set_xlabel("ms, one request, one client (sum of the parts)")
    right.legend(fontsize=8, loc="lower right")
    right.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _grouping_lines(s: dict[str, Any]) -> list[str]:
    """Return the note's reading of the cell with grouping off, beside the grouped one."""
    if ALONE not in s:
        return [""]
    a, g = s[ALONE], s[COMPARED]
    return [
        f"- Grouping (backend/grouping.py) at speed {ALONE_SPEED:g}: every request its own call "
        f"{a['texts_s']:.0f} texts/s, {a['rows_per_call']:.2f} rows per model call, CPU ms per "
        f"request gateway {a['cpu_ms'].get('gateway', 0.0):.2f} / model server "
        f"{a['cpu_ms']['model server']:.2f}; grouped {g['texts_s']:.0f} texts/s, "
        f"{g['rows_per_call']:.2f} rows per call, {g['cpu_ms'].get('gateway', 0.0):.2f} / "
        f"{g['cpu_ms']['model server']:.2f}.",
        "",
    ]


def _worker_lines(s: dict[str, Any], f: dict[str, Any]) -> list[str]:
    """Return the note's reading of the cell on gunicorn's gthread worker, beside the product's."""
    if GTHREAD not in s:
        return [""]
    w, g = s[GTHREAD], s[COMPARED]
    return [
        f"- Worker class (backend/httpworker.py) at speed {ALONE_SPEED:g}: gunicorn's gthread "
        f"{w['texts_s']:.0f} texts/s, gateway CPU {w['cpu_ms']['gateway']:.2f} ms per request "
        f"under load and {f.get('gateway_gthread_cpu_ms', float('nan')):.2f} sequential; "
        f"LingeringThreadWorker {g['texts_s']:.0f} texts/s, {g['cpu_ms']['gateway']:.2f} and "
        f"{f['gateway_cpu_ms']:.2f}.",
        "",
    ]


def _bound_lines(s: dict[str, Any], f: dict[str, Any]) -> list[str]:
    """Return the note's bound: speed 0.8 ÷ direct with the gateway's CPU cut to its floor.

    On a host whose cores are all busy, texts/s goes as 1 / (CPU per text of every process), so
    a gateway that did nothing but Flask under gunicorn and one gRPC call would reach at most
    (direct's model server + its client) ÷ (the exit model server + that floor + the client).
    """
    if "flask_cpu_ms" not in f:
        return []
    d, g8 = s["direct"]["cpu_ms"], s[COMPARED]["cpu_ms"]
    floor = f["flask_cpu_ms"] + f["grpc_client_cpu_ms"]
    direct = d["model server"] + d["load generator"]
    bound = direct / (g8["model server"] + floor + g8["load generator"])
    now = direct / (g8["model server"] + g8.get("gateway", 0.0) + g8["load generator"])
    return [
        f"- The bound this host sets: CPU per text direct {direct:.2f} ms (model server + "
        f"client), at {ALONE_SPEED:g} through the gateway {g8['model server']:.2f} + "
        f"{g8.get('gateway', 0.0):.2f} + {g8['load generator']:.2f} ms: {now:.2f}× by CPU. With "
        f"the gateway at its floor ({floor:.2f} ms: Flask under gunicorn and one gRPC call, no "
        f"work of its own) it would be {bound:.2f}×; 2× needs the gateway at "
        f"{direct / 2 - g8['model server'] - g8['load generator']:.2f} ms or the exit graph's "
        "model server cheaper per text.",
    ]


def _intra_lines(result: dict[str, Any]) -> list[str]:
    """Return the note's reading of the cells on one intra-op thread per model call."""
    s = result["settings"]
    if INTRA_GATEWAY not in s or "intra_lone" not in result:
        return [""]
    d, g = s["direct"], s[COMPARED]
    di, gi = s[INTRA_DIRECT], s[INTRA_GATEWAY]
    lone = result["intra_lone"][str(LONE_TEXTS)]
    return [
        f"- Model server threading ({INTRA_FLAG}, TF Serving's flag; a second model server in "
        f"the same run): direct {d['texts_s']:.0f} -> {di['texts_s']:.0f} texts/s, gateway at "
        f"{ALONE_SPEED:g} {g['texts_s']:.0f} -> {gi['texts_s']:.0f}; gateway ÷ direct "
        f"{g['texts_s'] / d['texts_s']:.2f}× -> {gi['texts_s'] / di['texts_s']:.2f}×. It serves "
        f"many small calls better (each batch thread, one per core, runs its call on one core "
        f"instead of every call spreading over all of them) and one large call worse: a lone "
        f"client's {LONE_TEXTS}-ticket request {lone['default']:.0f} -> {lone[INTRA]:.0f} ms. "
        "Not the project's default: a deployment whose traffic is many one-text requests sets it.",
        "",
    ]


def note(result: dict[str, Any], table: str, describe: str, plot_name: str = PLOT.name) -> str:
    """Return the breakdown's text (pure): a run file under results/runs/, plot ``plot_name``."""
    s, b = result["settings"], result["breakdown"]
    d, g0, g8 = s["direct"], s["gateway 0"], s["gateway 0.8"]
    graph = b["graph"]
    share = g8["cpu_ms"].get("gateway", 0.0) / max(1e-9, g8["cpu_ms"]["model server"]) * 100
    graph_gain = graph["full"]["ms"][32] / graph["exits, speed 0.8"]["ms"][32]
    lines = [
        "# Where the graph's gain goes between the graph and the client (issue 23)",
        "",
        f"Measured {result['stamp']} on {describe}; `make bench` (`scripts/bench.py --only e2e`); "
        "every figure in the JSON file of the same name (git-ignored), plot "
        f"`{plot_name}`.",
        f"Model: {result['source']}.",
        "",
        table,
        "",
        "## Per request, under the load of the table",
        "",
        "| setting | texts/s | p50 / p99 ms | rows per model call | model calls/s | "
        "CPU ms/request: gateway / model server / generator | "
        "cores: gateway / model server / generator |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in _setting_names(s):
        x = s[name]
        c, k = x["cpu_ms"], x["cores"]
        lines.append(
            f"| {name} | {x['texts_s']:.0f} | {x['p50']:.1f} / {x['p99']:.1f} | "
            f"{x['rows_per_call']:.2f} | {x['calls_s']:.0f} | {c.get('gateway', 0.0):.2f} / "
            f"{c['model server']:.2f} / {c['load generator']:.2f} | {k.get('gateway', 0.0):.2f} "
            f"/ {k['model server']:.2f} / {k['load generator']:.2f} |"
        )
    lines += [
        "",
        "## The graph in process (seq_32 signature, ms per call at batch "
        + "/".join(map(str, BATCHES))
        + ")",
        "",
        "| graph | " + " | ".join(f"b{n}" for n in BATCHES) + " | fixed ms/call | ms/row |",
        "|---|" + "---|" * (len(BATCHES) + 2),
    ]
    for name, g in graph.items():
        if name == "seq_len":
            continue
        lines.append(f"| {name} | " + " | ".join(f"{g['ms'][n]:.2f}" for n in BATCHES)
                     + f" | {g['fixed']:.2f} | {g['per_row']:.3f} |")  # fmt: skip
    f = b["floor"]
    lines += [
        "",
        "## Fixed costs per call",
        "",
        f"- Model server per call, tiny 2-layer model, 1 row: p50 {f['direct_p50_ms']:.2f} ms, "
        f"CPU {f['server_cpu_ms']:.2f} ms ({f['calls']} sequential gRPC calls).",
        f"- Gateway per one-text request on the same model: CPU {f['gateway_cpu_ms']:.2f} ms "
        f"(master + workers), p50 {f['gateway_p50_ms']:.2f} ms; under the table's load at speed "
        f"0.8: {g8['cpu_ms']['gateway']:.2f} ms.",
    ]
    if "flask_cpu_ms" in f:
        floor = f["flask_cpu_ms"] + f["grpc_client_cpu_ms"]
        lines += [
            f"- The floor under the gateway's CPU, per sequential request: gunicorn (the gateway's "
            f"worker class, 8 threads) with a bare WSGI app {f['wsgi_cpu_ms']:.2f} ms, with one "
            f"Flask route {f['flask_cpu_ms']:.2f} ms (benchmarks/floor_app.py; gunicorn's gthread "
            f"{f.get('wsgi_gthread_cpu_ms', float('nan')):.2f} / "
            f"{f.get('flask_gthread_cpu_ms', float('nan')):.2f} ms); one bare gRPC Predict costs "
            f"its caller {f['grpc_client_cpu_ms']:.2f} ms. Flask under gunicorn + one gRPC call: "
            f"{floor:.2f} ms; the gateway's own work (validation, tokenizer, bucketing, tensors, "
            f"post-processing, metrics, access log) is the other "
            f"{f['gateway_cpu_ms'] - floor:.2f} ms.",
        ]
    lines += [
        "",
        "## Reading",
        "",
        f"- The graph alone: speed 0.8 is {graph_gain:.2f}× the full model at batch 32 and "
        f"{graph['full']['ms'][1] / graph['exits, speed 0.8']['ms'][1]:.2f}× at batch 1 (in "
        f"process). End to end at {CLIENTS} clients the gateway at 0.8 gives "
        f"{g8['texts_s'] / d['texts_s']:.2f}× direct and {g8['texts_s'] / g0['texts_s']:.2f}× "
        f"itself at speed 0.",
        f"- Batches stay small: {d['rows_per_call']:.1f} rows per model call direct, "
        f"{g0['rows_per_call']:.1f} through the gateway at speed 0 and "
        f"{g8['rows_per_call']:.1f} at 0.8 — the one-text requests spread over the bucket "
        f"queues {result['bucket_mix']}, so the per-row gain of compaction at batch 32 is not "
        "what the model server runs; at batch 1 the exit graph is the one measured above.",
        f"- Model server CPU per text: {d['cpu_ms']['model server']:.2f} ms direct (full model), "
        f"{g0['cpu_ms']['model server']:.2f} at speed 0, {g8['cpu_ms']['model server']:.2f} at "
        f"0.8; of that a per-call floor of ~{f['server_cpu_ms']:.2f} ms (tiny model) does not "
        "shrink with the model.",
        f"- Gateway CPU per request {g8['cpu_ms'].get('gateway', 0.0):.2f} ms at 0.8 "
        f"({share:.0f} % "
        "of the model server's): flat whatever the model costs, so its share grows as the model "
        "gets cheaper; the load generator's own CPU shares the same 2 cores.",
        *_bound_lines(s, f),
        "",
        *_grouping_lines(s),
        *_worker_lines(s, f),
        *_intra_lines(result),
        f"![where one request's time and CPU go]({plot_name})",
        "",
    ]
    return "\n".join(lines)
