"""Token classification (NER) post-processing: per-token scores → entities with character offsets.

Pure numpy. Each step has exactly the meaning transformers' ``TokenClassificationPipeline``
gives it (``gather_pre_entities``, ``aggregate``, ``aggregate_words``, ``group_entities``,
``aggregate_overlapping_entities``), so a served tagger answers what that pipeline answers on
the same checkpoint:

- ``none``: every token but the specials and ``O``, its own argmax label;
- ``simple``: tokens grouped into entities: adjacent tokens of one type join unless the later
  one is ``B-``; the score is the mean of the tokens' scores;
- ``first`` / ``max`` / ``average``: word pieces first fused into words (a piece is part of the
  previous word when its vocabulary form is not as long as the text it covers: ``##ing`` over
  ``ing``), a word's label being its first piece's, its most confident piece's, or the argmax
  of its pieces' averaged scores; then grouped as ``simple`` does.

Texts longer than a window are read in overlapping windows; each window's entities are found
alone, then overlapping entities are merged (the longer kept; equal lengths: the higher score),
which is what the pipeline does with ``stride``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from backend.tokenization import TokenWindow

STRATEGIES = ("none", "simple", "first", "max", "average")
IGNORED = ("O",)


def window_stride(max_seq_len: int) -> int:
    """Return how many tokens consecutive windows of a long text share: a quarter of a window
    of ``max_seq_len`` (its [CLS] and [SEP] left out)."""
    return (max_seq_len - 2) // 4


def token_scores(logits: np.ndarray) -> np.ndarray:
    """Return the softmax of ``logits`` [seq, labels] as the pipeline computes it (float32)."""
    logits = logits.astype(np.float32, copy=False)
    shifted = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def pre_entities(
    text: str, window: TokenWindow, scores: np.ndarray, unk_id: int, word_aware: bool = True
) -> list[dict[str, Any]]:
    """Return one dict per non-special token of ``window``: scores, offsets and whether it
    continues the previous word (the pipeline's ``gather_pre_entities``: by the token's
    length against its text where the tokenizer marks word pieces (``word_aware``: WordPiece's
    ##), else its fallback: a token not preceded by a space continues the word)."""
    out = []
    ids = window.encoded.ids.tolist()
    for index, (special, (start, end), token) in enumerate(
        zip(window.special, window.offsets, window.tokens, strict=True)
    ):
        if special:
            continue
        if word_aware:
            is_subword = len(token) != len(text[start:end])
        else:
            is_subword = start > 0 and " " not in text[start - 1 : start + 1]
        if ids[index] == unk_id:
            is_subword = False
        out.append({"scores": scores[index], "start": start, "end": end, "is_subword": is_subword})
    return out


def aggregate(
    pre: list[dict[str, Any]], strategy: str, labels: Sequence[str]
) -> list[dict[str, Any]]:
    """Return the window's entities ``{entity, score, start, end}`` under ``strategy`` (``entity``
    is the label for ``none``, the group's type otherwise), ``O`` left out."""
    if strategy in ("none", "simple"):
        entities = []
        for item in pre:
            best = int(item["scores"].argmax())
            entities.append({"entity": labels[best], "score": item["scores"][best],
                             "start": item["start"], "end": item["end"]})  # fmt: skip
    elif strategy in ("first", "max", "average"):
        entities = _aggregate_words(pre, strategy, labels)
    else:
        raise ValueError(f"aggregation must be one of {list(STRATEGIES)}, got {strategy!r}")
    if strategy != "none":
        entities = _group_entities(entities)
    return [e for e in entities if e["entity"] not in IGNORED]


def _aggregate_word(pieces: list[dict[str, Any]], strategy: str, labels: Sequence[str]) -> dict:
    if strategy == "first":
        scores = pieces[0]["scores"]
        best = int(scores.argmax())
        score = scores[best]
    elif strategy == "max":
        scores = max(pieces, key=lambda piece: piece["scores"].max())["scores"]
        best = int(scores.argmax())
        score = scores[best]
    else:  # average
        averaged = np.nanmean(np.stack([piece["scores"] for piece in pieces]), axis=0)
        best = int(averaged.argmax())
        score = averaged[best]
    return {"entity": labels[best], "score": score,
            "start": pieces[0]["start"], "end": pieces[-1]["end"]}  # fmt: skip


def _aggregate_words(
    pre: list[dict[str, Any]], strategy: str, labels: Sequence[str]
) -> list[dict[str, Any]]:
    words: list[dict[str, Any]] = []
    group: list[dict[str, Any]] | None = None
    for item in pre:
        if group is None:
            group = [item]
        elif item["is_subword"]:
            group.append(item)
        else:
            words.append(_aggregate_word(group, strategy, labels))
            group = [item]
    if group is not None:
        words.append(_aggregate_word(group, strategy, labels))
    return words


def _bio(label: str) -> tuple[str, str]:
    """Return (B or I, type) of a label; a label without a prefix continues (I)."""
    if label.startswith("B-"):
        return "B", label[2:]
    if label.startswith("I-"):
        return "I", label[2:]
    return "I", label


def _group(members: list[dict[str, Any]]) -> dict[str, Any]:
    scores = np.nanmean([member["score"] for member in members])
    return {"entity": members[0]["entity"].split("-", 1)[-1], "score": np.mean(scores),
            "start": members[0]["start"], "end": members[-1]["end"]}  # fmt: skip


def _group_entities(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []
    for entity in entities:
        if not current:
            current.append(entity)
            continue
        bi, kind = _bio(entity["entity"])
        _, last_kind = _bio(current[-1]["entity"])
        if kind == last_kind and bi != "B":
            current.append(entity)
        else:
            groups.append(_group(current))
            current = [entity]
    if current:
        groups.append(_group(current))
    return groups


def merge_overlapping(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the entities of overlapping windows with overlaps resolved: sorted by start, an
    entity starting inside the previous one replaces it if longer (or as long and more
    confident), else is dropped (the pipeline's ``aggregate_overlapping_entities``)."""
    if not entities:
        return entities
    ordered = sorted(entities, key=lambda e: e["start"])
    merged = []
    previous = ordered[0]
    for entity in ordered:
        if previous["start"] <= entity["start"] < previous["end"]:
            length = entity["end"] - entity["start"]
            previous_length = previous["end"] - previous["start"]
            if length > previous_length or (
                length == previous_length and entity["score"] > previous["score"]
            ):
                previous = entity
        else:
            merged.append(previous)
            previous = entity
    merged.append(previous)
    return merged


def tag_text(
    text: str,
    windows: Sequence[TokenWindow],
    rows: Sequence[np.ndarray],
    strategy: str,
    labels: Sequence[str],
    unk_id: int,
    probabilities: bool = False,
    word_aware: bool = True,
) -> list[dict[str, Any]]:
    """Return the entities of ``text`` read in ``windows`` (``rows``: each window's logits, or
    its probabilities if ``probabilities``, [window length, labels]): ``{entity, label, score,
    start, end, text}`` with ``start``/``end`` character offsets into ``text`` as given,
    ``entity`` the type (``ORDER``), ``label`` the model's label (``B-ORDER`` under ``none``,
    the type otherwise); ``word_aware``: see ``pre_entities``."""
    found: list[dict[str, Any]] = []
    for window, row in zip(windows, rows, strict=True):
        scores = row.astype(np.float32, copy=False) if probabilities else token_scores(row)
        pre = pre_entities(text, window, scores, unk_id, word_aware)
        found.extend(aggregate(pre, strategy, labels))
    if len(windows) > 1:
        found = merge_overlapping(found)
    return [
        {
            "entity": _bio(e["entity"])[1] if strategy == "none" else e["entity"],
            "label": e["entity"],
            "score": float(e["score"]),
            "start": e["start"],
            "end": e["end"],
            "text": text[e["start"] : e["end"]],
        }
        for e in found
    ]
