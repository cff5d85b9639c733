"""The input pipeline: gateway token ids, batches padded to the gateway's buckets, less padding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backend.tokenization import BertTokenizer
from export.tiny import tiny_vocab
from finetune.pipeline import (
    UNCUT,
    bucket_boundaries,
    bucketed_batches,
    make_tokenizer,
    naive_batches,
    optimised_dataset,
    padding_tokens,
    pair_token_ids,
    token_ids,
)
from modelformat.buckets import bucket_for, buckets
from tests.finetune.conftest import separable_rows

MAX_SEQ_LEN = 64
TEXTS = [
    "Hello world, my order #123 was charged twice!",
    "我的订单还没到",
    "THE APP CRASHED [SEP] again",
    "refunds " * 80,  # longer than MAX_SEQ_LEN: cut to [CLS] … [SEP]
    "ok",
]


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    return make_tokenizer(tiny_vocab(), True, MAX_SEQ_LEN)


def test_ids_are_the_gateway_tokenizers(tmp_path: Path, tokenizer: BertTokenizer) -> None:
    (tmp_path / "vocab.txt").write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")
    gateway = BertTokenizer.from_files(tmp_path / "vocab.txt", max_seq_len=MAX_SEQ_LEN)

    ours = token_ids(tokenizer, TEXTS)

    assert [row.tolist() for row in ours] == [e.ids.tolist() for e in gateway.encode(TEXTS)]
    assert len(ours[3]) == MAX_SEQ_LEN


def test_boundaries_pad_to_the_serving_buckets() -> None:
    assert buckets(64) == [16, 32, 64]
    assert bucket_boundaries(64) == [17, 33, 65]


def _batches(tokenizer: BertTokenizer, texts: list[str]) -> list[tuple[dict, np.ndarray]]:
    ids = token_ids(tokenizer, texts)
    dataset = optimised_dataset(ids, list(range(len(texts))))
    return [
        ({k: v.numpy() for k, v in inputs.items()}, labels.numpy())
        for inputs, labels in bucketed_batches(dataset, 4, MAX_SEQ_LEN, tokenizer.pad_id, seed=1)
    ]


def test_every_batch_is_padded_to_its_rows_gateway_bucket(tokenizer: BertTokenizer) -> None:
    texts = [text for text, _ in separable_rows(40, seed=5)] + TEXTS
    expected = {i: row for i, row in enumerate(token_ids(tokenizer, texts))}

    batches = _batches(tokenizer, texts)

    seen = []
    for inputs, labels in batches:
        width = inputs["input_ids"].shape[1]
        assert width in buckets(MAX_SEQ_LEN)
        for row, mask, index in zip(inputs["input_ids"], inputs["attention_mask"], labels,
                                    strict=True):  # fmt: skip
            ids = expected[int(index)]
            assert bucket_for(len(ids), MAX_SEQ_LEN) == width
            assert row[: len(ids)].tolist() == ids.tolist()  # the gateway's ids, unchanged
            assert mask.sum() == len(ids) and not row[len(ids) :].any()
        seen += labels.tolist()
    assert sorted(seen) == list(range(len(texts)))  # nothing dropped, nothing repeated


def test_bucketing_pads_less_than_padding_to_max_seq_len(tokenizer: BertTokenizer) -> None:
    texts = [text for text, _ in separable_rows(64, seed=6)]
    labels = [0] * len(texts)

    bucketed = padding_tokens(iter(_batches(tokenizer, texts)))
    naive = padding_tokens(naive_batches(tokenizer, texts, labels, 4, seed=1))

    assert sum(bucketed) < sum(naive) / 2
    assert all(b[0]["input_ids"].shape[1] == MAX_SEQ_LEN
               for b in naive_batches(tokenizer, texts, labels, 4, seed=1))  # fmt: skip


def test_skip_resumes_the_same_epoch_order(tokenizer: BertTokenizer) -> None:
    texts = [text for text, _ in separable_rows(24, seed=7)]
    dataset = optimised_dataset(token_ids(tokenizer, texts), list(range(len(texts))))

    def order(skip: int) -> list[list[int]]:
        batches = bucketed_batches(dataset, 4, MAX_SEQ_LEN, 0, seed=3, skip=skip)
        return [labels.numpy().tolist() for _, labels in batches]

    assert order(2) == order(0)[2:]


# -- sentence pairs (issue 22) -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("a", "b"),
    [("where is my order", "track it " * 40), ("refund " * 20, "card " * 20),
     ("refund " * 19, "card " * 3), ("card " * 6, "order " * 5)],
)  # fmt: skip
def test_pairs_are_cut_as_the_gateway_cuts_them(a: str, b: str) -> None:
    """Training cuts a long pair exactly where serving does (ties included), so the model
    never sees at serve time a pair shape it was not trained on."""
    tokenizer = make_tokenizer(tiny_vocab(), True, 24)
    served = tokenizer.encode_pairs([(a, b)])[0]

    [ids], [types] = pair_token_ids(tokenizer, [a], [b])

    assert ids.tolist() == served.ids.tolist()
    assert served.type_ids is not None and types.tolist() == served.type_ids.tolist()


def test_pairs_get_token_types_one_on_the_second_segment() -> None:
    full = make_tokenizer(tiny_vocab(), True, UNCUT)

    [ids], [types] = pair_token_ids(make_tokenizer(tiny_vocab(), True, 16),
                                    ["where is my order"], ["track it " * 40])  # fmt: skip

    assert len(ids) == len(types) == 16
    cls, sep = full.cls_id, full.sep_id
    first = full.encode(["where is my order"])[0].ids.tolist()  # [CLS] … [SEP], 6 tokens
    assert ids[: len(first)].tolist() == first and ids[-1] == sep and ids[0] == cls
    assert types.tolist() == [0] * len(first) + [1] * (16 - len(first))
