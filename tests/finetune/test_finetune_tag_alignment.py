"""The tag task's labels sit where transformers' own alignment puts them, for every tokenizer kind.

Entity spans become BIO tags on the first token of each of the tokenizer's words (HF
``Encoding.word_ids``), ``IGNORE`` (-100) elsewhere: what transformers' token-classification
scripts do (``tokenize_and_align_labels``: the word's label on its first sub-token, -100 on the
rest and on the specials). Checked against transformers' fast tokenizer loaded from the same
checkpoint directory, for WordPiece (BERT), byte-level BPE (RoBERTa: ``Ġ`` tokens whose offsets
hold the space before a word), SentencePiece Unigram (XLM-R: ``▁``, a lone ``▁`` token at a
word's start) and ALBERT/DeBERTa-v3's lower-cased, accent-stripped Unigram, on texts with
multi-piece words, punctuation, accents, CJK, emoji and a double space; then one short
fine-tuning run from the RoBERTa checkpoint, read back by transformers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from finetune.data import read_entities
from finetune.errors import FinetuneError
from finetune.tasks import IGNORE, TagTask, TaskOptions

# architecture → its tiny checkpoint's tokenizer kind (tests/export/test_architectures.py)
KINDS = {"bert": "wordpiece", "roberta": "bpe", "xlm-roberta": "unigram",
         "deberta-v3": "unigram-cls"}  # fmt: skip


def _row(text: str, *entities: tuple[str, str]) -> dict[str, Any]:
    """Return an entities row: each (surface, type) found in ``text`` (its first occurrence)."""
    spans = []
    for surface, label in entities:
        start = text.index(surface)
        spans.append({"start": start, "end": start + len(surface), "label": label})
    return {"text": text, "entities": spans}


# entities whose edges are word edges for every tokenizer kind: transformers' alignment applies
ALIGNED = [
    _row("Order #12345 arrived broken, refund €49.99 to anna@example.test please",
         ("#12345", "ORDER"), ("€49.99", "AMOUNT"), ("anna@example.test", "EMAIL")),
    _row("Thé pâckage 我的订单还没到 refunding unbelievably, 😀 hello world",
         ("pâckage", "PRODUCT"), ("我的订单还没到", "ORDER")),
    _row("refunded on 14  March for my café order", ("14  March", "DATE"), ("café", "PRODUCT")),
    _row("unaffable payments paid twice, 😀", ("payments", "PRODUCT")),
]  # fmt: skip
# entities that end before punctuation or start inside a CJK run, inside one SentencePiece or
# byte-level word: the word splits there (BERT's words would)
SPLIT = [
    _row("arrived on 14 March: refund it", ("14 March", "DATE")),
    _row("order #12345, 我的订单还没到", ("12345", "ORDER"), ("订单", "ORDER")),
]  # fmt: skip


def _encode(path: Path, rows: list[dict[str, Any]], where: Path) -> tuple[TagTask, Any]:
    """Return the tag task and its encoded split of ``rows``, as finetune/run.py encodes them:
    the checkpoint's own tokenizer, whole (``UNCUT``) and cut to 64 tokens."""
    from export.checkpoint import read_checkpoint
    from finetune.pipeline import UNCUT, checkpoint_tokenizer

    file = where / "entities.jsonl"
    file.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    examples = read_entities(file)
    task = TagTask(TaskOptions("tag"))
    task.labels = task.label_set(examples)
    ckpt = read_checkpoint(path)
    split = task.encode(checkpoint_tokenizer(ckpt, 64), checkpoint_tokenizer(ckpt, UNCUT),
                        examples, "optimised")  # fmt: skip
    return task, split


def _transformers_alignment(path: Path, row: dict[str, Any], labels: list[str]) -> Any:
    """Return transformers' ids and aligned label ids of ``row``: its fast tokenizer on the text,
    each word's tag (from its characters, ``word_to_chars``) on the word's first token (-100 on
    the rest and on the specials), as ``run_ner.py``'s ``tokenize_and_align_labels`` does."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    text = row["text"]
    encoding = tokenizer(text)
    index = {label: i for i, label in enumerate(labels)}

    def tag(word: int) -> str:
        start, end = encoding.word_to_chars(word)
        stripped = text[start:end].strip()
        first = start + len(text[start:end]) - len(text[start:end].lstrip()) if stripped else start
        for span in row["entities"]:
            if first == span["start"] and stripped:
                return f"B-{span['label']}"
            if span["start"] < first < span["end"]:
                return f"I-{span['label']}"
        return "O"

    aligned, previous = [], None
    for word in encoding.word_ids():
        aligned.append(-100 if word is None or word == previous else index[tag(word)])
        previous = word
    return encoding["input_ids"], aligned


def _tokens(path: Path, text: str) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return list(tokenizer(text).tokens())


@pytest.mark.parametrize("arch", list(KINDS))
def test_labels_sit_on_each_words_first_token_as_transformers_aligns_them(
    arch: str, base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    path = base_checkpoint(arch)
    task, split = _encode(path, ALIGNED, tmp_path)

    assert IGNORE == -100  # transformers' ignore_index
    for row, ids, targets in zip(ALIGNED, split.ids, split.targets, strict=True):
        want_ids, want = _transformers_alignment(path, row, task.labels)
        assert ids.tolist() == want_ids  # the ids serving will send
        got = targets.tolist()
        assert got == want, list(zip(_tokens(path, row["text"]), got, want, strict=True))
    # multi-piece words: some tokens carry no label besides the specials
    assert any((t == IGNORE).sum() > 2 for t in split.targets)
    assert split.truncated == 0


@pytest.mark.parametrize("arch", list(KINDS))
def test_gold_tags_read_back_to_the_same_character_spans(
    arch: str, base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    rows = ALIGNED + SPLIT
    task, split = _encode(base_checkpoint(arch), rows, tmp_path)
    logits = []
    for targets in split.targets:  # all the weight on the gold tag of every labelled token
        row = np.zeros((len(targets), len(task.labels)), np.float32)
        row[np.arange(len(targets)), np.where(targets == IGNORE, 0, targets)] = 10.0
        logits.append(row)

    figures = task.figures(split, logits)

    for row, words, scores in zip(rows, split.words, logits, strict=True):
        want = {(s["start"], s["end"], s["label"]) for s in row["entities"]}
        assert task.predicted_entities(words, scores) == want
    assert figures["micro"]["f1"] == 1.0


@pytest.mark.parametrize("arch", list(KINDS))
def test_an_entity_before_punctuation_splits_the_tokenizers_word_there(
    arch: str, base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    """``March:`` is one SentencePiece word; the entity ``14 March`` leaves ``:`` an O of its
    own, as BERT's words (and byte-level BPE's) have it; ``订单`` inside a CJK run likewise."""
    task, split = _encode(base_checkpoint(arch), SPLIT, tmp_path)

    for row, words, targets in zip(SPLIT, split.words, split.targets, strict=True):
        at = {word.start: word for word in words}
        for span in row["entities"]:
            # a word starts with the entity and holds its B- tag on its first token ...
            assert task.labels[targets[at[span["start"]].token]] == f"B-{span['label']}"
            assert any(word.end == span["end"] for word in words)
            # ... and the character after it starts a word labelled afresh (O or B-)
            after = targets[at[span["end"]].token]
            assert after != IGNORE and not task.labels[after].startswith("I-")


@pytest.mark.parametrize("arch", list(KINDS))
def test_an_entity_edge_between_two_letters_is_refused_for_every_kind(
    arch: str, base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    bad = {"text": "refunding unbelievably", "entities": [{"start": 0, "end": 6, "label": "X"}]}

    with pytest.raises(FinetuneError, match=r"line 2: entity \[0, 6\) 'X' does not end at"):
        _encode(base_checkpoint(arch), [ALIGNED[0], bad], tmp_path)


def test_a_tagger_fine_tuned_from_a_bpe_checkpoint_loads_in_transformers_alike(
    base_checkpoint: Callable[[str], Path], tmp_path: Path
) -> None:
    """A few steps from the tiny RoBERTa (byte-level BPE): every entity of the data aligns (none
    refused, all counted), and transformers reads the tagger to export's logits."""
    import torch
    import transformers

    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule
    from finetune.run import finetune
    from finetune.training import TrainConfig
    from tests.finetune.test_finetune_heads import ONE_EPOCH, entity_rows, write_entities

    train = write_entities(tmp_path / "train.jsonl", entity_rows(32, 1))
    dev = write_entities(tmp_path / "dev.jsonl", entity_rows(20, 2))
    result = finetune(base_checkpoint("roberta"), train, dev, tmp_path / "out", test_path=dev,
                      config=TrainConfig(**ONE_EPOCH), precision="fp32", max_seq_len=32,
                      task=TaskOptions("tag"))  # fmt: skip

    config = json.loads((result.out / "config.json").read_text())
    assert config["architectures"] == ["RobertaForTokenClassification"]
    assert config["id2label"] == {"0": "O", "1": "B-DATE", "2": "I-DATE", "3": "B-PRODUCT",
                                  "4": "I-PRODUCT"}  # fmt: skip
    metrics = json.loads((result.out / "metrics.json").read_text())
    assert metrics["dev"]["texts"] == 20 and metrics["dev"]["micro"]["support"] == 30
    load = transformers.AutoModelForTokenClassification.from_pretrained
    model, info = load(str(result.out), local_files_only=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(result.out), local_files_only=True)
    batch = tokenizer(["my card was late today", "café 我的订单 🙂"], padding=True,
                      return_tensors="np")  # fmt: skip
    with torch.no_grad():
        theirs = model.eval()(
            input_ids=torch.from_numpy(batch["input_ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
        ).logits
    ckpt = read_checkpoint(result.out)
    module = EncoderModule(ckpt.config, ckpt.weights, task="tag")
    types = np.zeros_like(batch["input_ids"])
    ours = module.logits(
        batch["input_ids"].astype(np.int32),
        batch["attention_mask"].astype(np.int32),
        types.astype(np.int32),
    ).numpy()
    real = batch["attention_mask"].astype(bool)
    np.testing.assert_allclose(ours[real], theirs.numpy()[real], atol=1e-4)
