"""Session fixtures for the export suite: tiny checkpoints and versions built once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from export.tiny import write_google_checkpoint, write_hf_checkpoint

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def hf_classify(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertForSequenceClassification directory (3 labels)."""
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf-classify"), task="classify", seed=0)


@pytest.fixture(scope="session")
def hf_embed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BertModel directory (no head)."""
    return write_hf_checkpoint(tmp_path_factory.mktemp("hf-embed"), task="embed", seed=1)


@pytest.fixture(scope="session")
def google_classify(tmp_path_factory: pytest.TempPathFactory, hf_classify: Path) -> Path:
    """The weights of ``hf_classify`` as a Google BERT checkpoint with a run_classifier head."""
    return write_google_checkpoint(hf_classify, tmp_path_factory.mktemp("google") / "ckpt")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A base path shared by the session's published versions."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def classify_v1(hf_classify: Path, models: Path):  # type: ignore[no-untyped-def]
    """``hf_classify`` built as models/cls/1 (FP32, max_seq_len 64)."""
    from export.build import build

    return build(hf_classify, "cls", models, version=1, max_seq_len=64)


@pytest.fixture(scope="session")
def embed_v1(hf_embed: Path, models: Path):  # type: ignore[no-untyped-def]
    """``hf_embed`` built as models/emb/1 (FP32, mean pooling, max_seq_len 64)."""
    from export.build import build

    return build(hf_embed, "emb", models, version=1, task="embed", max_seq_len=64)
