"""Tiny tokenizers of every kind the product serves, trained here with HF ``tokenizers``.

Tests and the parity matrix use them beside tiny random checkpoints: each writes the files
``save_pretrained`` writes for that family (``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``), so transformers' AutoTokenizer, loading that local directory, and the
gateway read the same files. Nothing is downloaded; no TensorFlow or torch.

Kinds (the family each stands for):
- ``wordpiece``: BERT / DistilBERT / ELECTRA / MPNet-style ([CLS] A [SEP] B [SEP], BertNormalizer);
- ``bpe``: byte-level BPE, RoBERTa / CamemBERT-style (<s> A </s></s> B </s>, ByteLevel);
- ``unigram``: SentencePiece Unigram, XLM-R-style (Metaspace, NFKC, <s> A </s></s> B </s>);
- ``unigram-cls``: SentencePiece Unigram, ALBERT / DeBERTa-v3-style ([CLS] A [SEP] B [SEP],
  type ids 1 on B, lower-cased and accent-stripped like ALBERT);
- ``sp-bpe``: SentencePiece BPE (Metaspace), <s> A </s> B </s>-style with type ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

KINDS = ("wordpiece", "bpe", "unigram", "unigram-cls", "sp-bpe")

_CORPUS = """
the quick brown fox jumps over the lazy dog. my card was charged twice and the refund never
arrived. where is my order? it is three days late. I can't log in: password reset doesn't work.
please help me with my account, the app crashed again today. thanks for the great service!
refunds, refunded, refunding, payment, payments, paid. delivery tracking shipped package.
Café naïve résumé façade Ångström ÉCOLE ÜBER straße. 我的订单还没到 你好世界 日本語のテキスト
Русский текст Ελληνικά العربية emoji 😀 👍 e-mail user@example.com https://example.com/a?b=c
hello world Hello World HELLO one two three 1 2 3 12345 order #12345 unbelievably unaffable
"""


def _lines() -> list[str]:
    lines = [line.strip() for line in _CORPUS.strip().splitlines()]
    return lines * 4


def _specials(kind: str) -> dict[str, str]:
    if kind in ("wordpiece", "unigram-cls"):
        return {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                "sep_token": "[SEP]", "mask_token": "[MASK]"}  # fmt: skip
    return {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
            "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}  # fmt: skip


def build_tokenizer(kind: str, vocab_size: int = 400) -> object:
    """Return a trained ``tokenizers.Tokenizer`` of ``kind`` (see the module's list)."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    names = _specials(kind)
    order = ["pad_token", "unk_token", "cls_token", "sep_token", "mask_token"]
    if kind not in ("wordpiece", "unigram-cls"):
        order = ["cls_token", "pad_token", "sep_token", "unk_token", "mask_token"]  # <s> 0, <pad> 1
    specials = list(dict.fromkeys(names[k] for k in order))
    unk = names["unk_token"]
    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=unk, max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=None)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer: object = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    elif kind == "bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )  # fmt: skip
    elif kind == "sp-bpe":
        tok = Tokenizer(models.BPE(unk_token=unk, fuse_unk=True, byte_fallback=False))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    else:  # unigram, unigram-cls
        tok = Tokenizer(models.Unigram())
        if kind == "unigram-cls":  # ALBERT: lower-cased, accents stripped
            tok.normalizer = normalizers.Sequence([
                normalizers.Replace("``", '"'), normalizers.Replace("''", '"'),
                normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase(),
            ])  # fmt: skip
        else:
            tok.normalizer = normalizers.Sequence(
                [normalizers.NFKC(), normalizers.Replace("  ", " ")]
            )
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token=unk
        )
    tok.train_from_iterator(_lines(), trainer=trainer)  # type: ignore[arg-type]
    if kind.startswith("unigram"):
        tok.model = _canonical_unigram(tok, len(specials))
    ids = {token: tok.token_to_id(token) for token in specials}
    cls, sep = names["cls_token"], names["sep_token"]
    if kind in ("bpe", "unigram"):  # RoBERTa / XLM-R: no token types, </s></s> between
        single, pair = f"{cls} $A {sep}", f"{cls} $A {sep} {sep} $B {sep}"
    else:
        single, pair = f"{cls} $A {sep}", f"{cls} $A {sep} $B:1 {sep}:1"
    if kind == "bpe":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=single, pair=pair,
                                          special_tokens=[(cls, ids[cls]), (sep, ids[sep])]),
        ])  # fmt: skip
    else:
        tok.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(cls, ids[cls]), (sep, ids[sep])]
        )
    mask = names["mask_token"]
    tok.add_special_tokens([
        AddedToken(t, special=True, normalized=False, lstrip=(t == mask and kind != "wordpiece"))
        for t in specials
    ])  # fmt: skip
    return tok


def _canonical_unigram(tok: Any, specials: int) -> Any:
    """Return ``tok``'s Unigram model with its pieces in a fixed order and scores rounded.

    The trainer's hash maps make each run order equal-score pieces differently (other ids,
    so another model's answers) and sum scores in other orders (differences up to 4e-11);
    rounded to 1e-6 and sorted by (score, piece) the same corpus gives the same tokenizer
    every run, as golden answers need (tests/backend/golden.py).
    """
    from tokenizers import models

    state = json.loads(tok.to_str())["model"]
    head, pieces = state["vocab"][:specials], state["vocab"][specials:]
    pieces = sorted(([p, round(s, 6)] for p, s in pieces), key=lambda x: (-x[1], x[0]))
    return models.Unigram([tuple(x) for x in head + pieces], state["unk_id"],
                          state.get("byte_fallback", False))  # fmt: skip


def write_tokenizer(
    dest: str | Path,
    kind: str,
    *,
    truncation_side: str = "right",
    model_max_length: int = 512,
    vocab_size: int = 400,
    trained: object | None = None,
) -> Path:
    """Write ``kind``'s tokenizer.json, tokenizer_config.json and special_tokens_map.json into
    ``dest`` (created) and return ``dest``; the config names the class transformers uses.
    ``trained``: a tokenizer ``build_tokenizer`` made (else one is trained here)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tok = trained if trained is not None else build_tokenizer(kind, vocab_size)
    tok.save(str(dest / "tokenizer.json"))  # type: ignore[attr-defined]
    names = _specials(kind)
    config = {
        **names,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "truncation_side": truncation_side,
        "padding_side": "right",
        "clean_up_tokenization_spaces": False,
    }
    if kind == "wordpiece":
        config["do_lower_case"] = True
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (dest / "special_tokens_map.json").write_text(json.dumps(names, indent=2), encoding="utf-8")
    return dest
