"""The data loader: bad rows reported with line numbers; unusable training sets refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune.data import (
    Span,
    check_train_set,
    read_entities,
    read_examples,
    read_multi_label,
    read_pairs,
)
from finetune.errors import FinetuneError


def test_a_byte_order_mark_does_not_make_the_header_a_row(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" export starts with a BOM: the header must still be skipped."""
    path = tmp_path / "train.tsv"
    path.write_text("\ufefftext\tlabel\nmy card was charged twice\tbilling\n", encoding="utf-8")

    examples = read_examples(path)

    assert examples.labels == ["billing"] and examples.texts == ["my card was charged twice"]


def test_reads_text_and_label_and_skips_the_header(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\nmy card was charged twice\tbilling\n\nwhere is it\tdelivery\n")

    examples = read_examples(path)

    assert examples.texts == ["my card was charged twice", "where is it"]
    assert examples.labels == ["billing", "delivery"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"no tab here", "line 3: no tab between text and label"),
        (b"   \tbilling", "line 3: empty text"),
        (b"some text\t", "line 3: empty label"),
        (b"caf\xe9 is closed\tbilling", "line 3: bad UTF-8 at byte 3"),
        (b"my parcel\tshipping", "line 3: unknown label 'shipping'"),
    ],
)
def test_bad_row_is_reported_with_its_line_number(tmp_path: Path, line: bytes, reason: str) -> None:
    path = tmp_path / "dev.tsv"
    path.write_bytes(b"text\tlabel\nfine row\tbilling\n" + line + b"\nanother\tdelivery\n")

    with pytest.raises(FinetuneError) as info:
        read_examples(path, known_labels=["billing", "delivery"])

    assert reason in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_every_bad_row_is_counted_not_dropped(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("".join(f"row {i}\n" for i in range(8)) + "good\tbilling\n")

    with pytest.raises(FinetuneError, match=r"8 bad rows: line 1: .*line 5: .*; and 3 more"):
        read_examples(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("text\tlabel\n", "has no examples"),
        ("a\tbilling\nb\tbilling\n", "one label only ('billing')"),
    ],
)
def test_unusable_training_set_is_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "train.tsv"
    path.write_text(content)

    with pytest.raises(FinetuneError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_train_set(read_examples(path))


def test_labels_of_a_usable_training_set_are_sorted(tmp_path: Path) -> None:
    path = tmp_path / "train.tsv"
    path.write_text("a\trefund\nb\tbilling\nc\trefund\n")

    assert check_train_set(read_examples(path)) == ["billing", "refund"]


# -- pairs, multi-label, entity spans (issue 22) ---------------------------------------------------
def test_pairs_are_read_with_a_bom_and_a_header(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text("\ufefftext_a\ttext_b\tlabel\nwhere is my order\ttrack it here\trelevant\n")

    pairs = read_pairs(path)

    assert (pairs.texts_a, pairs.texts_b, pairs.labels) == (
        ["where is my order"],
        ["track it here"],
        ["relevant"],
    )


def test_bad_pair_rows_are_reported_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "pairs.tsv"
    path.write_text("text_a\ttext_b\tlabel\nonly two\tfields\nq\t \t1\nq\td\t2\n")

    with pytest.raises(FinetuneError) as caught:
        read_pairs(path, known_labels=["0", "1"])

    message = str(caught.value)
    assert "3 bad rows" in message
    assert "line 2: 2 tab-separated fields, expected 3" in message
    assert "line 3: empty text_b" in message and "line 4: unknown label '2'" in message


def test_multi_label_rows_split_on_the_delimiter(tmp_path: Path) -> None:
    path = tmp_path / "ml.tsv"
    path.write_text("text\tlabels\ncharged twice\tbilling | refund\nlate\tdelivery\n")

    examples = read_multi_label(path)

    assert examples.labels == [("billing", "refund"), ("delivery",)]
    other = tmp_path / "ml2.tsv"
    other.write_text("charged twice\tbilling,refund\n")
    assert read_multi_label(other, delimiter=",").labels == [("billing", "refund")]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("x\t", "empty labels"),
        ("x\ta||b", "an empty label in 'a||b'"),
        ("x\ta|a", "label 'a' given twice"),
        ("x\ta|zzz", "unknown label 'zzz'"),
        ("no tab", "no tab between text and labels"),
    ],
)
def test_bad_multi_label_rows(tmp_path: Path, line: str, reason: str) -> None:
    path = tmp_path / "ml.tsv"
    path.write_text(f"text\tlabels\n{line}\n")

    with pytest.raises(FinetuneError, match=f"line 2: {reason}"):
        read_multi_label(path, known_labels=["a", "b"])


def test_entity_spans_are_read_sorted(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    row = {
        "text": "order 123 for café",
        "entities": [
            {"start": 14, "end": 18, "label": "PRODUCT"},
            {"start": 6, "end": 9, "label": "ORDER"},
        ],
    }
    path.write_text("\ufeff" + json.dumps(row, ensure_ascii=False) + "\n\n", encoding="utf-8")

    examples = read_entities(path)

    assert examples.texts == ["order 123 for café"] and examples.lines == [1]
    assert examples.entities == [[Span(6, 9, "ORDER"), Span(14, 18, "PRODUCT")]]


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"text": "abc", "entities": [{"start": 1, "end": 9, "label": "X"}]}, "out of range"),
        ({"text": "abc", "entities": [{"start": 2, "end": 2, "label": "X"}]}, "out of range"),
        ({"text": "a  b", "entities": [{"start": 1, "end": 3, "label": "X"}]}, "only whitespace"),
        ({"text": "ab cd", "entities": [{"start": 0, "end": 3, "label": "X"}]}, "with whitespace"),
        (
            {"text": "cafe\u0301 x", "entities": [{"start": 0, "end": 4, "label": "X"}]},
            "cuts a character",
        ),
        (
            {
                "text": "abcdef",
                "entities": [
                    {"start": 0, "end": 3, "label": "X"},
                    {"start": 2, "end": 5, "label": "Y"},
                ],
            },
            "overlap",
        ),
        ({"text": "abc", "entities": [{"start": "0", "end": 1, "label": "X"}]}, "integers"),
        ({"text": "abc", "entities": [{"start": 0, "end": 1, "label": "Z"}]}, "unknown label 'Z'"),
        ({"text": "", "entities": []}, "text must be a non-empty string"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_bad_entity_rows_name_the_line(tmp_path: Path, row: object, reason: str) -> None:
    path = tmp_path / "e.jsonl"
    good = json.dumps({"text": "fine", "entities": []})
    path.write_text(good + "\n" + json.dumps(row) + "\n")

    with pytest.raises(FinetuneError) as caught:
        read_entities(path, known_types=["X", "Y"])

    assert "1 bad rows: line 2: " in str(caught.value) and reason in str(caught.value)


def test_an_entity_line_that_is_not_json_is_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_text('{"text": "a", "entities": []}\n{"text": oops}\n')

    with pytest.raises(FinetuneError, match="line 2: not JSON"):
        read_entities(path)
