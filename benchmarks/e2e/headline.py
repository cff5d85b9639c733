"""A run: the models made, the stacks started, every cell and floor measured, the rows returned."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import grpc
import orjson
import requests

from benchmarks import BenchContext, Row
from benchmarks import runs as run_files
from benchmarks.e2e.accuracy import bucket_mix, measure_accuracy
from benchmarks.e2e.cells import Watched, run_cells, summarize
from benchmarks.e2e.floor import floor_costs, graph_costs, one_client
from benchmarks.e2e.models import export_models, find_checkpoint, server_config
from benchmarks.e2e.peers import Infinity, compare_embeddings
from benchmarks.e2e.plan import (
    ALONE,
    ALONE_SPEED,
    CLIENTS,
    DATA,
    EMBED,
    EXITS,
    FULL,
    GTHREAD,
    INTRA,
    INTRA_DIRECT,
    INTRA_FLAG,
    INTRA_GATEWAY,
    LONE_TEXTS,
    MODEL,
    SPEEDS,
    say,
)
from benchmarks.e2e.report import markdown_table, note, plot, rows_of
from benchmarks.e2e.senders import (
    Direct,
    direct_sender,
    gateway_sender,
    http_sender,
    offsets,
)
from benchmarks.e2e.stacks import Stacks, start_stacks
from ops.load.cells import Sender
from ops.procs import ServerProcess


def run(ctx: BenchContext) -> list[Row]:
    """Make the models, measure the graph, the load cells and the floors; return the rows."""
    from finetune.data import read_examples

    work = ctx.work_dir / "e2e"
    base = work / "models"
    base.mkdir(parents=True, exist_ok=True)
    checkpoint, source = find_checkpoint(ctx, work)
    export_models(ctx, checkpoint, base)
    test = read_examples(DATA / "test.tsv")
    texts, labels = list(test.texts), list(test.labels)
    say("exported graphs in process, batch 1/8/32 ...")
    graph = graph_costs(base, texts, ctx.quick)
    config = server_config(base, work / "models.config")
    started: list[ServerProcess] = []
    result: dict[str, Any] = {"source": source, "graph": graph}
    try:
        stacks = start_stacks(base, config, work, started)
        watched = stacks.watched()
        direct = Direct(base, MODEL, FULL)
        channel = grpc.insecure_channel(f"127.0.0.1:{stacks.grpc_port}")
        intra_channel = grpc.insecure_channel(f"127.0.0.1:{stacks.intra_grpc}")
        say("accuracy of each setting on the test split ...")
        result["accuracy"] = measure_accuracy(stacks.gateway, direct, channel, texts, labels)
        result["bucket_mix"] = bucket_mix(direct, texts)
        nxt = offsets(len(texts))
        makers = _makers(stacks, direct, channel, intra_channel, texts, nxt)
        if (base / EMBED).exists():
            result.update(_with_infinity(ctx, stacks.gateway, texts, nxt, makers, watched, started))
        else:
            result["infinity_skip"] = f"no {EMBED} demo model under {ctx.base_path}"
        say("load cells (" + ", ".join(makers) + ") ...")
        intra_rest = {INTRA_DIRECT: stacks.intra_rest, INTRA_GATEWAY: stacks.intra_rest}
        runs = run_cells(ctx, makers, watched, stacks.rest_port, intra_rest)
        channel.close()
        intra_channel.close()
        say("fixed costs on the tiny model ...")
        gateways = {"gateway": "gateway", "gateway_gthread": "gthread"}
        floor = floor_costs(
            {name: (getattr(stacks, role), Watched({"gateway": [stacks.procs[role].pid],
                                                    "model server": [stacks.server.pid]}))
             for name, role in gateways.items()},
            stacks.grpc_port, base, watched, ctx.quick, work,
        )  # fmt: skip
        result.update(_lone_clients(stacks, texts, ctx.quick))
    finally:
        for proc in reversed(started):
            proc.stop()
    result["settings"] = {name: summarize(samples) for name, samples in runs.items()}
    result["breakdown"] = {"graph": graph, "floor": floor}
    result["stamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = rows_of(result, ctx.cpu.cpu_class)
    if not ctx.quick:  # a smoke run is not a measurement: nothing is kept
        _keep(ctx, result, out)
    return out


def _makers(
    stacks: Stacks,
    direct: Direct,
    channel: grpc.Channel,
    intra_channel: grpc.Channel,
    texts: list[str],
    nxt: Callable[[], int],
) -> dict[str, Callable[[], Sender]]:
    """Return each cell's client maker: direct gRPC, the gateway at every speed, the variants."""
    makers: dict[str, Callable[[], Sender]] = {
        "direct": lambda: direct_sender(channel, direct, texts, nxt()),
    }
    path = f"/v1/models/{MODEL}:classify"
    for speed in SPEEDS:
        bodies = [orjson.dumps({"texts": [t], "version": EXITS, "speed": speed}) for t in texts]
        makers[f"gateway {speed:g}"] = partial(gateway_sender, stacks.gateway, path, bodies, nxt)
        if speed == ALONE_SPEED:
            for cell, url in (
                (ALONE, stacks.alone),
                (GTHREAD, stacks.gthread),
                (INTRA_GATEWAY, stacks.intra_gateway),
            ):
                makers[cell] = partial(gateway_sender, url, path, bodies, nxt)
    makers[INTRA_DIRECT] = lambda: direct_sender(intra_channel, direct, texts, nxt())
    return makers


def _with_infinity(
    ctx: BenchContext,
    gateway: str,
    texts: list[str],
    nxt: Callable[[], int],
    makers: dict[str, Callable[[], Sender]],
    watched: Watched,
    started: list[ServerProcess],
) -> dict[str, Any]:
    """Start infinity, compare its embeddings with ours and add the two :embed cells to
    ``makers``; return the comparison, or why infinity could not be used."""
    try:
        say("starting infinity (.venv-infinity) on the demo weights ...")
        infinity = Infinity(ctx)
        started.append(infinity.proc)
        watched.roots["infinity"] = [infinity.proc.pid]
        compared = compare_embeddings(gateway, infinity, texts)
    except (RuntimeError, TimeoutError, OSError, requests.RequestException) as exc:
        skip = f"infinity could not be used: {exc}"
        say(skip)
        ctx.notes.append(f"e2e: {skip}")
        return {"infinity_skip": skip}
    ours = [orjson.dumps({"texts": [t]}) for t in texts]
    theirs = [orjson.dumps({"model": EMBED, "input": [t]}) for t in texts]
    makers["embed ours"] = lambda: http_sender(gateway, f"/v1/models/{EMBED}:embed", ours, nxt())
    makers["embed infinity"] = lambda: http_sender(infinity.url, "/embeddings", theirs, nxt())
    return compared


def _lone_clients(stacks: Stacks, texts: list[str], quick: bool) -> dict[str, Any]:
    """Return one client's p50s: grouped vs alone, and default vs one intra-op thread."""
    say("one client, grouped and alone ...")
    grouped = one_client({"grouped": stacks.gateway, "alone": stacks.alone}, texts,
                         40 if quick else 200)  # fmt: skip
    say(f"one client, 1 and {LONE_TEXTS} tickets per request, default vs {INTRA_FLAG} ...")
    lone = {"default": stacks.gateway, INTRA: stacks.intra_gateway}
    return {
        "one_client": grouped,
        "intra_lone": {
            "1": one_client(lone, texts, 40 if quick else 200),
            str(LONE_TEXTS): one_client(lone, texts, 4 if quick else 30, LONE_TEXTS),
        },
    }


def _keep(ctx: BenchContext, result: dict[str, Any], out: list[Row]) -> None:
    """Write the run file (markdown), its plot and its JSON under results/runs/."""
    when = dt.datetime.now(dt.UTC)
    cpu_class, describe = ctx.cpu.cpu_class, ctx.cpu.describe()
    plot_path = run_files.run_path(run_files.RUNS_DIR, when, cpu_class, "e2e", ".png")
    run_files.RUNS_DIR.mkdir(parents=True, exist_ok=True)
    plot(result, plot_path, f"One-text requests, {CLIENTS} clients — {describe}")
    text = note(result, markdown_table(out, cpu_class), describe, plot_path.name)
    command = "python scripts/bench.py --only e2e"
    path = run_files.write_run(run_files.RUNS_DIR, when, cpu_class, "e2e", describe, command, text)
    path.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    ctx.notes.append(f"e2e: breakdown in results/runs/{path.name}")
