"""BERT WordPiece tokenization with HF ``tokenizers``, matching transformers' ``BertTokenizer``.

Built from a version's ``assets/vocab.txt`` and its ``model.json`` flags; pure apart from reading
the vocabulary file once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

CLS, SEP, UNK, PAD, MASK = "[CLS]", "[SEP]", "[UNK]", "[PAD]", "[MASK]"
SEQUENTIAL_BELOW = 8  # texts; larger requests use the parallel encode_batch


@dataclass(frozen=True)
class Encoded:
    """Token ids of one text, [CLS] ... [SEP], already cut to max_seq_len."""

    ids: np.ndarray  # int32, 1-D
    truncated: bool
    full_length: int  # tokens the text needed, specials included


def read_vocab(path: str | Path) -> dict[str, int]:
    """Return the token → id map of a BERT vocab.txt (one token per line, id = line number)."""
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            token = line.rstrip("\n").rstrip("\r")
            # BertTokenizer keeps the first id of a duplicated token; so do we.
            vocab.setdefault(token, index)
    return vocab


class BertTokenizer:
    """WordPiece tokenizer configured like transformers' BertTokenizer (basic + wordpiece)."""

    def __init__(
        self, vocab: dict[str, int], *, do_lower_case: bool = True, max_seq_len: int = 128
    ) -> None:
        for special in (CLS, SEP, UNK):
            if special not in vocab:
                raise ValueError(f"vocabulary has no {special} token")
        if max_seq_len < 2:
            raise ValueError("max_seq_len must leave room for [CLS] and [SEP]")
        self.max_seq_len = max_seq_len
        self.do_lower_case = do_lower_case
        self.cls_id = vocab[CLS]
        self.sep_id = vocab[SEP]
        self.pad_id = vocab.get(PAD, 0)
        self.vocab_size = len(vocab)
        tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=100))
        # strip_accents=None follows lowercase, exactly like BertTokenizer's BasicTokenizer.
        tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=True,
            strip_accents=None,
            lowercase=do_lower_case,
        )
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            special_tokens=[(CLS, self.cls_id), (SEP, self.sep_id)],
        )
        tokenizer.decoder = decoders.WordPiece()
        # BertTokenizer matches its special tokens in the raw text ("[SEP]" typed by a user is
        # id 102, not "[", "sep", "]"); registering them reproduces that.
        specials = [t for t in (PAD, UNK, CLS, SEP, MASK) if t in vocab]
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in specials]
        )
        self._tokenizer = tokenizer

    @classmethod
    def from_files(
        cls, vocab_path: str | Path, *, do_lower_case: bool = True, max_seq_len: int = 128
    ) -> BertTokenizer:
        """Return a tokenizer for the vocab.txt at ``vocab_path``."""
        return cls(read_vocab(vocab_path), do_lower_case=do_lower_case, max_seq_len=max_seq_len)

    def encode(self, texts: Sequence[str], direction: str = "right") -> list[Encoded]:
        """Return each text's ids, cut to max_seq_len and flagged if cut: ``right`` keeps the
        head ([CLS] head ... [SEP]), ``left`` the tail ([CLS] ... tail [SEP])."""
        # Encoding without truncation and cutting here is what BertTokenizer(truncation=True)
        # does for one sequence, and tells us exactly which texts were cut.
        if len(texts) <= SEQUENTIAL_BELOW:
            # Waking tokenizers' thread pool costs more than a few short texts take alone
            # (measured ~0.15 ms per request in a busy gunicorn worker for one text).
            encodings = [self._tokenizer.encode(t, add_special_tokens=True) for t in texts]
        else:
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        out = []
        for encoding in encodings:
            ids = np.asarray(encoding.ids, dtype=np.int32)
            full = int(ids.shape[0])
            if full > self.max_seq_len:
                if direction == "left":
                    tail = ids[full - (self.max_seq_len - 1) :]
                    ids = np.concatenate([[self.cls_id], tail]).astype(np.int32)
                else:
                    ids = np.concatenate([ids[: self.max_seq_len - 1], [self.sep_id]])
                    ids = ids.astype(np.int32)
            out.append(Encoded(ids=ids, truncated=full > self.max_seq_len, full_length=full))
        return out

    def windows(self, texts: Sequence[str], overlap: float = 0.25) -> list[list[Encoded]]:
        """Return each text as windows of at most max_seq_len tokens ([CLS] ... [SEP] each) that
        overlap by ``overlap`` of a window, on token boundaries; a text that fits is one window.
        The last window ends at the text's last token."""
        size = self.max_seq_len - 2
        step = max(1, size - int(size * overlap))
        out = []
        for encoded in self.encode(texts):
            if not encoded.truncated:
                out.append([encoded])
                continue
            body = self._tokenizer.encode(texts[len(out)], add_special_tokens=False).ids
            starts = list(range(0, max(1, len(body) - size), step))
            if starts[-1] + size < len(body):
                starts.append(len(body) - size)
            out.append([
                Encoded(
                    ids=np.asarray([self.cls_id, *body[s : s + size], self.sep_id], np.int32),
                    truncated=False, full_length=encoded.full_length,
                )
                for s in starts
            ])  # fmt: skip
        return out

    def encode_ids(self, token_ids: Sequence[Sequence[int]]) -> list[Encoded]:
        """Return inputs given as token ids (no [CLS]/[SEP]) wrapped and cut as ``encode`` does.

        Raises ValueError naming the first id outside the vocabulary.
        """
        out = []
        for index, ids in enumerate(token_ids):
            for value in ids:
                if not 0 <= value < self.vocab_size:
                    raise ValueError(
                        f"input[{index}] has token id {value}, outside this model's vocabulary "
                        f"of {self.vocab_size} ids"
                    )
            full = len(ids) + 2
            body = list(ids[: self.max_seq_len - 2])
            wrapped = np.asarray([self.cls_id, *body, self.sep_id], dtype=np.int32)
            out.append(Encoded(ids=wrapped, truncated=full > self.max_seq_len, full_length=full))
        return out

    def describe(self, texts: Sequence[str]) -> list[dict[str, object]]:
        """Return, per text, the tokens the model would get: ids, word pieces, (start, end)
        character offsets into the text as given, which are special tokens, and whether the
        text is cut (only the kept tokens are listed, [SEP] last, as ``encode`` sends them)."""
        out: list[dict[str, object]] = []
        for text in texts:
            encoding = self._tokenizer.encode(text, add_special_tokens=True)
            ids, tokens = list(encoding.ids), list(encoding.tokens)
            offsets = [list(pair) for pair in encoding.offsets]
            special = [bool(flag) for flag in encoding.special_tokens_mask]
            truncated = len(ids) > self.max_seq_len
            if truncated:
                keep = self.max_seq_len - 1
                ids, tokens = [*ids[:keep], ids[-1]], [*tokens[:keep], tokens[-1]]
                offsets, special = [*offsets[:keep], offsets[-1]], [*special[:keep], special[-1]]
            out.append({
                "ids": ids, "tokens": tokens, "offsets": offsets, "special": special,
                "truncated": truncated, "length": len(ids),
            })  # fmt: skip
        return out

    def decode(self, token_ids: Sequence[Sequence[int]]) -> list[dict[str, object]]:
        """Return each id list's text (special tokens dropped) and its word pieces."""
        out: list[dict[str, object]] = []
        for index, ids in enumerate(token_ids):
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            if bad:
                raise ValueError(
                    f"ids[{index}] has token id {bad[0]}, outside this model's vocabulary of "
                    f"{self.vocab_size} ids"
                )
            out.append({
                "text": self._tokenizer.decode(list(ids), skip_special_tokens=True),
                "tokens": [self._tokenizer.id_to_token(i) for i in ids],
            })  # fmt: skip
        return out

    def tokens(self, text: str) -> list[str]:
        """Return the word pieces of one text (for debugging and tests)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).tokens)
