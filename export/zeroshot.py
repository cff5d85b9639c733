"""Zero-shot classification head: label descriptions embedded at export time with the same encoder.

Prompt file format (UTF-8): one ``label<TAB>description`` per line. A label may appear on several
lines; its descriptions' unit embeddings are averaged (a small prompt ensemble). A line without a
tab uses the label itself as the description. Blank lines and lines starting with ``#`` are skipped.
The served model outputs ``logits = scale * cos(text, label)`` and their softmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from export.errors import ExportError

Encoder = Callable[[dict[str, np.ndarray]], np.ndarray]


def read_label_prompts(path: str | Path) -> list[tuple[str, str]]:
    """Return ``(label, description)`` pairs from a prompt file, in file order."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read label prompts {path}: {exc}") from exc
    pairs = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        label, _, description = line.partition("\t")
        label, description = label.strip(), description.strip() or label.strip()
        if not label:
            raise ExportError(f"{path}:{number}: empty label")
        pairs.append((label, description))
    if len({label for label, _ in pairs}) < 2:
        raise ExportError(f"{path}: a zero-shot head needs at least two labels")
    return pairs


def tokenize(
    texts: Sequence[str],
    vocab: Sequence[str],
    do_lower_case: bool,
    max_seq_len: int,
    tokenizer_json: str | None = None,
    pad_id: int = 0,
) -> dict[str, np.ndarray]:
    """Return padded int32 inputs for ``texts``: with the checkpoint's ``tokenizer_json`` when
    given (padded with ``pad_id``), else WordPiece of ``vocab`` (the ``tokenizers`` library)."""
    from tokenizers import BertWordPieceTokenizer, Tokenizer

    if tokenizer_json is not None:
        own = Tokenizer.from_str(tokenizer_json)
        own.enable_truncation(max_seq_len)
        own.enable_padding(pad_id=pad_id)
        return _arrays(own.encode_batch(list(texts)))

    missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in vocab]
    if missing:
        raise ExportError(f"vocabulary lacks the special tokens {missing}")
    tokenizer = BertWordPieceTokenizer(
        {token: i for i, token in enumerate(vocab)}, lowercase=do_lower_case
    )
    tokenizer.enable_truncation(max_seq_len)
    tokenizer.enable_padding(pad_id=vocab.index("[PAD]"), pad_token="[PAD]")
    return _arrays(tokenizer.encode_batch(list(texts)))


def _arrays(encodings: Sequence[Any]) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int32),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int32),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int32),
    }


def label_embeddings(
    pairs: Sequence[tuple[str, str]],
    encode: Encoder,
    vocab: Sequence[str],
    do_lower_case: bool,
    max_seq_len: int,
    tokenizer_json: str | None = None,
    pad_id: int = 0,
) -> tuple[list[str], np.ndarray]:
    """Return the labels (first-seen order) and one unit vector per label ``[n, hidden]``."""
    descriptions = [d for _, d in pairs]
    vectors = encode(tokenize(descriptions, vocab, do_lower_case, max_seq_len, tokenizer_json,
                              pad_id))  # fmt: skip
    vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    labels = list(dict.fromkeys(label for label, _ in pairs))
    rows = []
    for label in labels:
        mean = vectors[[i for i, (lab, _) in enumerate(pairs) if lab == label]].mean(axis=0)
        rows.append(mean / max(float(np.linalg.norm(mean)), 1e-12))
    return labels, np.stack(rows).astype(np.float32)
