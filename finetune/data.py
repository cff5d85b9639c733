"""Labelled texts from TSV files (``text<TAB>label``), checked row by row.

Bad rows (bad UTF-8, no tab, empty text, empty or unknown label) are reported with their line
numbers in one error, never dropped: a silently shrinking data set is worse than a refusal.
"""

from __future__ import annotations

import codecs
import json
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
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
    refuse_bad_rows(path, bad)
    return Examples(texts=texts, labels=labels, path=path)


def _read_lines(path: Path) -> list[bytes]:
    """Return the file's lines as bytes, without a UTF-8 byte-order mark (Excel writes one)."""
    try:
        return path.read_bytes().removeprefix(codecs.BOM_UTF8).split(b"\n")
    except FileNotFoundError as exc:
        raise FinetuneError(f"data file not found: {path}") from exc
    except OSError as exc:
        raise FinetuneError(f"cannot read {path}: {exc.strerror}") from exc


def refuse_bad_rows(path: Path, bad: Sequence[str]) -> None:
    """Raise one FinetuneError listing the first bad rows (and counting the rest), if any."""
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
    refuse_bad_rows(path, bad)
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


def check_eval_set(
    examples: Examples | PairExamples | MultiLabelExamples | EntityExamples, what: str
) -> None:
    """Refuse an empty dev or test set (its labels are checked while reading)."""
    if not len(examples):
        raise FinetuneError(f"{examples.path}: the {what} set has no examples")


# -- the other heads' files (issue 22): pairs, multi-label, entity spans ---------------------------
PAIR_HEADER = ("text_a", "text_b", "label")
MULTI_HEADER = ("text", "labels")
DEFAULT_LABEL_DELIMITER = "|"


@dataclass(frozen=True)
class PairExamples:
    """Sentence pairs and their string labels, in file order (``text_a`` is the query side)."""

    texts_a: list[str]
    texts_b: list[str]
    labels: list[str]
    path: Path

    def __len__(self) -> int:
        return len(self.texts_a)


def _decode(raw: bytes) -> str:
    """Return one line as text; raise ValueError naming the bad byte (a bad row's reason)."""
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ValueError(f"bad UTF-8 at byte {exc.start}") from exc


def _known(label: str, known: Sequence[str] | None) -> str | None:
    if known is not None and label not in known:
        return f"unknown label {label!r} (the training set has {', '.join(known)})"
    return None


def _parse_pair(raw: bytes, known: Sequence[str] | None) -> tuple[str, str, str] | str:
    """Return ``(text_a, text_b, label)`` for one line, or the reason it is bad."""
    try:
        line = _decode(raw)
    except ValueError as exc:
        return str(exc)
    fields = line.split("\t")
    if len(fields) != 3:
        return f"{len(fields)} tab-separated fields, expected 3 (text_a, text_b, label)"
    text_a, text_b, label = (f.strip() for f in fields)
    for name, value in (("text_a", text_a), ("text_b", text_b), ("label", label)):
        if not value:
            return f"empty {name}"
    return _known(label, known) or (text_a, text_b, label)


def read_pairs(path: str | Path, known_labels: Sequence[str] | None = None) -> PairExamples:
    """Return the pairs of a ``text_a<TAB>text_b<TAB>label`` TSV (an optional header is skipped).

    A row with other than three fields is bad (a text holding a tab cannot be told apart from a
    missing field); ``known_labels`` makes any other label a bad row (dev and test files).
    """
    path = Path(path)
    a, b, labels, bad = [], [], [], []
    for number, raw in enumerate(_read_lines(path), start=1):
        if not raw.strip() or (number == 1 and _parse_pair(raw, None) == PAIR_HEADER):
            continue
        row = _parse_pair(raw, known_labels)
        if isinstance(row, str):
            bad.append(f"line {number}: {row}")
            continue
        a.append(row[0])
        b.append(row[1])
        labels.append(row[2])
    refuse_bad_rows(path, bad)
    return PairExamples(texts_a=a, texts_b=b, labels=labels, path=path)


@dataclass(frozen=True)
class MultiLabelExamples:
    """Texts and the labels each has (one or more, file order kept), and their file."""

    texts: list[str]
    labels: list[tuple[str, ...]]
    path: Path

    def __len__(self) -> int:
        return len(self.texts)


def _parse_multi(raw: bytes, delimiter: str, known: Sequence[str] | None
                 ) -> tuple[str, tuple[str, ...]] | str:  # fmt: skip
    """Return ``(text, labels)`` for one line, or the reason it is bad."""
    try:
        line = _decode(raw)
    except ValueError as exc:
        return str(exc)
    text, tab, field = line.rpartition("\t")
    if not tab:
        return "no tab between text and labels"
    text = text.strip()
    if not text:
        return "empty text"
    labels = tuple(label.strip() for label in field.split(delimiter))
    if not field.strip():
        return "empty labels (every text needs at least one)"
    if not all(labels):
        return f"an empty label in {field.strip()!r} (delimiter {delimiter!r})"
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        return f"label {twice[0]!r} given twice"
    for label in labels:
        reason = _known(label, known)
        if reason:
            return reason
    return text, labels


def read_multi_label(
    path: str | Path,
    known_labels: Sequence[str] | None = None,
    delimiter: str = DEFAULT_LABEL_DELIMITER,
) -> MultiLabelExamples:
    """Return the examples of a ``text<TAB>labels`` TSV, labels split on ``delimiter``.

    An optional ``text<TAB>labels`` header is skipped; an empty labels field, an empty label
    between delimiters, a label given twice and (``known_labels``) an unknown label are bad rows.
    """
    if not delimiter or delimiter in "\t\r\n":
        raise FinetuneError(f"label delimiter must be a non-empty string without tabs or newlines, "
                            f"got {delimiter!r}")  # fmt: skip
    path = Path(path)
    texts, labels, bad = [], [], []
    for number, raw in enumerate(_read_lines(path), start=1):
        if not raw.strip():
            continue
        if number == 1 and _parse_multi(raw, delimiter, None) == (
            MULTI_HEADER[0],
            MULTI_HEADER[1:],
        ):
            continue
        row = _parse_multi(raw, delimiter, known_labels)
        if isinstance(row, str):
            bad.append(f"line {number}: {row}")
            continue
        texts.append(row[0])
        labels.append(row[1])
    refuse_bad_rows(path, bad)
    return MultiLabelExamples(texts=texts, labels=labels, path=path)


@dataclass(frozen=True)
class Span:
    """One entity: character offsets into its text (``end`` exclusive) and its type."""

    start: int
    end: int
    label: str


@dataclass(frozen=True)
class EntityExamples:
    """Texts, their entity spans (sorted by start) and the line each came from."""

    texts: list[str]
    entities: list[list[Span]]
    lines: list[int]
    path: Path

    def __len__(self) -> int:
        return len(self.texts)


def _inside_character(text: str, offset: int) -> bool:
    """Whether ``offset`` splits a user-perceived character: a combining mark, a variation
    selector or a zero-width joiner right after it belongs to the character before it."""
    if not 0 < offset < len(text):
        return False
    char = text[offset]
    return (
        unicodedata.category(char) in ("Mn", "Me", "Mc")
        or char == "\u200d"
        or text[offset - 1] == "\u200d"
        or "\ufe00" <= char <= "\ufe0f"
    )


def _parse_span(text: str, entity: object, known: Sequence[str] | None) -> Span | str:
    """Return one entity of a row as a ``Span``, or the reason it is bad."""
    if not isinstance(entity, dict):
        return "an entity that is not an object"
    start, end, label = entity.get("start"), entity.get("end"), entity.get("label")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)):
        return f"entity {entity!r}: start and end must be integers"
    assert isinstance(start, int) and isinstance(end, int)
    if not isinstance(label, str) or not label.strip():
        return f"entity {entity!r}: label must be a non-empty string"
    where = f"entity [{start}, {end}) {label!r}"
    if not 0 <= start < end <= len(text):
        return f"{where} is out of range (the text has {len(text)} characters; end is exclusive)"
    covered = text[start:end]
    if not covered.strip():
        return f"{where} covers only whitespace"
    if covered != covered.strip():
        return f"{where} starts or ends with whitespace ({covered!r})"
    if _inside_character(text, start) or _inside_character(text, end):
        return f"{where} cuts a character in two ({covered!r})"
    label = label.strip()
    return _known(label, known) or Span(start, end, label)


def _parse_entities(raw: bytes, known: Sequence[str] | None) -> tuple[str, list[Span]] | str:
    """Return ``(text, spans sorted by start)`` for one JSONL line, or the reason it is bad."""
    try:
        row = json.loads(_decode(raw))
    except ValueError as exc:  # bad UTF-8 or bad JSON
        return str(exc) if "UTF-8" in str(exc) else f"not JSON ({exc})"
    if not isinstance(row, dict):
        return 'not a JSON object {"text": ..., "entities": [...]}'
    text, entities = row.get("text"), row.get("entities")
    if not isinstance(text, str) or not text.strip():
        return "text must be a non-empty string"
    if not isinstance(entities, list):
        return "entities must be a list (empty for a text without entities)"
    spans = []
    for entity in entities:
        span = _parse_span(text, entity, known)
        if isinstance(span, str):
            return span
        spans.append(span)
    spans.sort(key=lambda s: (s.start, s.end))
    for before, after in pairwise(spans):
        if after.start < before.end:
            return (f"entities [{before.start}, {before.end}) {before.label!r} and "
                    f"[{after.start}, {after.end}) {after.label!r} overlap")  # fmt: skip
    return text, spans


def read_entities(path: str | Path, known_types: Sequence[str] | None = None) -> EntityExamples:
    """Return the texts and entity spans of a JSONL file, one object per line:
    ``{"text": str, "entities": [{"start": int, "end": int, "label": str}, ...]}``.

    Offsets count Unicode code points (Python ``str`` indices), ``end`` exclusive. Bad JSON, a
    span out of range, covering only whitespace or with whitespace at either end, cutting a
    character (a combining mark or joined emoji from its base), overlapping another span, or
    (``known_types``) of a type the training set lacks: bad rows, all reported at once.
    """
    path = Path(path)
    texts, entities, lines, bad = [], [], [], []
    for number, raw in enumerate(_read_lines(path), start=1):
        if not raw.strip():
            continue
        row = _parse_entities(raw, known_types)
        if isinstance(row, str):
            bad.append(f"line {number}: {row}")
            continue
        texts.append(row[0])
        entities.append(row[1])
        lines.append(number)
    refuse_bad_rows(path, bad)
    return EntityExamples(texts=texts, entities=entities, lines=lines, path=path)


def check_label_set(labels: Sequence[str], path: Path, what: str = "label") -> list[str]:
    """Return the sorted distinct labels of a training set; refuse an empty set."""
    if not labels:
        raise FinetuneError(f"{path}: the training set has no {what}s")
    return sorted(set(labels))
