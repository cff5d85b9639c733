"""Tokenization with HF ``tokenizers``: the version's own ``tokenizer.json`` (WordPiece,
byte-level BPE, SentencePiece Unigram/BPE), or the WordPiece tokenizer of an older version's
``vocab.txt``, matching transformers' fast tokenizers on the same files.

The tokenizer gives the tokens of each text; where its post-processor puts the special tokens
(``[CLS] $A [SEP]``, ``<s> $A </s></s> $B </s>``) is asked of it once (``modelformat.tokenizer.
special_layout``) and applied around the cut or windowed tokens here, so truncation (right or
left, longest-first for pairs) and windows work the same for every kind. Pure apart from reading
the files once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backend import budget
from modelformat.tokenizer import Layout, Part, read_vocab, special_layout, wordpiece_tokenizer

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
    # 1 where the model attends; None: every position (a ColBERT query's expansions have 0)
    attention: np.ndarray | None = None


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


def _cut(ids: list[int], keep: int, direction: str) -> list[int]:
    """Return ``keep`` tokens of ``ids``: its start (``right`` cuts the end) or its end."""
    if len(ids) <= keep:
        return ids
    return ids[len(ids) - keep :] if direction == "left" else ids[:keep]


# characters of texts tokenized at once where the budget may stop a request part way (windows)
GROUP_CHARS = 32_768


def _groups(texts: Sequence[str], chars: int) -> list[Sequence[str]]:
    """Return ``texts`` in consecutive groups of about ``chars`` characters (one text at least)."""
    groups: list[Sequence[str]] = []
    start, total = 0, 0
    for index, text in enumerate(texts):
        total += len(text)
        if total >= chars:
            groups.append(texts[start : index + 1])
            start, total = index + 1, 0
    if start < len(texts):
        groups.append(texts[start:])
    return groups


def _window_starts(length: int, size: int, step: int) -> list[int]:
    """Return where each window of a text of ``length`` tokens starts (windows of ``size``
    tokens, ``step`` apart, the last ending at the text's end); [0]: it fits in one."""
    if length <= size:
        return [0]
    starts = list(range(0, max(1, length - size), step))
    if starts[-1] + size < length:
        starts.append(length - size)
    return starts


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` (the version's own) cut and wrapped for a model of
    ``max_seq_len`` tokens, as transformers' fast tokenizers cut and wrap with truncation."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_seq_len: int = 128,
        pad_id: int = 0,
        unk_id: int | None = None,
        truncation_side: str = "right",
    ) -> None:
        tokenizer.no_truncation()  # a saved file's own truncation and padding: we cut and pad
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.layout: Layout = special_layout(tokenizer)
        if max_seq_len < self.layout.single_specials + 1:
            raise ValueError(
                f"max_seq_len {max_seq_len} leaves no room for a token beside the template's "
                f"{self.layout.single_specials} special tokens"
            )
        self.max_seq_len = max_seq_len
        self.pad_id = pad_id
        self.unk_id = -1 if unk_id is None else unk_id
        self.truncation_side = truncation_side
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        prefix, suffix = self.layout.prefix.ids, self.layout.suffix.ids
        self.cls_id = prefix[0] if prefix else pad_id  # the first / last special of one text
        self.sep_id = suffix[-1] if suffix else pad_id
        # transformers' token-classification pipeline fuses word pieces by their prefix (##)
        # where the model has one, else by the spaces around a token (its fallback)
        self.word_aware = bool(getattr(tokenizer.model, "continuing_subword_prefix", None))
        self._prefix, self._suffix = list(prefix), list(suffix)
        layout = self.layout
        self._typed = bool(layout.type_a or any(layout.prefix.type_ids)
                           or any(layout.suffix.type_ids))  # fmt: skip

    # -- helpers -------------------------------------------------------------------------

    def _bodies_of(self, texts: Sequence[str]) -> list[Any]:
        """Return each text's encoding without special tokens."""
        if len(texts) <= SEQUENTIAL_BELOW:
            # Waking tokenizers' thread pool costs more than a few short texts take alone
            # (measured ~0.15 ms per request in a busy gunicorn worker for one text).
            return [self._tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._tokenizer.encode_batch(list(texts), add_special_tokens=False)

    def _bodies(self, texts: Sequence[str]) -> list[list[int]]:
        """Return each text's ids without special tokens."""
        return [e.ids for e in self._bodies_of(texts)]  # a fresh list per encoding

    def _wrap(self, body: list[int]) -> np.ndarray:
        """Return one text's ids with the template's special tokens around ``body``."""
        return np.asarray(self._prefix + body + self._suffix, dtype=np.int32)

    def _single_types(self, length: int) -> np.ndarray | None:
        """Return the type ids of one wrapped text (None: all zeros, the common case)."""
        if not self._typed:
            return None
        layout = self.layout
        kinds = [*layout.prefix.type_ids, *[layout.type_a] * (length - layout.single_specials),
                 *layout.suffix.type_ids]  # fmt: skip
        return np.asarray(kinds, dtype=np.int32)

    def _encoded(self, body: list[int], full: int, truncated: bool) -> Encoded:
        ids = self._wrap(body)
        return Encoded(ids, truncated, full, self._single_types(ids.shape[0]))

    def _side(self, direction: str | None) -> str:
        return self.truncation_side if direction is None else direction

    # -- what the gateway asks -------------------------------------------------------------

    def encode(
        self, texts: Sequence[str], direction: str | None = None, max_len: int | None = None
    ) -> list[Encoded]:
        """Return each text's ids, cut to max_seq_len (or ``max_len`` tokens, specials
        included, when less) and flagged if cut: ``right`` keeps the head (<specials> head ...
        <specials>), ``left`` the tail; None: the tokenizer's side."""
        side = self._side(direction)
        most = self.max_seq_len if max_len is None else min(max_len, self.max_seq_len)
        keep = most - self.layout.single_specials
        budget.expect(len(texts))
        bodies = self._bodies(texts)
        specials = self.layout.single_specials
        budget.spend(len(bodies), sum(min(len(b), keep) + specials for b in bodies))
        out = []
        for body in bodies:
            full = len(body) + self.layout.single_specials
            out.append(self._encoded(_cut(body, keep, side), full, full > most))
        return out

    def vocab_tokens(self, ids: Sequence[int]) -> list[str]:
        """Return the vocabulary's token string of each id (``id_to_token``; never a decode,
        whose strings can collide)."""
        return self._vocab_tokens(ids)

    def windows(
        self, texts: Sequence[str], overlap: float = 0.25, max_len: int | None = None
    ) -> list[list[Encoded]]:
        """Return each text as windows of at most max_seq_len tokens (or ``max_len``, when
        less; specials around each) that overlap by ``overlap`` of a window, on token
        boundaries; a text that fits is one window. The last window ends at the text's last
        token."""
        most = self.max_seq_len if max_len is None else min(max_len, self.max_seq_len)
        size = most - self.layout.single_specials
        step = max(1, size - int(size * overlap))
        specials = self.layout.single_specials
        bodies: list[list[int]] = []
        plans: list[list[int]] = []
        budget.expect(len(texts))
        # a group of texts at a time, each group's rows and tokens spent before the next is
        # tokenized and before any window is built: a request far over the budget stops early
        for group in _groups(texts, GROUP_CHARS):
            fresh = self._bodies(group)
            planned = [_window_starts(len(body), size, step) for body in fresh]
            budget.spend(sum(map(len, planned)), sum(
                min(size, len(body) - start) + specials
                for body, text_starts in zip(fresh, planned, strict=True) for start in text_starts
            ))  # fmt: skip
            bodies.extend(fresh)
            plans.extend(planned)
        out = []
        for body, starts in zip(bodies, plans, strict=True):
            budget.check_deadline()
            full = len(body) + self.layout.single_specials
            if full <= most:
                out.append([self._encoded(body, full, False)])
                continue
            out.append([self._encoded(body[s : s + size], full, False) for s in starts])
        return out

    def encode_pairs(
        self,
        pairs: Sequence[tuple[str, str] | Sequence[str]],
        direction: str | None = None,
        *,
        refuse_long_first: bool = True,
    ) -> list[Encoded]:
        """Return each pair with the template's specials (``[CLS] a [SEP] b [SEP]``, ``<s> a
        </s></s> b </s>``) and its type ids, cut ``longest_first`` to max_seq_len (``left``
        cuts each segment's start).

        Raises FirstSegmentTooLong for a pair whose first segment alone fills max_seq_len,
        unless ``refuse_long_first`` is False (training: such a pair is cut longest-first too).
        """
        side = self._side(direction)
        layout = self.layout
        budget.expect(len(pairs))
        firsts = self._first_segments(pairs)
        lead = len(layout.pair_prefix.ids) + len(layout.middle.ids)
        if refuse_long_first:  # before a second segment is tokenized
            for index, a in enumerate(firsts):
                if len(a) + lead >= self.max_seq_len:
                    raise FirstSegmentTooLong(index, len(a) + lead, self.max_seq_len)
        seconds = self._bodies([pair[1] for pair in pairs])
        room = self.max_seq_len - layout.pair_specials
        kept = [longest_first(len(a), len(b), room) for a, b in zip(firsts, seconds, strict=True)]
        budget.spend(len(pairs), sum(a + b + layout.pair_specials for a, b in kept))
        out = []
        for index, (a, b) in enumerate(zip(firsts, seconds, strict=True)):
            keep_a, keep_b = kept[index]
            a, b = _cut(a, keep_a, side), _cut(b, keep_b, side)
            parts: list[tuple[Sequence[int], Sequence[int]]] = [
                (layout.pair_prefix.ids, layout.pair_prefix.type_ids),
                (a, [layout.pair_type_a] * len(a)),
                (layout.middle.ids, layout.middle.type_ids),
                (b, [layout.pair_type_b] * len(b)),
                (layout.pair_suffix.ids, layout.pair_suffix.type_ids),
            ]
            ids = np.asarray([i for part, _ in parts for i in part], dtype=np.int32)
            type_ids = np.asarray([k for _, kinds in parts for k in kinds], dtype=np.int32)
            full = len(firsts[index]) + len(seconds[index]) + layout.pair_specials
            out.append(Encoded(ids, full > self.max_seq_len, full, type_ids))
        return out

    def _first_segments(self, pairs: Sequence[tuple[str, str] | Sequence[str]]) -> list[list[int]]:
        """Return each pair's first segment's ids, each distinct text tokenized once (a rerank
        pairs one query with every document: one tokenization, not one per document)."""
        distinct = list(dict.fromkeys(pair[0] for pair in pairs))
        ids = dict(zip(distinct, self._bodies(distinct), strict=True))
        return [ids[pair[0]] for pair in pairs]

    def _vocab_tokens(self, ids: Sequence[int]) -> list[str]:
        """Return the vocabulary's token of each id (an unknown piece is the unk token, as
        transformers' ``convert_ids_to_tokens`` gives it, not the text it stands for)."""
        return [self._tokenizer.id_to_token(i) or "" for i in ids]

    def _specials_of(self, part: Part) -> tuple[list[tuple[int, int]], list[str], list[bool]]:
        n = len(part.ids)
        return [(0, 0)] * n, list(part.tokens), [True] * n

    def tag_windows(self, text: str, stride: int, truncate: bool = False) -> list[TokenWindow]:
        """Return ``text`` as the windows token classification reads: one if it fits (or, with
        ``truncate``, its first max_seq_len tokens, flagged); else windows of max_seq_len
        tokens (specials included), each starting ``stride`` tokens before the previous one
        ends, the last ending at the text's end (the windows transformers' pipeline makes with
        ``stride``)."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        size = self.max_seq_len - self.layout.single_specials
        count = len(encoding.ids)
        full = count + self.layout.single_specials
        if count <= size or truncate:
            spans = [(0, min(count, size))]
        else:
            step = max(1, size - stride)
            spans = []
            for start in range(0, count, step):
                spans.append((start, min(start + size, count)))
                if spans[-1][1] == count:
                    break
        specials = self.layout.single_specials
        # before the per-token lists are built: their cost is the text's, the rows' the budget's
        budget.spend(len(spans), sum(stop - start + specials for start, stop in spans))
        ids, tokens = list(encoding.ids), self._vocab_tokens(encoding.ids)
        offsets = [(int(s), int(e)) for s, e in encoding.offsets]
        special = [bool(flag) for flag in encoding.special_tokens_mask]
        head_off, head_tok, head_sp = self._specials_of(self.layout.prefix)
        tail_off, tail_tok, tail_sp = self._specials_of(self.layout.suffix)
        windows = []
        for start, stop in spans:
            encoded = self._encoded(ids[start:stop], full, full > self.max_seq_len and truncate)
            windows.append(TokenWindow(
                encoded=encoded,
                offsets=[*head_off, *offsets[start:stop], *tail_off],
                tokens=[*head_tok, *tokens[start:stop], *tail_tok],
                special=[*head_sp, *special[start:stop], *tail_sp],
            ))  # fmt: skip
        return windows

    def encode_ids(self, token_ids: Sequence[Sequence[int]]) -> list[Encoded]:
        """Return inputs given as token ids (no special tokens) wrapped and cut as ``encode``
        does (right).

        Raises ValueError naming the first id outside the vocabulary.
        """
        keep = self.max_seq_len - self.layout.single_specials
        specials = self.layout.single_specials
        budget.spend(len(token_ids), sum(min(len(ids), keep) + specials for ids in token_ids))
        out = []
        for index, ids in enumerate(token_ids):
            for value in ids:
                if not 0 <= value < self.vocab_size:
                    raise ValueError(
                        f"input[{index}] has token id {value}, outside this model's vocabulary "
                        f"of {self.vocab_size} ids"
                    )
            full = len(ids) + self.layout.single_specials
            out.append(self._encoded(list(ids[:keep]), full, full > self.max_seq_len))
        return out

    def describe(self, texts: Sequence[str]) -> list[dict[str, object]]:
        """Return, per text, the tokens the model would get: ids, tokens, (start, end)
        character offsets into the text as given ((0, 0) on specials), which are special
        tokens, and whether the text is cut (only the kept tokens are listed, as ``encode``
        sends them with the tokenizer's truncation side). The rows and the kept tokens are
        spent from the request's budget before any text's lists are built."""
        head_off, head_tok, head_sp = self._specials_of(self.layout.prefix)
        tail_off, tail_tok, tail_sp = self._specials_of(self.layout.suffix)
        budget.expect(len(texts))
        encodings = self._bodies_of(texts)
        specials = self.layout.single_specials
        budget.spend(len(encodings), sum(
            stop - start + specials for start, stop in (self._kept(len(e.ids)) for e in encodings)
        ))  # fmt: skip
        out: list[dict[str, object]] = []
        for encoding in encodings:
            budget.check_deadline()
            n = len(encoding.ids)
            start, stop = self._kept(n)
            ids = [*self.layout.prefix.ids, *encoding.ids[start:stop], *self.layout.suffix.ids]
            offsets = [list(pair) for pair in
                       [*head_off, *encoding.offsets[start:stop], *tail_off]]  # fmt: skip
            special = [*head_sp, *[bool(f) for f in encoding.special_tokens_mask[start:stop]],
                       *tail_sp]  # fmt: skip
            out.append({
                "ids": ids,
                "tokens": [*head_tok, *self._vocab_tokens(encoding.ids[start:stop]), *tail_tok],
                "offsets": offsets, "special": special,
                "truncated": stop - start < n, "length": len(ids),
            })  # fmt: skip
        return out

    def _kept(self, n: int) -> tuple[int, int]:
        """Return which of a text's ``n`` tokens (specials apart) one sequence keeps."""
        keep = self.max_seq_len - self.layout.single_specials
        start = n - keep if self.truncation_side == "left" and n > keep else 0
        return start, min(n, start + keep)

    def word_ids(self, texts: Sequence[str]) -> list[list[int | None]]:
        """Return, per text, the tokenizer's word of each position ``describe`` lists
        (HF ``Encoding.word_ids``: the pre-tokenizer's word a token was cut from, counted from 0
        in the text; None on the special tokens), cut as ``describe`` cuts."""
        head = [None] * len(self.layout.prefix.ids)
        tail = [None] * len(self.layout.suffix.ids)
        out: list[list[int | None]] = []
        for encoding in self._bodies_of(texts):
            start, stop = self._kept(len(encoding.ids))
            out.append([*head, *encoding.word_ids[start:stop], *tail])
        return out

    def decode(self, token_ids: Sequence[Sequence[int]]) -> list[dict[str, object]]:
        """Return each id list's text (special tokens dropped) and its tokens; the lists and
        their ids are spent from the request's budget before any is decoded."""
        budget.spend(len(token_ids), sum(map(len, token_ids)))
        out: list[dict[str, object]] = []
        for index, ids in enumerate(token_ids):
            budget.check_deadline()
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
        """Return the tokens of one text (for debugging and tests)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).tokens)


class BertTokenizer(TextTokenizer):
    """WordPiece tokenizer of a BERT vocab.txt, configured like transformers' BertTokenizer
    (what versions exported before tokenizer.json get, and what finetune builds)."""

    def __init__(
        self, vocab: dict[str, int], *, do_lower_case: bool = True, max_seq_len: int = 128
    ) -> None:
        if max_seq_len < 2:
            raise ValueError("max_seq_len must leave room for [CLS] and [SEP]")
        self.do_lower_case = do_lower_case
        super().__init__(
            wordpiece_tokenizer(vocab, lowercase=do_lower_case),
            max_seq_len=max_seq_len, pad_id=vocab.get(PAD, 0), unk_id=vocab[UNK],
        )  # fmt: skip

    @classmethod
    def from_files(
        cls, vocab_path: str | Path, *, do_lower_case: bool = True, max_seq_len: int = 128
    ) -> BertTokenizer:
        """Return a tokenizer for the vocab.txt at ``vocab_path``."""
        return cls(read_vocab(vocab_path), do_lower_case=do_lower_case, max_seq_len=max_seq_len)
