"""The tag head's alignment: character spans → BIO tags on first word pieces, and back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from export.tiny import tiny_vocab
from finetune.data import read_entities
from finetune.errors import FinetuneError
from finetune.pipeline import UNCUT, make_tokenizer
from finetune.tasks import IGNORE, TagTask, TaskOptions

TEXT = "my order ORD-123 for café 我的 arrived 🙂 yesterday"
SPANS = [{"start": 9, "end": 16, "label": "ORDER"}, {"start": 21, "end": 28, "label": "PRODUCT"},
         {"start": 39, "end": 48, "label": "DATE"}]  # fmt: skip


def _encode(tmp_path: Path, rows: list[dict], max_seq_len: int = 64):  # type: ignore[no-untyped-def,type-arg]
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    examples = read_entities(path)
    task = TagTask(TaskOptions("tag"))
    task.labels = task.label_set(examples)
    tokenizer = make_tokenizer(tiny_vocab(), True, max_seq_len)
    split = task.encode(tokenizer, make_tokenizer(tiny_vocab(), True, UNCUT), examples, "optimised")
    return task, split, tokenizer


def test_spans_become_bio_tags_on_each_words_first_piece(tmp_path: Path) -> None:
    assert [TEXT[s["start"] : s["end"]] for s in SPANS] == ["ORD-123", "café 我的", "yesterday"]
    task, split, tokenizer = _encode(tmp_path, [{"text": TEXT, "entities": SPANS}])

    assert task.labels == ["O", "B-DATE", "I-DATE", "B-ORDER", "I-ORDER", "B-PRODUCT",
                           "I-PRODUCT"]  # fmt: skip
    described = tokenizer.describe([TEXT])[0]
    tags = [(tok, task.labels[y] if y != IGNORE else None)
            for tok, y in zip(described["tokens"], split.targets[0], strict=True)]  # fmt: skip
    # "ORD-123": or ##d - [UNK]; café and 🙂 are [UNK] in the tiny vocabulary; CJK: a word a char
    assert tags == [
        ("[CLS]", None), ("my", "O"), ("order", "O"), ("or", "B-ORDER"), ("##d", None),
        ("-", "I-ORDER"), ("[UNK]", "I-ORDER"), ("for", "O"), ("[UNK]", "B-PRODUCT"),
        ("我", "I-PRODUCT"), ("的", "I-PRODUCT"), ("arrived", "O"), ("[UNK]", "O"),
        ("yesterday", "B-DATE"), ("[SEP]", None),
    ]  # fmt: skip
    # specials and continuation pieces carry no label
    assert split.targets[0][0] == IGNORE and split.targets[0][-1] == IGNORE
    pieces = [i for i, t in enumerate(described["tokens"]) if t.startswith("##")]
    assert pieces and all(split.targets[0][i] == IGNORE for i in pieces)


def test_gold_tags_read_back_to_the_same_character_spans(tmp_path: Path) -> None:
    task, split, _ = _encode(tmp_path, [{"text": TEXT, "entities": SPANS}])
    # logits that put all their weight on the gold tag of every labelled token
    logits = np.zeros((len(split.ids[0]), len(task.labels)), np.float32)
    for i, y in enumerate(split.targets[0]):
        logits[i, y if y != IGNORE else 0] = 10.0

    figures = task.figures(split, [logits])

    assert task.predicted_entities(split.words[0], logits) == {
        (9, 16, "ORDER"), (21, 28, "PRODUCT"), (39, 48, "DATE")}  # fmt: skip
    assert figures["micro"]["f1"] == 1.0 and figures["truncated_texts"] == 0


def test_entities_past_max_seq_len_are_counted_as_missed(tmp_path: Path) -> None:
    text = "order " * 30 + "123"
    row = {"text": text, "entities": [{"start": len(text) - 3, "end": len(text), "label": "N"}]}
    task, split, _ = _encode(tmp_path, [row], max_seq_len=16)
    logits = np.zeros((16, len(task.labels)), np.float32)

    figures = task.figures(split, [logits])

    assert split.truncated == 1 and len(split.ids[0]) == 16
    assert figures["micro"]["recall"] == 0.0 and figures["micro"]["support"] == 1


def test_a_span_inside_a_word_is_refused_with_its_line(tmp_path: Path) -> None:
    bad = {"text": "ORD123 late", "entities": [{"start": 0, "end": 3, "label": "ORDER"}]}
    rows = [{"text": "fine", "entities": []}, bad]

    with pytest.raises(FinetuneError, match=r"line 2: entity \[0, 3\) 'ORDER' does not end at"):
        _encode(tmp_path, rows)


def test_a_two_label_relevance_pair_head_ranks_by_the_relevant_probability() -> None:
    from finetune.tasks import PairTask
    from finetune.training import Split

    task = PairTask(TaskOptions("pair-classify"))
    task.labels = ["irrelevant", "relevant"]
    split = Split(texts=["q1", "q1", "q2", "q2"], label_ids=[0, 1, 1, 0])
    # q1 ranks its relevant document second, q2 first; argmax right on 3 of 4 rows
    logits = [np.array([0.0, 2.0]), np.array([0.0, 1.0]), np.array([0.0, 3.0]),
              np.array([1.0, 0.0])]  # fmt: skip

    figures = task.figures(split, logits)

    assert figures["accuracy"] == 0.75
    assert figures["rerank"]["mrr@10"] == pytest.approx((1 / 2 + 1) / 2)


def test_a_relevance_head_needs_both_labels(tmp_path: Path) -> None:
    from finetune.data import read_pairs
    from finetune.tasks import PairTask

    path = tmp_path / "p.tsv"
    path.write_text("q\td\t1\nq\te\t1\n")

    with pytest.raises(FinetuneError, match="needs both '0' and '1' rows"):
        PairTask(TaskOptions("pair-classify", num_labels=1)).label_set(read_pairs(path))


def test_a_one_logit_checkpoint_keeps_its_head_as_a_cross_encoder(tmp_path: Path) -> None:
    from export.checkpoint import read_checkpoint
    from export.tiny import write_hf_checkpoint
    from finetune.modeling import head_weights

    ckpt = read_checkpoint(write_hf_checkpoint(tmp_path / "ce", labels=("LABEL_0",), layers=1))

    weights, labels = head_weights(ckpt, ["relevant"], seed=0)

    assert labels == ["relevant"]
    np.testing.assert_array_equal(weights["classifier/kernel"], ckpt.weights["classifier/kernel"])
    _, fresh = head_weights(ckpt, ["a", "b"], seed=0)
    assert fresh == ["a", "b"]


def test_multi_label_dev_score_tunes_thresholds_so_low_sigmoids_still_rank_epochs() -> None:
    from finetune.tasks import MultiLabelTask
    from finetune.training import Split

    task = MultiLabelTask(TaskOptions("multi-label"))
    task.labels = ["a", "b"]
    targets = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], np.float32)
    split = Split(texts=["w", "x", "y", "z"], label_ids=[], targets=targets)
    # every sigmoid below 0.5, but the positives score higher than the negatives
    logits = [np.array([-1.0, -3.0]), np.array([-3.0, -1.0]), np.array([-1.2, -3.0]),
              np.array([-3.0, -1.2])]  # fmt: skip

    assert task.figures(split, logits)["micro_f1"] == 0.0  # at 0.5
    assert task.dev_score(split, logits) == 1.0
    assert task.thresholds == {}  # tuned only for the score; finish() sets them for the output
