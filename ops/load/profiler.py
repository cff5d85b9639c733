"""Profile the gateway under load: where its workers' CPU goes, function by function (py-spy).

A throw-away stack (``--spawn`` base path: a model server and gunicorn with the gateway, grpc
upstream) gets ``--clients`` closed-loop clients sending ``--texts`` texts of ``--words`` words per
request, while ``py-spy record`` samples every gateway process (master and workers: gunicorn's
HTTP parsing as well as the app), by default only the thread holding the GIL, so a sample is
Python work, not a thread waiting on the model server (``--wall`` samples every thread).
The samples are folded per function into self and total shares of the gateway's samples; the
top rows go to ``<out>/<prefix>.md`` with the command, the collapsed stacks to
``<out>/<prefix>.folded`` (input to any flame-graph tool) and a bar chart to ``<out>/<prefix>.png``.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from export.hardware import cpu_info
from modelformat import serverconfig
from ops import stack
from ops.load import protocols
from ops.load.cells import Cell, gateway_sender, make_texts, run_cell
from ops.modelconfig import say
from ops.procs import REPO


@dataclass(frozen=True)
class FunctionShare:
    """One function's share of the sampled gateway stacks."""

    name: str
    self_share: float  # samples with this function on top / all samples
    total_share: float  # samples with this function anywhere on the stack / all samples


def fold(lines: list[str]) -> tuple[int, list[FunctionShare]]:
    """Return (sample count, functions by self share) from py-spy's collapsed stacks (pure).

    Each line is ``frame;frame;...;leaf count``, frames ``function (file:line)``; the process
    and thread frames py-spy adds (``process ...``, ``thread ...``) are not functions.
    """
    self_count: collections.Counter[str] = collections.Counter()
    total_count: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in lines:
        stack_text, _, count_text = line.rstrip().rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_function(f) for f in stack_text.split(";")]
        frames = [f for f in frames if f]
        samples += count
        if frames:
            self_count[frames[-1]] += count
        for name in set(frames):
            total_count[name] += count
    shares = [
        FunctionShare(name, self_count[name] / samples, total_count[name] / samples)
        for name in total_count
    ] if samples else []  # fmt: skip
    return samples, sorted(shares, key=lambda s: (-s.self_share, -s.total_share, s.name))


def _function(frame: str) -> str:
    """Return ``function (file)`` for a frame, '' for py-spy's process/thread frames."""
    if frame.startswith(("process ", "thread ")):
        return ""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0]
    for marker in ("site-packages/", sysconfig.get_paths()["stdlib"] + "/", str(REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


def report(samples: int, shares: list[FunctionShare], top: int, header: list[str]) -> str:
    """Return the markdown report: what was run, then the top functions by self and total."""
    out = [*header, "", f"{samples} samples of the gateway's processes.", ""]
    out += ["**By self time** (the function itself on top of the stack):", ""]
    out += ["| function | self | total |", "|---|---|---|"]
    out += [f"| `{s.name}` | {s.self_share:.1%} | {s.total_share:.1%} |" for s in shares[:top]]
    by_total = sorted(shares, key=lambda s: -s.total_share)[:top]
    out += ["", "**By total time** (the function anywhere on the stack):", ""]
    out += ["| function | total | self |", "|---|---|---|"]
    out += [f"| `{s.name}` | {s.total_share:.1%} | {s.self_share:.1%} |" for s in by_total]
    return "\n".join(out) + "\n"


def plot(shares: list[FunctionShare], path: Path, title: str, top: int = 20) -> None:
    """Bar chart of the top functions by self share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = shares[:top][::-1]
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(rows) + 1.5))
    ax.barh([r.name[:90] for r in rows], [100 * r.self_share for r in rows])
    ax.set_xlabel("% of gateway samples (self)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> Path:
    """Spawn the stack, load it while py-spy records the gateway, write the report; return it."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    args.out.mkdir(parents=True, exist_ok=True)
    folded = args.out / f"{args.prefix}.folded"
    with tempfile.TemporaryDirectory(prefix="profile-") as tmp:
        work = Path(tmp)
        config_path = work / "models.config"
        serverconfig.write_atomic(config_path, protocols.spawn_config(args.model, args.spawn))
        say(f"spawning a model server and a gateway for {args.spawn} ...")
        server, grpc_port, rest_port = stack.start_modelserver(config_path, work)
        try:
            gateway, url = stack.start_gateway(
                "grpc", grpc_port, rest_port, args.spawn, config_path, work
            )
            try:
                cell = Cell("gateway", "grpc", args.clients, args.texts, args.words)
                texts = make_texts(args.texts, args.words)

                def sender():  # type: ignore[no-untyped-def]
                    return gateway_sender(requests.Session(), url, args.model, args.verb, texts, 30)

                say(f"warming up for {args.warmup:.0f}s ...")
                run_cell(cell, sender, args.warmup, 0.0)
                cmd = [
                    py_spy, "record", "--pid", str(gateway.pid), "--subprocesses",
                    "--rate", str(args.rate), "--duration", str(int(args.duration)),
                    "--format", "raw", "--output", str(folded), "--nonblocking",
                    *(["--gil"] if not args.wall else []),
                ]  # fmt: skip
                say(f"recording {args.duration:.0f}s: {' '.join(cmd[1:])}")
                spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                time.sleep(1.0)  # py-spy attaches before the measured load starts
                result = run_cell(cell, sender, args.duration, 0.0)
                _, err = spy.communicate(timeout=120)
                if spy.returncode != 0 or not folded.is_file():
                    raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.decode()[-500:]}")
            finally:
                gateway.stop()
        finally:
            server.stop()
    samples, shares = fold(folded.read_text().splitlines())
    cpu = cpu_info()
    header = [
        f"# Gateway profile: {args.model} :{args.verb}, {args.texts} text(s) of "
        f"{args.words} words, {args.clients} clients, grpc upstream",
        "",
        f"Machine: {cpu.describe()}. {time.strftime('%Y-%m-%d')}.",
        f"Load: {result.requests} requests in {args.duration:.0f}s "
        f"({result.throughput_rps:.0f} req/s, {result.errors} errors) while py-spy sampled "
        f"every gateway process at {args.rate} Hz "
        + ("(every thread: wall time)." if args.wall else "(the GIL holder: Python CPU work)."),
        "",
        "Command: `" + " ".join(["python", "scripts/profile_gateway.py", *sys.argv[1:]]) + "`",
    ]
    md = args.out / f"{args.prefix}.md"
    md.write_text(report(samples, shares, args.top, header))
    plot(shares, args.out / f"{args.prefix}.png", f"gateway self time, {cpu.cpu_class}")
    say(md.read_text())
    return md


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the parsed command line."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="base path with the models")
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--verb", default="classify", choices=["classify", "embed"])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--texts", type=int, default=1, help="texts per request")
    p.add_argument("--words", type=int, default=8, help="words per text")
    p.add_argument("--duration", type=float, default=20.0, help="seconds recorded")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument(
        "--wall", action="store_true",
        help="sample every thread (wall time: waits included) instead of the GIL holder only",
    )  # fmt: skip
    p.add_argument("--top", type=int, default=25, help="rows in each table")
    p.add_argument("--out", type=Path, default=REPO / "results" / "profile")
    p.add_argument("--prefix", default="gateway")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (RuntimeError, TimeoutError) as exc:
        print(f"profile_gateway: error: {exc}", file=sys.stderr)
        return 1
    return 0
