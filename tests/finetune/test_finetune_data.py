"""The data loader: bad rows reported with line numbers; unusable training sets refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from finetune.data import check_train_set, read_examples
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
