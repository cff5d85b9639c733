"""transformers as the heads' reference (issue 22), shared by the unit and end-to-end tests.

The texts the token-classification tests tag, transformers' fast BERT tokenizer and its
``pipeline("token-classification")``, and that pipeline's entities in the gateway's answer shape
(``{entity, label, score, start, end, text}``), so a test compares like with like. torch and
transformers are imported only inside the functions: test-only references, never product code.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

TAG_TEXTS = [
    "my order 12345 never arrived, please help",
    "Thé órder of my pâckage is still läte today",  # accents: lowercased and stripped
    "我的订单还没到 and the package is lost",  # CJK: one token per character
    "hello 😀 my  card\twas charged   twice 🎉🎉",  # emoji ([UNK]) and odd whitespace
    "  refunding the ordered items, shipping tracking",  # word pieces (##ing, ##ed)
]
# 114 tokens: over 3× a 32-token model's max_seq_len, with accents, CJK and emoji throughout.
LONG = " ".join(
    ["my order 12345 was charged twice and thé pâckage never arrived 😀 我的订单还没到"] * 6
)


def hf_tokenizer(vocab_file: str | Path, max_seq_len: int) -> Any:
    """Return transformers' fast BERT tokenizer over ``vocab_file`` (lower-cased), cutting at
    ``max_seq_len`` as the pipeline does."""
    from transformers import BertTokenizerFast

    return BertTokenizerFast(str(vocab_file), do_lower_case=True, model_max_length=max_seq_len)


def token_pipeline(model: Any, tokenizer: Any, strategy: str) -> Any:
    """Return transformers' token-classification pipeline over ``model`` with ``strategy``."""
    from transformers import pipeline

    return pipeline("token-classification", model=model, tokenizer=tokenizer,
                    aggregation_strategy=strategy, device="cpu")  # fmt: skip


def reference_entities(found: Sequence[dict[str, Any]], text: str, strategy: str) -> list[dict]:
    """Return the pipeline's entities of ``text`` as the gateway writes them: ``label`` its
    ``entity`` (``none``) or ``entity_group``, ``entity`` the type without B-/I-."""
    key = "entity" if strategy == "none" else "entity_group"
    out = []
    for e in found:
        label = str(e[key])
        out.append({"entity": label.split("-", 1)[-1] if label[:2] in ("B-", "I-") else label,
                    "label": label, "score": float(e["score"]), "start": int(e["start"]),
                    "end": int(e["end"]), "text": text[e["start"] : e["end"]]})  # fmt: skip
    return out


def assert_same_entities(got: Sequence[dict], want: Sequence[dict], atol: float) -> None:
    """Assert two entity lists agree: every field equal, scores within ``atol``."""
    fields = ("entity", "label", "start", "end", "text")
    assert [tuple(e[f] for f in fields) for e in got] == [tuple(e[f] for f in fields) for e in want]
    assert [e["score"] for e in got] == pytest.approx([e["score"] for e in want], abs=atol)
