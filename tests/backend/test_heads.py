"""The pure parts of the pair, multi-label and tag heads (issue 22), against transformers.

No servers: sentence pairs are encoded as transformers' fast BERT tokenizer encodes them
(longest_first), and token classification turns a tiny random torch tagger's logits into the
entities transformers' pipeline("token-classification") gives, for every aggregation strategy,
long texts included (windows = the pipeline's stride chunks). torch is a test-only reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend.bucketing import Chunk, pad_batch, reassemble
from backend.postprocessing import classifications, positive_index
from backend.tagging import STRATEGIES, merge_overlapping, tag_text
from backend.tokenization import BertTokenizer, FirstSegmentTooLong, longest_first
from modelformat.heads import Head, head_from_info
from tests.backend.heads_reference import (
    LONG,
    TAG_TEXTS,
    assert_same_entities,
    reference_entities,
    token_pipeline,
)
from tests.backend.heads_reference import hf_tokenizer as reference_tokenizer

MAX_LEN = 32
TAGS = ["O", "B-ORDER", "I-ORDER", "B-PRODUCT", "I-PRODUCT"]


@pytest.fixture(scope="module")
def tokenizer(tiny_vocab_file: Path) -> BertTokenizer:
    return BertTokenizer.from_files(tiny_vocab_file, max_seq_len=MAX_LEN)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_vocab_file: Path) -> Any:
    return reference_tokenizer(tiny_vocab_file, MAX_LEN)


# -- sentence pairs ---------------------------------------------------------------------------


@pytest.mark.parametrize("n1", [0, 1, 5, 14, 15, 16, 29, 40])
@pytest.mark.parametrize("n2", [0, 1, 6, 14, 15, 16, 30, 41])
def test_longest_first_keeps_what_hf_tokenizers_keeps(n1: int, n2: int, tokenizer: Any) -> None:
    from tokenizers import Tokenizer

    rust = Tokenizer.from_str(tokenizer._tokenizer.to_str())
    rust.enable_truncation(MAX_LEN - 3, strategy="longest_first")
    rust.post_processor = None
    a, b = " ".join(["card"] * n1), " ".join(["order"] * n2)
    encoding = rust.encode(a, b, add_special_tokens=False)
    want = (encoding.type_ids.count(0), encoding.type_ids.count(1))

    assert longest_first(n1, n2, MAX_LEN - 3) == want


PAIRS = [
    ("where is my order", "your package ships in two days"),
    ("Thé órder 我的订单", "hello 😀 refund refunding"),
    (" ".join(["card"] * 20), " ".join(["order"] * 20)),  # both cut, the longer first
    ("help", " ".join(["refund money"] * 30)),  # only the second cut
    (" ".join(["late"] * 25), "why"),  # only the first cut: it is the longer
]


@pytest.mark.parametrize("pair", PAIRS, ids=range(len(PAIRS)))
def test_pairs_encode_as_transformers_encodes_them(
    pair: tuple[str, str], tokenizer: BertTokenizer, hf_tokenizer: Any
) -> None:
    want = hf_tokenizer(pair[0], pair[1], truncation=True, max_length=MAX_LEN)
    full = hf_tokenizer(pair[0], pair[1])

    (got,) = tokenizer.encode_pairs([pair])

    assert got.ids.tolist() == want["input_ids"]
    assert got.type_ids is not None and got.type_ids.tolist() == want["token_type_ids"]
    assert got.truncated == (len(full["input_ids"]) > MAX_LEN)
    assert got.full_length == len(full["input_ids"])


def test_a_first_segment_that_fills_max_seq_len_is_refused(tokenizer: BertTokenizer) -> None:
    with pytest.raises(FirstSegmentTooLong, match=r"pairs\[1\]\[0\] alone needs 32 tokens"):
        tokenizer.encode_pairs([("a", "b"), (" ".join(["card"] * 30), "b")])


def test_pad_batch_carries_each_pairs_token_type_ids(tokenizer: BertTokenizer) -> None:
    rows = tokenizer.encode_pairs([("help", "order"), ("card card", "x")])

    batch = pad_batch([r.ids for r in rows], 8, 0, [r.type_ids for r in rows])

    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 1, 1, 0, 0]]


# -- classifier heads -------------------------------------------------------------------------


def test_a_multi_label_head_answers_every_label_over_its_threshold() -> None:
    head = head_from_info({"problem_type": "multi_label_classification",
                           "labels": ["a", "b", "c"], "thresholds": {"b": 0.9}})  # fmt: skip
    outputs = {"probabilities": np.array([[0.7, 0.8, 0.2], [0.1, 0.95, 0.5]], np.float32)}

    got = classifications(outputs, ["a", "b", "c"], 1, head=head, with_scores=True)

    assert [[x["label"] for x in row["labels"]] for row in got] == [["a"], ["b", "c"]]
    assert got[0]["label"] == "b"  # the best score, though under b's own threshold
    assert [s["label"] for s in got[1]["scores"]] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("info", "want"),
    [({"labels": ["relevant"]}, 1 / (1 + np.exp(-2.0))),  # one logit: sigmoid
     ({"labels": ["score"], "problem_type": "regression"}, 2.0)],  # raw
)  # fmt: skip
def test_a_one_logit_head_answers_its_activations_score(info: dict, want: float) -> None:
    head = head_from_info(info)

    (got,) = classifications({"logits": np.array([[2.0]], np.float32)}, info["labels"], 1,
                             head=head)  # fmt: skip

    assert got["score"] == pytest.approx(want, abs=1e-6)
    assert ("labels" in got) == (head.activation == "sigmoid")


@pytest.mark.parametrize(
    ("labels", "want"),
    [(["relevant"], 0), (["0", "1"], 1), (["duplicate", "not_duplicate"], 0),
     (["contradiction", "entailment", "neutral"], 1), (["a", "b", "c"], None)],
)  # fmt: skip
def test_a_cross_encoder_ranks_by_its_positive_label(labels: list[str], want: int | None) -> None:
    assert positive_index(labels) == want


def test_unknown_head_values_are_refused() -> None:
    with pytest.raises(ValueError, match="problem_type"):
        head_from_info({"problem_type": "ordinal"})
    assert head_from_info({}) == Head()


# -- token classification ---------------------------------------------------------------------


def test_per_token_outputs_of_different_buckets_reassemble() -> None:
    chunks = [Chunk((1,), 16), Chunk((0,), 32)]
    outputs = [{"logits": np.ones((1, 16, 3))}, {"logits": np.full((1, 32, 3), 2.0)}]

    merged = reassemble(chunks, outputs, 2, per_token=True)["logits"]

    assert merged.shape == (2, 32, 3)
    assert merged[1, 15, 0] == 1.0 and merged[1, 16, 0] == 0.0 and merged[0, 31, 0] == 2.0


@pytest.fixture(scope="module")
def tagger(tiny_vocab_file: Path) -> Any:
    """A random torch BertForTokenClassification over the tiny vocabulary (no download)."""
    import torch
    from transformers import BertConfig, BertForTokenClassification

    torch.manual_seed(3)
    vocab_size = len(tiny_vocab_file.read_text(encoding="utf-8").splitlines())
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, max_position_embeddings=64, id2label=dict(enumerate(TAGS)),
        label2id={t: i for i, t in enumerate(TAGS)},
    )  # fmt: skip
    model = BertForTokenClassification(config).eval()
    with torch.no_grad():  # spread the logits so that every tag wins somewhere
        model.classifier.weight.mul_(40.0)
    return model


def _ours(text: str, windows: list, model: Any, strategy: str, unk_id: int) -> list[dict]:
    import torch

    rows = []
    for window in windows:
        ids = torch.tensor([window.encoded.ids.tolist()])
        with torch.no_grad():
            rows.append(model(input_ids=ids).logits[0].numpy())
    return tag_text(text, windows, rows, strategy, TAGS, unk_id)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("text", TAG_TEXTS, ids=range(len(TAG_TEXTS)))
def test_entities_match_the_transformers_pipeline(
    text: str, strategy: str, tagger: Any, tokenizer: BertTokenizer, hf_tokenizer: Any
) -> None:
    want = token_pipeline(tagger, hf_tokenizer, strategy)(text)

    got = _ours(text, tokenizer.tag_windows(text, 7), tagger, strategy, tokenizer.unk_id)

    assert_same_entities(got, reference_entities(want, text, strategy), atol=1e-5)
    assert any(e["label"] != "O" for e in got)  # the tagger does find entities


@pytest.mark.parametrize("strategy", ["simple", "first", "max", "average"])
def test_windowed_entities_match_the_pipeline_with_stride(
    strategy: str, tagger: Any, tokenizer: BertTokenizer, hf_tokenizer: Any
) -> None:
    """A text over max_seq_len: our windows are the pipeline's stride chunks, and the merge
    is its aggregate_overlapping_entities (the pipeline refuses stride with 'none')."""
    stride = (MAX_LEN - 2) // 4
    windows = tokenizer.tag_windows(LONG, stride)
    want = token_pipeline(tagger, hf_tokenizer, strategy)(LONG, stride=stride)

    got = _ours(LONG, windows, tagger, strategy, tokenizer.unk_id)

    assert len(windows) > 3 and not windows[0].encoded.truncated
    assert_same_entities(got, reference_entities(want, LONG, strategy), atol=1e-4)


def test_truncated_tagging_matches_the_pipeline_without_stride(
    tagger: Any, tokenizer: BertTokenizer, hf_tokenizer: Any
) -> None:
    windows = tokenizer.tag_windows(LONG, 7, truncate=True)
    want = token_pipeline(tagger, hf_tokenizer, "simple")(LONG)

    got = _ours(LONG, windows, tagger, "simple", tokenizer.unk_id)

    assert len(windows) == 1 and windows[0].encoded.truncated
    assert_same_entities(got, reference_entities(want, LONG, "simple"), atol=1e-4)


def test_overlapping_entities_keep_the_longer_then_the_more_confident() -> None:
    entities = [
        {"start": 0, "end": 4, "score": 0.5},
        {"start": 2, "end": 9, "score": 0.1},  # longer: replaces the first
        {"start": 10, "end": 12, "score": 0.4},
        {"start": 10, "end": 12, "score": 0.6},  # as long, more confident
    ]

    assert merge_overlapping(entities) == [entities[1], entities[3]]
