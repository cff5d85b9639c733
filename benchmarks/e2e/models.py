"""The models a run makes: the tickets checkpoint with students, its two exports, tiny-floor,
the demo embedder linked in, and the model server's config over them."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import BenchContext
from benchmarks.e2e.plan import (
    DATA,
    EMBED,
    EXITS,
    FLOOR,
    FULL,
    MAX_SEQ_LEN,
    MODEL,
    say,
)
from ops.procs import REPO


def find_checkpoint(ctx: BenchContext, work: Path) -> tuple[Path, str]:
    """Return (checkpoint with distilled students, where it came from)."""
    if ctx.quick:
        from export.tiny import write_hf_checkpoint
        from finetune.data import read_examples

        labels = sorted(set(read_examples(DATA / "train.tsv").labels))
        path = write_hf_checkpoint(work / "tiny-exits", labels=labels, layers=3, exits=True)
        return path, "random 3-layer BERT with random students (--quick: accuracy is noise)"
    for candidate in (
        os.environ.get("E2E_CHECKPOINT"),
        REPO / "run/finetune-demo/tickets-v1-exits",
    ):
        if candidate and (Path(candidate) / "config.json").is_file():
            return Path(candidate), f"checkpoint {candidate} (reused)"
    from benchmarks.early_exit_bench import EPOCHS, distilled_checkpoint

    say("fine-tuning MiniLM on data/tickets and distilling its students (no checkpoint to reuse)")
    path = distilled_checkpoint(work, lambda m: print(f"  {m}", flush=True))
    return path, f"MiniLM-L6 fine-tuned {EPOCHS} epochs + students, trained in this run"


def export_models(ctx: BenchContext, checkpoint: Path, base: Path) -> None:
    """Export tickets v1 (no exits) and v2 (exits), tiny-floor, and link the demo embedder."""
    from export.build import build
    from export.tiny import export_tiny_model

    for version, exits in ((FULL, False), (EXITS, True)):
        say(f"exporting {MODEL} v{version} ({'--early-exit' if exits else 'no exits'})")
        build(checkpoint, MODEL, base, version=version, task="classify", precision="fp32",
              max_seq_len=MAX_SEQ_LEN, early_exit=exits)  # fmt: skip
    export_tiny_model(base, FLOOR, task="classify", version=1, max_seq_len=MAX_SEQ_LEN)
    if (ctx.base_path / EMBED).is_dir():
        (base / EMBED).symlink_to(ctx.base_path / EMBED, target_is_directory=True)


def server_config(base: Path, path: Path, tickets_only: bool = False) -> Path:
    """Write the model server's config: both tickets versions, tiny-floor, minilm if linked."""
    entries = [
        f'  config {{ name: "{MODEL}" base_path: "{base / MODEL}" model_platform: "tensorflow" '
        f"model_version_policy {{ specific {{ versions: {FULL} versions: {EXITS} }} }} }}",
    ]
    if not tickets_only:
        floor = f'name: "{FLOOR}" base_path: "{base / FLOOR}" model_platform: "tensorflow"'
        entries.append(f"  config {{ {floor} }}")
        if (base / EMBED).exists():
            entries.append(
                f'  config {{ name: "{EMBED}" base_path: "{base / EMBED}" '
                'model_platform: "tensorflow" }'
            )
    path.write_text("model_config_list {\n" + "\n".join(entries) + "\n}\n", encoding="utf-8")
    return path
