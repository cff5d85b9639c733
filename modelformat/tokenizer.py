"""A version's tokenizer on disk: ``assets/tokenizer.json`` (HF ``tokenizers``) and its
``model.json`` entry; older versions hold only ``assets/vocab.txt``.

Export writes the checkpoint's own ``tokenizer.json`` (or, for a ``vocab.txt``-only checkpoint,
the WordPiece one ``wordpiece_tokenizer`` builds, which is what transformers' ``BertTokenizerFast``
converts a vocab.txt into); the gateway loads either with ``load_tokenizer`` and asks the
tokenizer for ids, offsets and special tokens, so no tokenizer rule is written by hand. Imports
``tokenizers`` only when called (modelserver imports this package too).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_JSON = Path("assets") / "tokenizer.json"
VOCAB_TXT = Path("assets") / "vocab.txt"
BERT_SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                 "sep_token": "[SEP]", "mask_token": "[MASK]"}  # fmt: skip
SPECIAL_KEYS = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token", "bos_token",
                "eos_token")  # fmt: skip
SIDES = ("right", "left")


@dataclass(frozen=True)
class TokenizerSpec:
    """What the gateway needs beside the tokenizer itself (model.json's ``tokenizer`` entry)."""

    pad_id: int
    unk_id: int | None
    truncation_side: str = "right"


def wordpiece_tokenizer(
    vocab: Mapping[str, int] | Sequence[str],
    *,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    chinese_chars: bool = True,
) -> Any:
    """Return the ``tokenizers.Tokenizer`` transformers' ``BertTokenizerFast`` makes of a
    vocab.txt: BertNormalizer, BertPreTokenizer, WordPiece, ``[CLS] $A [SEP]`` /
    ``[CLS] $A [SEP] $B:1 [SEP]:1``, the specials matched in raw text.

    Raises ValueError when the vocabulary lacks [CLS], [SEP] or [UNK].
    """
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    index: dict[str, int] = {}
    if isinstance(vocab, Mapping):
        index = dict(vocab)
    else:
        for i, token in enumerate(vocab):
            index.setdefault(token, i)  # BertTokenizer keeps a duplicated token's first id
    cls, sep, unk = (
        BERT_SPECIALS["cls_token"],
        BERT_SPECIALS["sep_token"],
        BERT_SPECIALS["unk_token"],
    )
    for special in (cls, sep, unk):
        if special not in index:
            raise ValueError(f"vocabulary has no {special} token")
    tokenizer = Tokenizer(models.WordPiece(index, unk_token=unk, max_input_chars_per_word=100))
    # strip_accents None follows lowercase, exactly like BertTokenizer's BasicTokenizer.
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=chinese_chars, strip_accents=strip_accents,
        lowercase=lowercase,
    )  # fmt: skip
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, index[cls]), (sep, index[sep])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    # BertTokenizer matches its special tokens in the raw text ("[SEP]" typed by a user is
    # its id, not "[", "sep", "]"); registering them reproduces that.
    specials = [t for t in BERT_SPECIALS.values() if t in index]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tokenizer


def read_vocab(path: str | Path) -> dict[str, int]:
    """Return the token → id map of a BERT vocab.txt (one token per line, id = line number)."""
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            token = line.rstrip("\n").rstrip("\r")
            vocab.setdefault(token, index)  # BertTokenizer keeps a duplicate's first id
    return vocab


def token_name(value: Any) -> str | None:
    """Return a special token's text from tokenizer_config.json (a string or an AddedToken
    dict with ``content``), None when absent."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def spec_from_info(tokenizer: Any, entry: Mapping[str, Any] | None) -> TokenizerSpec:
    """Return the spec of a loaded tokenizer from model.json's ``tokenizer`` entry (absent in
    older versions: BERT's specials)."""
    entry = entry or {}
    specials = dict(BERT_SPECIALS)
    specials.update({k: str(v) for k, v in (entry.get("special_tokens") or {}).items()})
    pad = entry.get("pad_id")
    if pad is None:
        pad = tokenizer.token_to_id(specials["pad_token"])
    unk = tokenizer.token_to_id(specials["unk_token"]) if specials.get("unk_token") else None
    side = str(entry.get("truncation_side", "right"))
    if side not in SIDES:
        raise ValueError(f"tokenizer truncation_side must be right or left, got {side!r}")
    return TokenizerSpec(pad_id=int(pad or 0), unk_id=unk, truncation_side=side)


def load_tokenizer(version_path: str | Path, info: Mapping[str, Any]) -> tuple[Any, TokenizerSpec]:
    """Return a version's tokenizer and spec: its ``assets/tokenizer.json``, else (versions
    exported before it existed) the WordPiece tokenizer of its ``assets/vocab.txt`` with
    model.json's ``do_lower_case``. Truncation and padding saved in the file are turned off:
    the gateway cuts to the version's max_seq_len and pads per bucket itself.

    Raises OSError / ValueError / Exception of ``tokenizers`` for a missing or corrupt file.
    """
    from tokenizers import Tokenizer

    version_path = Path(version_path)
    entry = info.get("tokenizer")
    if isinstance(entry, Mapping) and entry.get("file"):
        name = Path(str(entry["file"])).name  # a bare file name under assets/, never a path
        tokenizer = Tokenizer.from_file(str(version_path / "assets" / name))
    else:
        tokenizer = wordpiece_tokenizer(
            read_vocab(version_path / VOCAB_TXT), lowercase=bool(info.get("do_lower_case", True))
        )
        entry = None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer, spec_from_info(tokenizer, entry)


@dataclass(frozen=True)
class Part:
    """Special tokens the post-processor puts at one place: ids, tokens and type ids."""

    ids: tuple[int, ...] = ()
    tokens: tuple[str, ...] = ()
    type_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Layout:
    """Where the post-processor puts its special tokens around one text (``prefix`` $A
    ``suffix``) and a pair (``prefix`` $A ``middle`` $B ``pair_suffix``), and the type ids of the
    texts' own tokens: asked of the tokenizer by post-processing probe encodings."""

    prefix: Part
    suffix: Part
    pair_prefix: Part
    middle: Part
    pair_suffix: Part
    type_a: int = 0
    pair_type_a: int = 0
    pair_type_b: int = 1

    @property
    def single_specials(self) -> int:
        """Tokens the template adds to one text."""
        return len(self.prefix.ids) + len(self.suffix.ids)

    @property
    def pair_specials(self) -> int:
        """Tokens the template adds to a pair."""
        return len(self.pair_prefix.ids) + len(self.middle.ids) + len(self.pair_suffix.ids)

    def template(self, pair: bool = False) -> str:
        """Return the template as a TemplateProcessing string ("[CLS] $A [SEP] $B:1 [SEP]:1")."""

        def show(part: Part) -> list[str]:
            return [t if k == 0 else f"{t}:{k}" for t, k in zip(part.tokens, part.type_ids,
                                                                 strict=True)]  # fmt: skip

        def body(name: str, kind: int) -> str:
            return name if kind == 0 else f"{name}:{kind}"

        if not pair:
            return " ".join([*show(self.prefix), body("$A", self.type_a), *show(self.suffix)])
        return " ".join([*show(self.pair_prefix), body("$A", self.pair_type_a),
                         *show(self.middle), body("$B", self.pair_type_b),
                         *show(self.pair_suffix)])  # fmt: skip


def _probe(tokenizer: Any) -> str:
    for text in ("a", "hello", "x", "1", "."):
        encoding = tokenizer.encode(text, add_special_tokens=False)
        if encoding.ids and not any(encoding.special_tokens_mask):
            return text
    raise ValueError("the tokenizer gives no tokens for plain text: cannot find its template")


def _part(encoding: Any, positions: Sequence[int]) -> Part:
    return Part(
        ids=tuple(int(encoding.ids[i]) for i in positions),
        tokens=tuple(str(encoding.tokens[i]) for i in positions),
        type_ids=tuple(int(encoding.type_ids[i]) for i in positions),
    )


def special_layout(tokenizer: Any) -> Layout:
    """Return where ``tokenizer``'s post-processor adds special tokens (see ``Layout``)."""
    if tokenizer.padding is not None or tokenizer.truncation is not None:
        tokenizer = type(tokenizer).from_str(tokenizer.to_str())  # a copy without them
        tokenizer.no_padding()
        tokenizer.no_truncation()
    probe = _probe(tokenizer)
    single = tokenizer.encode(probe, add_special_tokens=True)
    seq = list(single.sequence_ids)
    body = [i for i, s in enumerate(seq) if s == 0]
    if not body:
        raise ValueError("the tokenizer's post-processor drops the text")
    prefix = [i for i in range(len(seq)) if i < body[0] and seq[i] is None]
    suffix = [i for i in range(len(seq)) if i > body[-1] and seq[i] is None]
    pair = tokenizer.encode(probe, probe, add_special_tokens=True)
    seq = list(pair.sequence_ids)
    first = [i for i, s in enumerate(seq) if s == 0]
    second = [i for i, s in enumerate(seq) if s == 1]
    if not first or not second:
        raise ValueError("the tokenizer's post-processor drops a text of a pair")
    return Layout(
        prefix=_part(single, prefix),
        suffix=_part(single, suffix),
        pair_prefix=_part(pair, [i for i in range(first[0]) if seq[i] is None]),
        middle=_part(pair, [i for i in range(first[-1] + 1, second[0]) if seq[i] is None]),
        pair_suffix=_part(pair, [i for i in range(second[-1] + 1, len(seq)) if seq[i] is None]),
        type_a=int(single.type_ids[body[0]]),
        pair_type_a=int(pair.type_ids[first[0]]),
        pair_type_b=int(pair.type_ids[second[0]]),
    )


def model_kind(tokenizer: Any) -> str:
    """Return the tokenizer's model type: WordPiece, BPE, Unigram or WordLevel."""
    return type(tokenizer.model).__name__
