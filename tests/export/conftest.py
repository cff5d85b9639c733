"""Session fixtures for the export suite: tiny checkpoints and versions built once."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export.tiny import write_google_checkpoint, write_hf_checkpoint

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class Bundle:
    """A version loaded the way TF Serving loads it: a SavedModelBundle (TF1 graph + session)."""

    def __init__(self, session: Any, meta: Any) -> None:
        self.session = session
        self.meta = meta

    def run(self, signature_name: str, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Return every output of ``signature_name`` for ``feeds``, fed by tensor name."""
        signature = self.meta.signature_def[signature_name]
        outputs: dict[str, np.ndarray] = self.session.run(
            {name: info.name for name, info in signature.outputs.items()},
            {signature.inputs[name].name: value for name, value in feeds.items()},
        )
        return outputs


@contextmanager
def tf_serving_bundle(path: str | Path) -> Iterator[Bundle]:
    """Yield the version at ``path`` loaded through the TF1 session loader TF Serving uses."""
    import tensorflow as tf

    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        yield Bundle(session, tf.compat.v1.saved_model.loader.load(session, ["serve"], str(path)))


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
