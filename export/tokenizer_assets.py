"""The checkpoint's own tokenizer, read at export and written into the version's assets.

A checkpoint with ``tokenizer.json`` (what transformers' ``save_pretrained`` writes, whatever the
kind: WordPiece, byte-level BPE, SentencePiece Unigram/BPE) has that file copied byte for byte;
a ``vocab.txt``-only one (Google's, older HF BERT dirs) gets the WordPiece ``tokenizer.json``
transformers' ``BertTokenizerFast`` would make of it (``modelformat.tokenizer.
wordpiece_tokenizer``, with ``tokenizer_config.json``'s do_lower_case, strip_accents and
tokenize_chinese_chars). Either way the gateway has one path: ``Tokenizer.from_file``.
model.json's ``tokenizer`` entry names the file and records what transformers reads from
``tokenizer_config.json`` beside it (the special tokens, the pad id, the truncation side) and
the templates the file's post-processor applies (for people; the gateway asks the tokenizer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from export.errors import ExportError
from modelformat.tokenizer import (
    SIDES,
    SPECIAL_KEYS,
    TOKENIZER_JSON,
    VOCAB_TXT,
    model_kind,
    special_layout,
    token_name,
    wordpiece_tokenizer,
)


@dataclass
class TokenizerAssets:
    """A checkpoint's tokenizer as export writes it."""

    json_text: str  # the tokenizer.json to write (the checkpoint's own bytes, or built)
    source: str  # "tokenizer.json" or "vocab.txt"
    vocab: list[str]  # tokens by id (holes ""), for the probe and warmup batches
    do_lower_case: bool
    entry: dict[str, Any] = field(default_factory=dict)  # model.json's "tokenizer"
    vocab_txt: list[str] | None = None  # a WordPiece vocabulary (kept for older gateways)
    # tokenizer_config.json's model_max_length, when it states one (not transformers' 1e30
    # "no limit" placeholder)
    model_max_length: int | None = None

    def special_ids(self) -> tuple[int, int]:
        """Return the ids of the first and last special token of one text ([CLS], [SEP])."""
        return int(self.entry.get("cls_id", 0)), int(self.entry.get("sep_id", 0))

    def write(self, version_dir: Path) -> None:
        """Write assets/tokenizer.json (and vocab.txt for a WordPiece tokenizer)."""
        (version_dir / "assets").mkdir(parents=True, exist_ok=True)
        (version_dir / TOKENIZER_JSON).write_text(self.json_text, encoding="utf-8")
        if self.vocab_txt is not None:
            (version_dir / VOCAB_TXT).write_text("\n".join(self.vocab_txt) + "\n", "utf-8")


def _read_config(path: Path) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the config wins
        file = path / name
        if not file.is_file():
            continue
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExportError(f"cannot read {file}: {exc}") from exc
        if not isinstance(data, dict):
            raise ExportError(f"{file}: expected a JSON object")
        merged.update(data)
    return merged


def read_vocab_txt(path: Path, rows: int) -> list[str]:
    """Return a vocab.txt's tokens; ExportError when it is missing or its size is not ``rows``."""
    try:
        vocab = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise ExportError(
            f"missing tokenizer: {path.parent} has neither tokenizer.json nor vocab.txt"
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read vocabulary {path}: {exc}") from exc
    while vocab and not vocab[-1]:
        vocab.pop()
    if len(vocab) != rows:
        raise ExportError(
            f"{path}: vocabulary has {len(vocab)} tokens but the word embedding has {rows} rows"
        )
    return vocab


# the files of transformers' slow (Python) tokenizers that hold the whole vocabulary, none of them
# a tokenizer.json: byte-level BPE (RoBERTa, GPT-2), SentencePiece (XLM-R, CamemBERT, ALBERT,
# DeBERTa-v3, T5-style)
SLOW_TOKENIZER_FILES = (
    "vocab.json", "merges.txt", "sentencepiece.bpe.model", "spiece.model", "spm.model",
    "tokenizer.model",
)  # fmt: skip


# The command that converts a slow tokenizer lives in the guide: export never runs transformers.
SLOW_TOKENIZER_GUIDE = 'docs/guides/serve-your-own-model.md, "A checkpoint without tokenizer.json"'


def _refuse_a_slow_tokenizer(path: Path) -> None:
    """Raise ExportError saying how to make tokenizer.json when ``path`` has a slow tokenizer's
    files and neither tokenizer.json nor vocab.txt (else the error would only say "missing")."""
    found = [name for name in SLOW_TOKENIZER_FILES if (path / name).is_file()]
    if not found or (path / "vocab.txt").is_file():
        return
    raise ExportError(
        f"{path}: a slow tokenizer ({', '.join(found)}) and no tokenizer.json, the only tokenizer "
        "file export and the gateway read besides a WordPiece vocab.txt. Make tokenizer.json "
        "where transformers is installed: load this directory's tokenizer with AutoTokenizer "
        "(local files only) and save it back into the same directory, which converts it "
        "(SentencePiece files also need the sentencepiece package); the command is in "
        f"{SLOW_TOKENIZER_GUIDE}. Then export again."
    )


def read_tokenizer(path: Path, rows: int, lower: bool | None = None) -> TokenizerAssets:
    """Return the tokenizer of the checkpoint directory ``path`` whose word embedding has
    ``rows`` rows: its tokenizer.json, else one built from its vocab.txt. ``lower`` (the
    --cased flag) applies to a vocab.txt only: a tokenizer.json's normalizer decides itself.

    Raises ExportError naming the file for a missing, unreadable or mismatched tokenizer.
    """
    from tokenizers import Tokenizer

    config = _read_config(path)
    file = path / "tokenizer.json"
    vocab_txt: list[str] | None = None
    if file.is_file():
        try:
            text = file.read_text(encoding="utf-8")
            tokenizer = Tokenizer.from_str(text)
        except Exception as exc:  # tokenizers raises its own exception types
            raise ExportError(f"cannot read {file}: {exc}") from exc
        source = "tokenizer.json"
        do_lower = bool(config.get("do_lower_case", True))
        if model_kind(tokenizer) == "WordPiece":
            vocab_txt = _by_id(tokenizer, with_added=False)
    else:
        _refuse_a_slow_tokenizer(path)
        vocab_txt = read_vocab_txt(path / "vocab.txt", rows)
        do_lower = bool(config.get("do_lower_case", True)) if lower is None else lower
        try:
            tokenizer = wordpiece_tokenizer(
                vocab_txt, lowercase=do_lower, strip_accents=config.get("strip_accents"),
                chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
            )  # fmt: skip
        except ValueError as exc:
            raise ExportError(f"{path / 'vocab.txt'}: {exc}") from exc
        text = tokenizer.to_str(pretty=True)
        source = "vocab.txt"
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab = _by_id(tokenizer, with_added=True)
    if len(vocab) > rows:
        raise ExportError(
            f"{path}: the tokenizer ({source}) has ids up to {len(vocab) - 1} but the word "
            f"embedding has {rows} rows"
        )
    entry = _entry(tokenizer, config, source, size, path)
    return TokenizerAssets(json_text=text, source=source, vocab=vocab, do_lower_case=do_lower,
                           entry=entry, vocab_txt=vocab_txt,
                           model_max_length=_max_length(config))  # fmt: skip


def _max_length(config: dict[str, Any]) -> int | None:
    """Return tokenizer_config.json's model_max_length, None when it states none (absent, not a
    positive integer, or transformers' placeholder for "no limit", 1e30)."""
    value = config.get("model_max_length")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 1 <= value < 10**9 or value != int(value):
        return None
    return int(value)


def _by_id(tokenizer: Any, *, with_added: bool) -> list[str]:
    """Return the tokenizer's tokens in id order ("" where an id has no token)."""
    index = tokenizer.get_vocab(with_added_tokens=with_added)
    tokens = [""] * (max(index.values(), default=-1) + 1)
    for token, i in index.items():
        tokens[i] = token
    return tokens


def _entry(tokenizer: Any, config: dict[str, Any], source: str, size: int,
           where: Path) -> dict[str, Any]:  # fmt: skip
    """Return model.json's ``tokenizer`` entry."""
    specials = {k: name for k in SPECIAL_KEYS if (name := token_name(config.get(k))) is not None}
    if source == "vocab.txt":
        specials = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                    "sep_token": "[SEP]", "mask_token": "[MASK]", **specials}  # fmt: skip
    pad_id = tokenizer.token_to_id(specials["pad_token"]) if "pad_token" in specials else None
    if pad_id is None and tokenizer.padding is not None:
        pad_id = tokenizer.padding.get("pad_id")
    side = str(config.get("truncation_side", "right"))
    if side not in SIDES:
        raise ExportError(f"{where}: tokenizer_config.json truncation_side must be right or "
                          f"left, got {side!r}")  # fmt: skip
    try:
        layout = special_layout(tokenizer)
    except ValueError as exc:
        raise ExportError(f"{where}: {exc}") from exc
    ids = [*layout.prefix.ids, *layout.suffix.ids]
    return {
        "file": TOKENIZER_JSON.name,
        "source": source,
        "model": model_kind(tokenizer),
        "vocab_size": size,
        "special_tokens": specials,
        "pad_id": int(pad_id or 0),
        "truncation_side": side,
        "template": layout.template(),
        "pair_template": layout.template(pair=True),
        "cls_id": ids[0] if ids else 0,
        "sep_id": ids[-1] if ids else 0,
    }
