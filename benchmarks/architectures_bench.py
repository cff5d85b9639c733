"""What each architecture costs, and where our graph stands against torch and ONNX Runtime.

Per architecture of export/architectures/ at the demo model's size (6 layers, hidden 384, 12
heads, feed-forward 1536; random weights, saved by transformers' ``save_pretrained`` into a temp
directory, a 30,522-token vocabulary for all), the in-process milliseconds per call at batch 1 and
32, sequence length 32 (full-length rows of random ids), of three engines on the same CPU:

- **ours**: export's module built from the checkpoint as ``export build`` builds it (task embed,
  mean pooling, FP32), called through its ``seq_32`` serving signature;
- **torch**: transformers' ``AutoModel`` (torch, ``inference_mode``) and the same mean pooling;
- **ONNX Runtime**: that torch module exported by ``torch.onnx.export`` and run by onnxruntime
  (``make onnx-env``: its own git-ignored environment, ``benchmarks/onnx-requirements.txt``; the
  column says why it is empty when that environment is missing).

Each engine runs in its own process (benchmarks/engine_worker.py) with its thread count set before
its runtime starts: TensorFlow's intra- and inter-op pools, ``torch.set_num_threads``, ONNX
Runtime's ``intra_op_num_threads``, all ``--threads`` (1 by default). The processes wait while
another is timed; the calls are interleaved (architecture by architecture, each round every engine
in a rotated order, a block of calls each), and each figure is the median over every call. Each
engine's vectors are checked against torch's (cosine) so that the three compute the same model.

``python -m benchmarks.architectures_bench`` runs it alone (``--quick`` for a smoke run) and
writes a markdown table and a PNG (``--out``); ``make bench`` runs it with the others.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from benchmarks import BenchContext, Row, median
from export.hardware import CpuInfo, cpu_info
from ops.procs import REPO, child_env

ONNX_VENV = REPO / ".venv-onnx"
WORKER = REPO / "benchmarks" / "engine_worker.py"
ENGINES = ("ours", "torch", "onnxruntime")
LABELS = {"ours": "ours (TF)", "torch": "torch", "onnxruntime": "ONNX Runtime"}
SEQ = 32
BATCHES = (1, 32)
# the demo model's shape (all-MiniLM-L6-v2)
SIZE: dict[str, Any] = {"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12,
                        "intermediate_size": 1536, "vocab_size": 30522,
                        "max_position_embeddings": 512}  # fmt: skip
TINY: dict[str, Any] = {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                        "intermediate_size": 48, "vocab_size": 120,
                        "max_position_embeddings": 64}  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """One row of the table: a display name and transformers' config keywords."""

    name: str
    label: str
    config: dict[str, Any]
    tiny: dict[str, Any] = field(default_factory=dict)  # overrides at the smoke size


# Each architecture as a real checkpoint of that family sets it, at the demo's size.
ARCHS = (
    Arch("bert", "BERT (MiniLM-L6's shape)", {"model_type": "bert"}),
    Arch("roberta", "RoBERTa / XLM-R / CamemBERT",
         {"model_type": "roberta", "pad_token_id": 1, "type_vocab_size": 1,
          "max_position_embeddings": 514}),
    Arch("distilbert", "DistilBERT",
         {"model_type": "distilbert", "dim": 384, "n_heads": 12, "n_layers": 6,
          "hidden_dim": 1536}, {"dim": 32, "n_heads": 4, "n_layers": 2, "hidden_dim": 48}),
    Arch("electra", "ELECTRA (embeddings 128)", {"model_type": "electra", "embedding_size": 128},
         {"embedding_size": 16}),
    Arch("albert", "ALBERT (embeddings 128, one shared layer)",
         {"model_type": "albert", "embedding_size": 128}, {"embedding_size": 16}),
    Arch("mpnet", "MPNet", {"model_type": "mpnet"}),
    Arch("deberta-v3", "DeBERTa-v3 (DeBERTa-v2 graph)",
         {"model_type": "deberta-v2", "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
          "position_buckets": 256, "max_relative_positions": -1, "share_att_key": True,
          "norm_rel_ebd": "layer_norm", "position_biased_input": False, "type_vocab_size": 0},
         {"position_buckets": 8}),
    Arch("modernbert", "ModernBERT (GeGLU, rotary)",
         {"model_type": "modernbert", "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3,
          "cls_token_id": 2, "sep_token_id": 3, "global_attn_every_n_layers": 3,
          "local_attention": 128, "max_position_embeddings": 8192}),
    Arch("nomic_bert", "NomicBERT (SwiGLU, rotary)",
         {"model_type": "nomic_bert", "max_position_embeddings": 8192}),
    Arch("gte", "GTE (gated GELU, rotary)",
         {"model_type": "gte", "pad_token_id": 0, "type_vocab_size": 0,
          "max_position_embeddings": 8192}),
    Arch("jina_embeddings_v3", "jina-embeddings-v3 (XLM-R, rotary; base model)",
         {"model_type": "jina_embeddings_v3", "pad_token_id": 1, "type_vocab_size": 1,
          "max_position_embeddings": 8194}),
)  # fmt: skip


def save_checkpoint(arch: Arch, where: Path, tiny: bool = False, seed: int = 0) -> Path:
    """Save a random base model of ``arch`` with transformers (``save_pretrained``); return it."""
    import torch  # the references (requirements-dev.txt); the product never imports them
    import transformers

    values = {**(TINY if tiny else SIZE), **arch.config, **(arch.tiny if tiny else {})}
    model_type = values.pop("model_type")
    torch.manual_seed(seed)
    config = transformers.AutoConfig.for_model(model_type, **values)
    model = transformers.AutoModel.from_config(config).eval()
    path = where / arch.name
    model.save_pretrained(path)
    # a WordPiece vocabulary of the embedding's size for the checkpoint reader (ids are fed
    # directly, so which tokenizer it is does not matter here)
    rows = int(json.loads((path / "config.json").read_text())["vocab_size"])
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = specials + [f"tok{i}" for i in range(len(specials), rows)]
    (path / "vocab.txt").write_text("".join(f"{w}\n" for w in words), encoding="utf-8")
    return path


def uses_token_types(path: Path) -> bool:
    """Return whether the checkpoint has a token-type table of two or more rows (feed them)."""
    return int(json.loads((path / "config.json").read_text()).get("type_vocab_size", 0) or 0) >= 2


# ---------------------------------------------------------------- the worker processes


class Worker:
    """One engine's process (engine_worker.py): a command line in, a JSON reply out."""

    def __init__(self, engine: str, python: Path | str, threads: int, work: Path, log: Path):
        self.engine = engine
        self.log = log.open("ab")
        cmd = [str(python), str(WORKER), "--engine", engine, "--threads", str(threads),
               "--work", str(work / engine)]  # fmt: skip
        env = child_env(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, text=True, cwd=REPO)  # fmt: skip

    def ask(self, **cmd: Any) -> dict[str, Any]:
        """Send one command and return the reply (``error`` set when the worker failed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as exc:
            return {"error": f"worker gone: {exc}"}
        if not line:
            return {"error": f"worker exited ({self.proc.poll()}); its log: {self.log.name}"}
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        """Ask the worker to quit and wait for it (kill it after 30 s)."""
        if self.proc.poll() is None:
            self.ask(op="quit")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def onnx_python() -> tuple[Path | None, str]:
    """Return (ONNX Runtime's interpreter, '') or (None, why it is missing)."""
    python = ONNX_VENV / "bin" / "python"
    if not python.is_file():
        return None, f"{ONNX_VENV.name} missing: `make onnx-env` makes it"
    probe = subprocess.run([str(python), "-c", "import onnxruntime, onnxscript, transformers"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{ONNX_VENV.name} is broken ({last}): `make onnx-env` remakes it"
    return python, ""


# ---------------------------------------------------------------- the measurement


@dataclass
class Result:
    """Everything one run measured (the table and the plot are made from it alone)."""

    cpu_class: str
    machine: str
    threads: int
    seq: int
    batches: tuple[int, ...]
    rounds: int
    archs: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    ms: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)  # arch→engine→batch
    calls: dict[str, dict[str, dict[int, int]]] = field(default_factory=dict)
    cosine: dict[str, dict[str, float]] = field(default_factory=dict)  # arch → engine → min
    skipped: dict[str, str] = field(default_factory=dict)  # engine (or engine/arch) → why
    size: str = "6 layers, hidden 384, 12 heads, feed-forward 1536, random weights"
    details: dict[str, str] = field(default_factory=dict)  # engine → how it ran


def _cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    cos = (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    return float(cos.min())


def _calls_per_block(batch: int, quick: bool) -> int:
    return 1 if quick or batch >= 8 else 5


def measure(
    archs: Sequence[Arch],
    *,
    threads: int = 1,
    rounds: int = 5,
    quick: bool = False,
    work: Path,
    cpu: CpuInfo | None = None,
    say: Any = print,
    engines: Sequence[str] = ENGINES,
) -> Result:
    """Save each architecture's checkpoint, load it in every engine, time them interleaved."""
    cpu = cpu or cpu_info()
    result = Result(cpu.cpu_class, cpu.describe(), threads, SEQ, BATCHES, rounds)
    if quick:
        result.size = "tiny models (--quick: 2 layers, hidden 32), one call each: a smoke run"
    pythons: dict[str, Path | str] = {e: sys.executable for e in ("ours", "torch") if e in engines}
    if "onnxruntime" in engines:
        onnx, why = onnx_python()
        if onnx is None:
            result.skipped["onnxruntime"] = why
            say(f"architectures_bench: ONNX Runtime skipped: {why}")
        else:
            pythons["onnxruntime"] = onnx
    work.mkdir(parents=True, exist_ok=True)
    workers = {e: Worker(e, p, threads, work, work / f"{e}.log") for e, p in pythons.items()}
    try:
        live = {a.name: _load(a, k, workers, result, quick=quick, work=work, say=say)
                for k, a in enumerate(archs)}  # fmt: skip
        _time(live, workers, result, quick=quick, say=say)
    finally:
        for worker in workers.values():
            worker.close()
    return result


def _load(arch: Arch, seed: int, workers: dict[str, Worker], result: Result, *, quick: bool,
          work: Path, say: Any) -> list[str]:  # fmt: skip
    """Save ``arch``'s checkpoint, load it in every engine, compare the vectors; return the
    engines that loaded it."""
    path = save_checkpoint(arch, work / "checkpoints", tiny=quick, seed=seed)
    vocab = int(json.loads((path / "config.json").read_text())["vocab_size"])
    load = {"op": "load", "name": arch.name, "path": str(path), "seq": SEQ, "vocab_size": vocab,
            "token_types": uses_token_types(path)}  # fmt: skip
    live: list[str] = []
    for engine, worker in workers.items():
        reply = worker.ask(**load)
        if "error" in reply:
            result.skipped[f"{engine}/{arch.name}"] = reply["error"]
            say(f"  {arch.name}: {engine} failed to load: {reply['error']}")
            continue
        result.details.setdefault(engine, reply["detail"])
        say(f"  {arch.name}: {engine} loaded in {reply['load_s']:.1f} s")
        live.append(engine)
    result.archs.append(arch.name)
    result.labels[arch.name] = arch.label
    vectors = {e: np.asarray(workers[e].ask(op="embed", name=arch.name, batch=1).get(
        "embedding", []), dtype=np.float64) for e in live}  # fmt: skip
    if "torch" in vectors:
        result.cosine[arch.name] = {e: _cosine_min(v, vectors["torch"]) for e, v in vectors.items()
                                    if e != "torch" and v.size}  # fmt: skip
    for e in live:  # warm every shape once before anything is timed
        for b in BATCHES:
            workers[e].ask(op="time", name=arch.name, batch=b, calls=1)
    return live


def _time(live: dict[str, list[str]], workers: dict[str, Worker], result: Result, *,
          quick: bool, say: Any) -> None:  # fmt: skip
    """Time every (architecture, engine, batch), interleaved: each round visits every
    architecture and batch, the engines in a rotated order, a block of calls each."""
    times: dict[tuple[str, str, int], list[float]] = {
        (a, e, b): [] for a, engines in live.items() for e in engines for b in BATCHES
    }
    for r in range(1 if quick else result.rounds):
        for arch, engines in live.items():
            order = engines[r % len(engines) :] + engines[: r % len(engines)] if engines else []
            for b in BATCHES:
                for e in order:
                    reply = workers[e].ask(op="time", name=arch, batch=b,
                                           calls=_calls_per_block(b, quick))  # fmt: skip
                    times[(arch, e, b)] += reply.get("times", [])
        say(f"  round {r + 1} done")
    for arch, engines in live.items():
        result.ms[arch] = {e: {b: median(times[(arch, e, b)]) * 1000 for b in BATCHES
                               if times[(arch, e, b)]} for e in engines}  # fmt: skip
        result.calls[arch] = {e: {b: len(times[(arch, e, b)]) for b in BATCHES} for e in engines}
        line = "; ".join(f"{e} " + " / ".join(f"{ms:.1f}" for ms in result.ms[arch][e].values())
                         for e in engines)  # fmt: skip
        say(f"  {arch}: ms at batch {' / '.join(map(str, BATCHES))}: {line}")


# ---------------------------------------------------------------- the table and the plot


def _cell(result: Result, arch: str, engine: str, batch: int) -> str:
    ms = result.ms.get(arch, {}).get(engine, {}).get(batch)
    if ms is None:
        return "—"
    text = f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"
    if engine != "ours":
        ours = result.ms.get(arch, {}).get("ours", {}).get(batch)
        if ours:
            text += f" ({ours / ms:.2f}×)"
    return text


def render(result: Result) -> str:
    """Return the markdown table: ms per call per architecture × engine × batch (pure)."""
    batches = result.batches
    head = ["architecture"] + [f"{LABELS[e]}, batch {b}" for b in batches for e in ENGINES]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for arch in result.archs:
        cells = [_cell(result, arch, e, b) for b in batches for e in ENGINES]
        lines.append(f"| {result.labels.get(arch, arch)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(result: Result) -> str:
    """Return each architecture's cost beside BERT's, per engine at the largest batch (pure)."""
    base, batch = "bert", max(result.batches)
    if base not in result.ms:
        return ""
    lines = [f"| architecture | {' | '.join(LABELS[e] for e in ENGINES)} |",
             "|---" + "|---:" * len(ENGINES) + "|"]  # fmt: skip
    for arch in result.archs:
        cells = []
        for e in ENGINES:
            ms, ref = result.ms.get(arch, {}).get(e, {}).get(batch), result.ms[base].get(e, {})
            cells.append(f"{ms / ref[batch]:.2f}×" if ms and ref.get(batch) else "—")
        lines.append(f"| {result.labels.get(arch, arch)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def notes(result: Result) -> list[str]:
    """Return the lines under the table: how each engine ran, checks, what was skipped (pure)."""
    out = [f"- {LABELS[e]}: {d}" for e, d in result.details.items()]
    for arch, cos in result.cosine.items():
        bad = {e: c for e, c in cos.items() if c < 0.9999}
        if bad:
            out.append(f"- {arch}: vectors differ from torch's: "
                       + ", ".join(f"{e} cosine {c:.5f}" for e, c in bad.items()))  # fmt: skip
    if result.cosine:
        low = min((c for cos in result.cosine.values() for c in cos.values()), default=1.0)
        out.append(f"- every engine's vectors against torch's: 1 − cosine ≤ {1 - low:.1e}")
    out += [f"- {k} skipped: {why}" for k, why in result.skipped.items()]
    return out


def document(result: Result, stamp: str, command: str, plot_name: str | None) -> str:
    """Return the whole markdown page of one run (pure)."""
    text = [
        f"# In-process ms per call per architecture: ours, torch, ONNX Runtime ({stamp})",
        "",
        f"Models: {result.size}. Measured {stamp} on {result.machine}; CPU class "
        f"**{result.cpu_class}**; "
        f"{result.threads} thread(s) per engine; sequence length {result.seq}, full-length rows; "
        f"medians of the interleaved calls ({result.rounds} rounds). Command: `{command}`.",
        "",
        "Milliseconds per call (in brackets: ours ÷ that engine, above 1 means it is faster "
        "than ours):",
        "",
        render(result),
        "",
    ]
    costs = cost_table(result)
    if costs:
        text += [f"Each architecture's cost beside BERT's, batch {max(result.batches)}:", "",
                 costs, ""]  # fmt: skip
    text += notes(result)
    if plot_name:
        text += ["", f"![ms per call per architecture and engine]({plot_name})"]
    return "\n".join(text) + "\n"


def rows(result: Result) -> list[Row]:
    """Return scripts/bench.py's rows: per architecture and batch, ours beside each engine."""
    out = []
    how = (f"{result.size}; in-process, seq {result.seq}, {result.threads} thread(s) per "
           "engine, medians of interleaved calls; ratio: ours ÷ engine")  # fmt: skip
    for arch in result.archs:
        ms = result.ms.get(arch, {})
        for b in result.batches:
            got = {e: ms[e][b] for e in ENGINES if b in ms.get(e, {})}
            if not got:
                continue
            value = " / ".join(f"{got[e]:.1f}" if e in got else "—" for e in ENGINES)
            ratio = ", ".join(f"{LABELS[e]} {got['ours'] / got[e]:.2f}×" for e in ENGINES[1:]
                              if e in got and "ours" in got)  # fmt: skip
            figure = f"{result.labels.get(arch, arch)}, batch {b}: ms ours / torch / ONNX Runtime"
            out.append(Row(figure=figure, value=value + " ms", ratio=ratio, how=how))
    for key, why in result.skipped.items():
        out.append(Row(figure=f"architectures: {key}", value=f"skipped: {why}"))
    return out


def plot(result: Result, path: Path) -> None:
    """Draw ms per call per architecture × engine, one panel per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result.batches), figsize=(6 * len(result.batches), 4.8))
    x = np.arange(len(result.archs))
    width = 0.8 / len(ENGINES)
    for ax, b in zip(np.atleast_1d(axes), result.batches, strict=True):
        for k, e in enumerate(ENGINES):
            ys = [result.ms.get(a, {}).get(e, {}).get(b, np.nan) for a in result.archs]
            ax.bar(x + (k - 1) * width, ys, width, label=LABELS[e])
        ax.set_xticks(x, [a for a in result.archs], rotation=30, ha="right")
        ax.set_ylabel("ms per call (median)")
        ax.set_title(f"batch {b}, seq {result.seq}")
        ax.grid(axis="y", alpha=0.3)
    np.atleast_1d(axes)[0].legend()
    fig.suptitle(f"{result.cpu_class}, {result.threads} thread(s) per engine — {result.machine}",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _run_path(out_dir: Path, when: dt.datetime, cpu_class: str, suffix: str) -> Path:
    """Return a new dated file name (never an existing file)."""
    slug = "".join(c if c.isalnum() else "-" for c in cpu_class.lower().replace("-", ""))
    stem = f"{when:%Y-%m-%d-%H%M}-{'-'.join(p for p in slug.split('-') if p)}-architectures"
    path, n = out_dir / f"{stem}{suffix}", 2
    while path.exists():
        path, n = out_dir / f"{stem}-{n}{suffix}", n + 1
    return path


def keep(result: Result, out_dir: Path, command: str) -> Path:
    """Write the run's page, plot and JSON as new dated files under ``out_dir``; return the page."""
    when = dt.datetime.now(dt.UTC)
    page = _run_path(out_dir, when, result.cpu_class, ".md")
    out_dir.mkdir(parents=True, exist_ok=True)
    png = page.with_suffix(".png")
    plot(result, png)
    stamp = f"{when:%Y-%m-%d %H:%M} UTC"
    with page.open("x", encoding="utf-8") as out:  # never over an existing file
        out.write(document(result, stamp, command, png.name))
    page.with_suffix(".json").write_text(json.dumps(result.__dict__, indent=1) + "\n")
    return page


def run(ctx: BenchContext) -> list[Row]:
    """scripts/bench.py's entry: every architecture, one thread; a smoke run keeps nothing."""
    work = ctx.work_dir / "architectures"
    result = measure(_selected(None, ctx.quick), threads=1, rounds=max(3, ctx.repeats),
                     quick=ctx.quick, work=work, cpu=ctx.cpu)  # fmt: skip
    if not ctx.quick:
        page = keep(result, REPO / "results" / "runs", "python scripts/bench.py --only "
                    "architectures_bench")  # fmt: skip
        ctx.notes.append(f"architectures_bench: table and plot in {page.relative_to(REPO)}")
    return rows(result)


def _selected(names: Sequence[str] | None, quick: bool) -> list[Arch]:
    if not names:
        return list(ARCHS)
    unknown = set(names) - {a.name for a in ARCHS}
    if unknown:
        raise SystemExit(f"unknown architecture(s) {sorted(unknown)}; known: "
                         f"{[a.name for a in ARCHS]}")  # fmt: skip
    return [a for a in ARCHS if a.name in names]


def main(argv: Sequence[str] | None = None, stdout: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", help="architectures (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="per engine (default 1)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny models, one call: a smoke run")
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "results" / "runs",
        help="where the dated page, plot and JSON go (not with --quick)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="arch-bench-") as tmp:
        result = measure(_selected(args.arch, args.quick), threads=args.threads,
                         rounds=args.rounds, quick=args.quick, work=Path(tmp),
                         say=lambda m: print(m, file=stdout, flush=True))  # fmt: skip
    command = "python -m benchmarks.architectures_bench " + shlex.join(
        list(argv if argv is not None else sys.argv[1:]))  # fmt: skip
    stamp = f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC"
    print(document(result, stamp, command.strip(), None), file=stdout)
    if not args.quick:
        page = keep(result, args.out, command.strip())
        print(f"written: {page} (+ .png, .json)", file=stdout)
    print(f"took {time.monotonic() - started:.0f} s", file=stdout)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    raise SystemExit(main())
