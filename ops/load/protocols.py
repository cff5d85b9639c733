"""Compare gRPC and REST under load, straight at the model server and through the gateway.

  loadtest.py --target modelserver,gateway --protocols grpc,rest --concurrency 1,4,16,64 \\
      --texts-per-request 1,8,32 --words 8,48 --duration 20 --out results/loadtest \\
      --grpc 127.0.0.1:8500 --rest http://127.0.0.1:8501 \\
      --gateway-grpc http://127.0.0.1:8000 --gateway-rest http://127.0.0.1:8001

Against the model server the requests carry pre-tokenized int32 tensors (gRPC: PredictRequest with
``tensor_content``; REST: columnar ``inputs`` JSON); through the gateway they carry raw texts,
and "protocol" is the gateway's upstream (two gateways, one per upstream). Addresses default to
the local stack; ``--spawn models/`` starts a throw-away model server and both gateways instead.
Nothing here depends on which server answers, so it runs unchanged against real TF Serving.
Each cell: warm-up (excluded), then ``--duration`` seconds of closed-loop clients.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

from modelformat import serverconfig
from ops import modelconfig, stack
from ops.delayproxy import DelayProxy
from ops.load import report
from ops.load.cells import (
    Cell,
    CellResult,
    Sender,
    gateway_sender,
    grpc_sender,
    make_tensors,
    make_texts,
    rest_sender,
    run_cell,
)
from ops.modelconfig import OpsError
from ops.procs import REPO, ServerProcess
from ops.server import ModelServer


def int_list(text: str) -> list[int]:
    """Return the integers of a comma-separated list."""
    return [int(x) for x in text.split(",") if x.strip()]


def str_list(text: str) -> list[str]:
    """Return the items of a comma-separated list."""
    return [x.strip() for x in text.split(",") if x.strip()]


def grid(args: argparse.Namespace) -> list[Cell]:
    """Return the cells in run order; protocols alternate so drift hits both alike."""
    return [
        Cell(target, protocol, conc, texts, words)
        for target in args.target
        for words in args.words
        for texts in args.texts_per_request
        for conc in args.concurrency
        for protocol in args.protocols
    ]


def sender_factory(
    cell: Cell, args: argparse.Namespace, shared: dict[str, Any]
) -> Callable[[], Sender]:
    """Return a function making one client (sender) for ``cell``; each thread gets its own."""
    version, timeout = args.model_version, args.timeout
    if cell.target == "modelserver":
        tensors = make_tensors(cell.texts, cell.words)
        if cell.protocol == "grpc":
            # One channel for all threads, as a real client process would hold (HTTP/2 streams).
            if "channel" not in shared:
                shared["channel"] = _grpc_channel(args.grpc)
            channel = shared["channel"]
            return lambda: grpc_sender(channel, args.model, tensors, timeout, version)
        session = requests.Session
        return lambda: rest_sender(session(), args.rest, args.model, tensors, timeout, version)
    texts = make_texts(cell.texts, cell.words)
    url = args.gateway_grpc if cell.protocol == "grpc" else args.gateway_rest
    return lambda: gateway_sender(
        requests.Session(), url, args.model, args.verb, texts, timeout, version
    )


def _upstream_attr(cell: Cell) -> str:
    """Return the name of the ``args`` attribute holding the address ``cell`` sends to."""
    if cell.target == "modelserver":
        return "grpc" if cell.protocol == "grpc" else "rest"
    return f"gateway_{cell.protocol}"


def wire_bytes(cell: Cell, args: argparse.Namespace, calls: int = 20) -> tuple[float, float]:
    """Return mean bytes per request sent and received on the wire, through a counting proxy."""
    attr = _upstream_attr(cell)
    address = getattr(args, attr)
    parsed = urllib.parse.urlsplit(address if "://" in address else f"//{address}")
    proxy = DelayProxy(parsed.port or 80, parsed.hostname or "127.0.0.1").start()
    proxied = argparse.Namespace(**vars(args))
    local = f"127.0.0.1:{proxy.port}"
    setattr(proxied, attr, f"{parsed.scheme}://{local}" if parsed.scheme else local)
    shared: dict[str, Any] = {}
    try:
        send = sender_factory(cell, proxied, shared)()
        for _ in range(calls):
            send()
    finally:
        if "channel" in shared:
            shared["channel"].close()
        proxy.stop()
    return proxy.bytes_up / calls, proxy.bytes_down / calls


def _grpc_channel(target: str) -> Any:
    import grpc

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    return grpc.insecure_channel(target, options=options)


def describe(result: CellResult) -> str:
    """Return one progress line for a finished cell."""
    c = result.cell
    return (
        f"{c.target:<11} {c.protocol:<4} c={c.concurrency:<3} texts={c.texts:<3} words={c.words:<3}"
        f" {result.throughput_rps:8.1f} req/s {result.texts_per_s:8.1f} texts/s"
        f"  p50 {result.p50_ms:7.1f}  p99 {result.p99_ms:7.1f} ms  err {result.errors}"
        f"  cpu {result.client_cpu_ms:5.2f} ms/req"
    )


def model_versions(args: argparse.Namespace) -> str:
    """Return the model's versions and states as the model server reports them."""
    try:
        server = ModelServer(args.grpc, timeout_s=5)
        try:
            states = server.status(args.model)
        finally:
            server.close()
    except OpsError as exc:
        return f"unknown ({exc})"
    return ", ".join(f"v{s.version} {s.state}" for s in states) or "none"


def spawn_config(model: str, base_path: Path) -> Any:
    """Return a config serving only ``model`` from ``base_path`` (its committed entry if any)."""
    committed = modelconfig.load_config(stack.SERVING_CONFIG / "models.config")
    config = modelconfig.full_config("model_config_list { }")
    entry = config.model_config_list.config.add()
    try:
        entry.CopyFrom(modelconfig.find_model(committed, model))
    except OpsError:
        entry.name, entry.model_platform = model, "tensorflow"
    return modelconfig.localize_config(config, base_path)


@contextlib.contextmanager
def spawned_stack(args: argparse.Namespace) -> Iterator[None]:
    """Start a model server and two gateways from ``--spawn`` and point ``args`` at them."""
    with tempfile.TemporaryDirectory(prefix="loadtest-") as tmp:
        work = Path(tmp)
        config = spawn_config(args.model, args.spawn)
        config_path = work / "models.config"
        serverconfig.write_atomic(config_path, config)
        procs: list[ServerProcess] = []
        try:
            print(f"spawning a model server for {args.spawn} ...", flush=True)
            server, grpc_port, rest_port = stack.start_modelserver(config_path, work)
            procs.append(server)
            args.grpc, args.rest = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{rest_port}"
            if "gateway" in args.target:
                for upstream in args.protocols:
                    print(f"spawning a gateway with upstream {upstream} ...", flush=True)
                    gateway, url = stack.start_gateway(
                        upstream, grpc_port, rest_port, args.spawn, config_path, work
                    )
                    procs.append(gateway)
                    setattr(args, f"gateway_{upstream}", url)
            yield
        finally:
            for proc in reversed(procs):
                proc.stop()


def median_result(repeats: list[CellResult]) -> CellResult:
    """Return the repeat with the median throughput (upper median for an even count)."""
    ordered = sorted(repeats, key=lambda r: r.throughput_rps)
    return ordered[len(ordered) // 2]


def run(args: argparse.Namespace) -> list[CellResult]:
    """Run every cell ``--repeats`` times (grid passes interleaved) with progress; return medians.

    Passes over the whole grid rather than back-to-back repeats of one cell, so a burst of
    load from elsewhere on a shared machine lands on different cells in different passes.
    """
    cells = grid(args)
    total = len(cells) * args.repeats
    per_cell = args.duration + args.warmup
    print(f"{len(cells)} cells x {args.repeats} passes x {per_cell:.0f}s = "
          f"about {total * per_cell / 60:.1f} min")  # fmt: skip
    shared: dict[str, Any] = {}
    by_cell: dict[Cell, list[CellResult]] = {cell: [] for cell in cells}
    started = time.monotonic()
    done = 0
    for _ in range(args.repeats):
        for cell in cells:
            result = run_cell(cell, sender_factory(cell, args, shared), args.duration, args.warmup)
            if not by_cell[cell]:  # bytes do not depend on load: one counting pass is enough
                result.wire_sent_bytes, result.wire_received_bytes = wire_bytes(cell, args)
            else:
                first = by_cell[cell][0]
                result.wire_sent_bytes = first.wire_sent_bytes
                result.wire_received_bytes = first.wire_received_bytes
            by_cell[cell].append(result)
            done += 1
            left = (time.monotonic() - started) / done * (total - done)
            print(f"[{done}/{total}] {describe(result)}  (~{left:.0f}s left)", flush=True)
    if "channel" in shared:
        shared["channel"].close()
    return [median_result(by_cell[cell]) for cell in cells]


def write_outputs(args: argparse.Namespace, results: list[CellResult], versions: str) -> None:
    """Write the CSV, the markdown report and the plots under ``--out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "model": f"{args.model}, version "
        + (f"{args.model_version} pinned" if args.model_version else "newest")
        + f" (server: {versions})",
        "model server": f"gRPC {args.grpc}, REST {args.rest}",
        "gateways": f"grpc upstream {args.gateway_grpc}, rest upstream {args.gateway_rest}",
        "cell": f"{args.warmup:g}s warm-up (excluded) + {args.duration:g}s measured; "
        f"median-throughput repeat of {args.repeats} interleaved passes",
        "command": "`python scripts/loadtest.py " + " ".join(sys.argv[1:]) + "`",
    }
    prefix = args.prefix
    report.write_csv(args.out / f"{prefix}.csv", results)
    page = report.markdown(results, report.machine(), settings)
    paths = report.plot(results, args.out, prefix)
    page += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in paths) + "\n"
    (args.out / f"{prefix}.md").write_text(page)
    print(f"wrote {args.out / (prefix + '.csv')}, {args.out / (prefix + '.md')}, "
          f"{', '.join(p.name for p in paths)}")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", type=str_list, default=["modelserver", "gateway"])
    p.add_argument("--protocols", type=str_list, default=["grpc", "rest"])
    p.add_argument("--concurrency", type=int_list, default=[1, 4, 16, 64])
    p.add_argument("--texts-per-request", type=int_list, default=[1, 8, 32])
    p.add_argument("--words", type=int_list, default=[8, 48], help="words per text")
    p.add_argument("--duration", type=float, default=20.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=3.0, help="discarded seconds per cell")
    p.add_argument("--repeats", type=int, default=1, help="passes over the grid (median kept)")
    p.add_argument("--model", default="minilm")
    p.add_argument("--model-version", type=int, help="pin a version (default: the newest)")
    p.add_argument("--verb", default="embed", choices=["embed", "classify"], help="gateway verb")
    p.add_argument("--grpc", default="127.0.0.1:8500", help="model server gRPC host:port")
    p.add_argument("--rest", default="http://127.0.0.1:8501", help="model server REST URL")
    p.add_argument("--gateway-grpc", default="http://127.0.0.1:8000", help="gateway, gRPC upstream")
    p.add_argument("--gateway-rest", default="http://127.0.0.1:8001", help="gateway, REST upstream")
    p.add_argument(
        "--spawn", type=Path, help="start a local model server + gateways for this base path"
    )
    p.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    p.add_argument("--out", type=Path, default=REPO / "results" / "loadtest")
    p.add_argument("--prefix", default="loadtest", help="output file names")
    p.add_argument("--replot", type=Path, help="only redraw the plots from this CSV")
    args = p.parse_args(argv)
    for target in args.target:
        if target not in ("modelserver", "gateway"):
            p.error(f"--target: unknown {target!r}")
    for protocol in args.protocols:
        if protocol not in ("grpc", "rest"):
            p.error(f"--protocols: unknown {protocol!r}")
    if args.spawn:
        args.spawn = args.spawn.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        args.out.mkdir(parents=True, exist_ok=True)
        paths = report.plot(report.read_csv(args.replot), args.out, args.prefix)
        print("wrote " + ", ".join(str(p) for p in paths))
        return 0
    stack = spawned_stack(args) if args.spawn else contextlib.nullcontext()
    with stack:
        versions = model_versions(args)
        print(f"model {args.model}: {versions}")
        results = run(args)
        versions_after = model_versions(args)
    write_outputs(args, results, versions_after)
    return 0
