"""Length bucketing and chunking: pure functions from token lengths to padded batches."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from backend.errors import UpstreamError
from modelformat.buckets import bucket_for


@dataclass(frozen=True)
class Chunk:
    """Texts (by index into the request) sent together, padded to ``seq_len``."""

    indices: tuple[int, ...]
    seq_len: int


def plan_chunks(
    lengths: Sequence[int],
    max_batch: int,
    max_seq_len: int,
    *,
    bucketing: bool = True,
    bucket_lens: Sequence[int] | None = None,
) -> list[Chunk]:
    """Return the chunks to send: sorted and bucket-padded, or in caller order padded to longest.

    With bucketing, texts are sorted by length (stable, so equal lengths keep caller order) and
    cut into chunks of at most ``max_batch``; each chunk is padded to the bucket of its longest
    text. Without it, chunks follow the caller's order and each pads to its own longest text —
    the usual approach (e.g. a tokenizer called with padding=True per batch), kept for
    comparison in the benchmark. ``bucket_lens`` are the model's bucket lengths, when it has
    them (its ``seq_<L>`` signatures); otherwise 16, 32, 64, … up to ``max_seq_len``.
    """
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    if not lengths:
        return []
    if bucketing:
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    else:
        order = list(range(len(lengths)))
    chunks = []
    for start in range(0, len(order), max_batch):
        members = tuple(order[start : start + max_batch])
        longest = min(max(lengths[i] for i in members), max_seq_len)
        seq_len = bucket_for(longest, max_seq_len, lengths=bucket_lens) if bucketing else longest
        chunks.append(Chunk(indices=members, seq_len=seq_len))
    return chunks


def pad_batch(
    rows: Sequence[np.ndarray],
    seq_len: int,
    pad_id: int = 0,
    type_rows: Sequence[np.ndarray | None] | None = None,
    attention_rows: Sequence[np.ndarray | None] | None = None,
) -> dict[str, np.ndarray]:
    """Return the model's three int32 inputs [len(rows), seq_len] for rows of ids (each ≤ seq_len);
    ``type_rows`` (sentence pairs) are each row's token_type_ids, zeros where None;
    ``attention_rows`` each row's attention mask, ones over its ids where None."""
    input_ids = np.full((len(rows), seq_len), pad_id, dtype=np.int32)
    attention_mask = np.zeros((len(rows), seq_len), dtype=np.int32)
    token_type_ids = np.zeros((len(rows), seq_len), dtype=np.int32)
    for row, ids in enumerate(rows):
        input_ids[row, : ids.shape[0]] = ids
        attention = attention_rows[row] if attention_rows is not None else None
        attention_mask[row, : ids.shape[0]] = 1 if attention is None else attention
        types = type_rows[row] if type_rows is not None else None
        if types is not None:
            token_type_ids[row, : types.shape[0]] = types
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
    }


def reassemble(
    chunks: Sequence[Chunk],
    outputs: Sequence[dict[str, np.ndarray]],
    total: int,
    per_token: bool = False,
    token_outputs: Collection[str] = (),
) -> dict[str, np.ndarray]:
    """Return each output's rows put back in the caller's order.

    ``per_token`` (token classification: outputs ``[batch, seq, labels]``): each chunk's
    outputs are padded with zeros along the sequence axis to the longest chunk's, so chunks
    of different buckets can share one array (each row's own length says what is real).
    ``token_outputs``: the outputs padded so whatever ``per_token`` says (a retrieval model's
    ``token_weights``/``token_vectors`` beside its pooled ``embedding``, which is not).

    Every chunk must bring the same outputs with one row per text: a chunk that lacked one
    would leave its rows of ``np.empty`` unwritten (garbage served as scores), and a single row
    would be broadcast to every text of its chunk. Either is the model server's fault: a 502.
    """
    if not chunks:
        return {}
    if per_token or token_outputs:
        longest = max(chunk.seq_len for chunk in chunks)
        outputs = [
            {k: _pad_tokens(v, longest) if per_token or k in token_outputs else v
             for k, v in out.items()}
            for out in outputs
        ]  # fmt: skip
    if len(chunks) == 1 and list(chunks[0].indices) == list(range(total)):
        # One chunk in the caller's order (most requests): its outputs are the answer as is.
        _check_rows(chunks[0], outputs[0], total)
        return dict(outputs[0])
    merged: dict[str, np.ndarray] = {}
    for name, first in outputs[0].items():
        merged[name] = np.empty((total, *first.shape[1:]), dtype=first.dtype)
    for chunk, result in zip(chunks, outputs, strict=True):
        if result.keys() != merged.keys():
            raise UpstreamError(
                f"a chunk padded to {chunk.seq_len} tokens returned outputs {sorted(result)}, "
                f"another {sorted(merged)}: the model's signatures disagree"
            )
        index = np.asarray(chunk.indices, dtype=np.int64)
        for name, value in result.items():
            if value.shape != (len(index), *merged[name].shape[1:]):
                raise UpstreamError(
                    f"output {name!r} came back with shape {list(value.shape)} for "
                    f"{len(index)} texts (another chunk's rows: {list(merged[name].shape[1:])})"
                )
            merged[name][index] = value
    return merged


def _check_rows(chunk: Chunk, result: dict[str, np.ndarray], rows: int) -> None:
    """Raise a 502 unless every output of ``result`` has one row per text of ``chunk``."""
    for name, value in result.items():
        if value.ndim == 0 or value.shape[0] != rows:
            raise UpstreamError(
                f"output {name!r} came back with shape {list(value.shape)} for {rows} texts "
                f"(chunk padded to {chunk.seq_len} tokens)"
            )


def _pad_tokens(value: np.ndarray, seq_len: int) -> np.ndarray:
    """Return ``value`` [rows, seq, ...] zero-padded along its sequence axis to ``seq_len``."""
    if value.ndim < 2 or value.shape[1] >= seq_len:
        return value
    widths = [(0, 0), (0, seq_len - value.shape[1])] + [(0, 0)] * (value.ndim - 2)
    return np.pad(value, widths)
