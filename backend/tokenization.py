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
    # sentence pairs: 0 on [CLS] a [SEP], 1 on b [SEP]; None for one text (all zeros)
    type_ids: np.ndarray | None = None


@dataclass(frozen=True)
class TokenWindow:
    """One window of a text for token classification: what the model gets and where each
    position came from (HF tokenizers' offsets into the text as given; (0, 0) on specials)."""

    encoded: Encoded
    offsets: list[tuple[int, int]]
    tokens: list[str]  # the vocabulary's token per position ("##ing", "[UNK]", "[CLS]")
    special: list[bool]


class FirstSegmentTooLong(ValueError):
    """A pair whose first segment alone fills max_seq_len: no room for any of the second."""

    def __init__(self, index: int, tokens: int, max_seq_len: int) -> None:
        super().__init__(
            f"pairs[{index}][0] alone needs {tokens} tokens with [CLS] and [SEP], filling "
            f"max_seq_len {max_seq_len}: nothing of the second segment would fit; shorten it"
        )
        self.index = index


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """Return how many tokens of each segment a pair keeps within ``budget`` tokens: the
    longer one is shortened first, then both in turn (HF tokenizers' ``longest_first``, the
    rule transformers' tokenizers apply to pairs; ties give the odd token to the second)."""
    if n1 + n2 <= budget:
        return n1, n2
    swap = n1 > n2
    short, long = (n2, n1) if swap else (n1, n2)
    long = max(short, budget - short)
    if short + long > budget:
        short = budget // 2
        long = short + budget % 2
    return (long, short) if swap else (short, long)


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
        self.unk_id = vocab[UNK]
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

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str] | Sequence[str]], direction: str = "right"
    ) -> list[Encoded]:
        """Return each pair as [CLS] a [SEP] b [SEP] with ``type_ids`` 1 on ``b [SEP]``, cut
        ``longest_first`` to max_seq_len (``direction`` ``left`` cuts each segment's start).

        Raises FirstSegmentTooLong for a pair whose first segment alone fills max_seq_len.
        """
        firsts = self._bodies([pair[0] for pair in pairs])
        seconds = self._bodies([pair[1] for pair in pairs])
        budget = self.max_seq_len - 3
        out = []
        for index, (a, b) in enumerate(zip(firsts, seconds, strict=True)):
            if len(a) + 2 >= self.max_seq_len:
                raise FirstSegmentTooLong(index, len(a) + 2, self.max_seq_len)
            keep_a, keep_b = longest_first(len(a), len(b), budget)
            if direction == "left":
                a, b = a[len(a) - keep_a :], b[len(b) - keep_b :]
            else:
                a, b = a[:keep_a], b[:keep_b]
            ids = np.asarray([self.cls_id, *a, self.sep_id, *b, self.sep_id], dtype=np.int32)
            type_ids = np.zeros(ids.shape[0], dtype=np.int32)
            type_ids[len(a) + 2 :] = 1
            full = len(firsts[index]) + len(seconds[index]) + 3
            out.append(Encoded(ids, full > self.max_seq_len, full, type_ids))
        return out

    def _bodies(self, texts: Sequence[str]) -> list[list[int]]:
        """Return each text's ids without [CLS]/[SEP]."""
        if len(texts) <= SEQUENTIAL_BELOW:
            encodings = [self._tokenizer.encode(t, add_special_tokens=False) for t in texts]
        else:
            encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(e.ids) for e in encodings]

    def tag_windows(self, text: str, stride: int, truncate: bool = False) -> list[TokenWindow]:
        """Return ``text`` as the windows token classification reads: one if it fits (or, with
        ``truncate``, its first max_seq_len tokens, flagged); else windows of max_seq_len - 2
        tokens, each starting ``stride`` tokens before the previous one ends, the last ending
        at the text's end (the windows transformers' pipeline makes with ``stride``)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        ids, tokens = list(encoding.ids), list(encoding.tokens)
        offsets = [(int(s), int(e)) for s, e in encoding.offsets]
        special = [bool(flag) for flag in encoding.special_tokens_mask]
        size = self.max_seq_len - 2
        full = len(ids) + 2
        if len(ids) <= size or truncate:
            spans = [(0, min(len(ids), size))]
        else:
            step = max(1, size - stride)
            spans = []
            for start in range(0, len(ids), step):
                spans.append((start, min(start + size, len(ids))))
                if spans[-1][1] == len(ids):
                    break
        windows = []
        for start, stop in spans:
            body = [self.cls_id, *ids[start:stop], self.sep_id]
            encoded = Encoded(np.asarray(body, dtype=np.int32), full > self.max_seq_len and
                              truncate, full)  # fmt: skip
            windows.append(TokenWindow(
                encoded=encoded,
                offsets=[(0, 0), *offsets[start:stop], (0, 0)],
                tokens=[CLS, *tokens[start:stop], SEP],
                special=[True, *special[start:stop], True],
            ))  # fmt: skip
        return windows

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
