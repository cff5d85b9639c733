"""Fixtures for the finetune suite: a tiny BERT, a trivially separable data set, one trained run."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from export.tiny import write_hf_checkpoint

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

POSITIVE = ["good", "great", "love", "happy", "thanks", "fine", "ok"]
NEGATIVE = ["bad", "terrible", "awful", "hate", "angry", "sad", "wrong"]
FILLER = ["the", "order", "item", "package"]
# Small and quick: 3 epochs of 64 texts at batch 8 learn the split in a few seconds.
TRAIN_KWARGS = {"epochs": 3, "batch_size": 8, "learning_rate": 3e-3, "seed": 7, "verbose": False}


def write_tsv(path: Path, rows: list[tuple[str, str]], header: bool = True) -> Path:
    """Write ``text<TAB>label`` rows (with a header) and return the path."""
    lines = (["text\tlabel"] if header else []) + [f"{t}\t{y}" for t, y in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def separable_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """Return ``n`` texts whose label is given by which word family they use (1-40 words)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = ("pos", "neg")[i % 2]
        words = POSITIVE if label == "pos" else NEGATIVE
        size = rng.choice([1, 3, 6, 12, 20, 40])
        text = " ".join(rng.choice(words) if rng.random() < 0.6 else rng.choice(FILLER)
                        for _ in range(size))  # fmt: skip
        rows.append((rng.choice(words) + " " + text, label))
    return rows


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BertModel directory (no classifier head)."""
    # one layer: each training run traces a step per variable, and tracing is what a run costs
    return write_hf_checkpoint(
        tmp_path_factory.mktemp("tiny") / "bert", task="embed", seed=3, layers=1
    )


@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Return a function saving (once per session) the tiny base checkpoint of an architecture
    (tests/export/test_architectures.py), with its tokenizer.json, as transformers saves it."""
    from tests.export.test_architectures import save_checkpoint

    where = tmp_path_factory.mktemp("bases")
    saved: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in saved:
            saved[arch] = save_checkpoint(arch, "embed", where)
        return saved[arch]

    return get


@pytest.fixture(scope="session")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Train (64) and dev (32) TSVs of the separable set."""
    root = tmp_path_factory.mktemp("data")
    return {
        "train": write_tsv(root / "train.tsv", separable_rows(64, seed=1)),
        "dev": write_tsv(root / "dev.tsv", separable_rows(32, seed=2)),
    }


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path, data: dict[str, Path]):  # type: ignore[no-untyped-def]
    """One uninterrupted fine-tuning run of ``tiny_bert`` on ``data`` (dev doubles as test)."""
    from finetune.run import finetune
    from finetune.training import TrainConfig

    out = tmp_path_factory.mktemp("runs") / "uninterrupted"
    return finetune(
        tiny_bert, data["train"], data["dev"], out, test_path=data["dev"],
        config=TrainConfig(**TRAIN_KWARGS), precision="fp32", max_seq_len=64,
    )  # fmt: skip
