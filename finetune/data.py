"""Labelled texts from TSV files (``text<TAB>label``), checked row by row.

Bad rows (bad UTF-8, no tab, empty text, empty or unknown label) are reported with their line
numbers in one error, never dropped: a silently shrinking data set is worse than a refusal.
"""

from __future__ import annotations

import codecs
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from finetune.errors import FinetuneError

HEADER = ("text", "label")
SHOWN_BAD_ROWS = 5  # more than this and the message only counts the rest


@dataclass(frozen=True)
class Examples:
    """Texts and their string labels, in file order, and the file they came from."""

    texts: list[str]
    labels: list[str]
    path: Path

    def __len__(self) -> int:
        return len(self.texts)


def _parse_row(raw: bytes, known: Sequence[str] | None) -> tuple[str, str] | str:
    """Return ``(text, label)`` for one line, or the reason it is bad."""
    try:
        line = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        return f"bad UTF-8 at byte {exc.start}"
    text, tab, label = line.rpartition("\t")  # the label never holds a tab; a text might
    if not tab:
        return "no tab between text and label"
    text, label = text.strip(), label.strip()
    if not text:
        return "empty text"
    if not label:
        return "empty label"
    if known is not None and label not in known:
        return f"unknown label {label!r} (the training set has {', '.join(known)})"
    return text, label


def read_examples(path: str | Path, known_labels: Sequence[str] | None = None) -> Examples:
    """Return the examples of a ``text<TAB>label`` TSV file (an optional header row is skipped).

    ``known_labels`` makes any other label a bad row (dev and test files: the labels train has).
    """
    path = Path(path)
    lines = _read_lines(path)
    texts, labels, bad = [], [], []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip() or (number == 1 and _parse_row(raw, None) == HEADER):
            continue
        row = _parse_row(raw, known_labels)
        if isinstance(row, str):
            bad.append(f"line {number}: {row}")
        else:
            texts.append(row[0])
            labels.append(row[1])
    _refuse_bad_rows(path, bad)
    return Examples(texts=texts, labels=labels, path=path)


def _read_lines(path: Path) -> list[bytes]:
    """Return the file's lines as bytes, without a UTF-8 byte-order mark (Excel writes one)."""
    try:
        return path.read_bytes().removeprefix(codecs.BOM_UTF8).split(b"\n")
    except FileNotFoundError as exc:
        raise FinetuneError(f"data file not found: {path}") from exc
    except OSError as exc:
        raise FinetuneError(f"cannot read {path}: {exc.strerror}") from exc


def _refuse_bad_rows(path: Path, bad: Sequence[str]) -> None:
    if bad:
        more = f"; and {len(bad) - SHOWN_BAD_ROWS} more" if len(bad) > SHOWN_BAD_ROWS else ""
        raise FinetuneError(f"{path}: {len(bad)} bad rows: {'; '.join(bad[:SHOWN_BAD_ROWS])}{more}")


@dataclass(frozen=True)
class Texts:
    """Texts in file order; their labels only when every row has one (else None)."""

    texts: list[str]
    labels: list[str] | None
    path: Path

    def __len__(self) -> int:
        return len(self.texts)


def read_texts(path: str | Path) -> Texts:
    """Return the texts of a ``text<TAB>label`` TSV or of a file with one text per line.

    For distillation, where labels are not needed: a row's label (after its last tab) is kept
    only if every row has one; bad UTF-8 and empty texts are still bad rows, reported together.
    """
    path = Path(path)
    texts, labels, bad = [], [], []
    for number, raw in enumerate(_read_lines(path), start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            bad.append(f"line {number}: bad UTF-8 at byte {exc.start}")
            continue
        text, _tab, label = line.rpartition("\t") if "\t" in line else (line, "", "")
        text, label = text.strip(), label.strip()
        if number == 1 and (text, label) in (HEADER, ("text", "")):
            continue
        if not text:
            bad.append(f"line {number}: empty text")
            continue
        texts.append(text)
        labels.append(label)
    _refuse_bad_rows(path, bad)
    return Texts(texts=texts, labels=labels if all(labels) else None, path=path)


def check_train_set(train: Examples) -> list[str]:
    """Return the label set of a usable training set (sorted); refuse empty and one-class sets."""
    if not train.texts:
        raise FinetuneError(f"{train.path}: the training set has no examples")
    counts = Counter(train.labels)
    if len(counts) < 2:
        raise FinetuneError(
            f"{train.path}: the training set has one label only ({next(iter(counts))!r}); "
            "a classifier needs at least two"
        )
    return sorted(counts)


def check_eval_set(examples: Examples, what: str) -> None:
    """Refuse an empty dev or test set (its labels are checked while reading)."""
    if not examples.texts:
        raise FinetuneError(f"{examples.path}: the {what} set has no examples")
