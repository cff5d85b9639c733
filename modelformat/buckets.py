"""The length-bucket rule: which padded lengths a model has a fixed-length signature for."""

from __future__ import annotations

from collections.abc import Sequence

MIN_BUCKET = 16
SIGNATURE_PREFIX = "seq_"


def buckets(max_seq_len: int, smallest: int = MIN_BUCKET) -> list[int]:
    """Return the bucket lengths 16, 32, 64, … up to and including ``max_seq_len``."""
    out = []
    size = smallest
    while size < max_seq_len:
        out.append(size)
        size *= 2
    out.append(max_seq_len)
    return out


def bucket_for(
    length: int,
    max_seq_len: int,
    smallest: int = MIN_BUCKET,
    lengths: Sequence[int] | None = None,
) -> int:
    """Return the smallest bucket that holds ``length`` tokens, never fewer than ``length``.

    ``lengths`` replaces the 16/32/64/… rule with a model's own buckets (its ``seq_<L>``
    signatures), so every chunk is padded to a length the model has a signature for. A length
    past every bucket (a model whose buckets stop short of ``max_seq_len``) is padded to
    ``max_seq_len``, which the gateway then sends to ``serving_default``: cutting it to the
    largest bucket would drop tokens.
    """
    for size in sorted(lengths) if lengths else buckets(max_seq_len, smallest):
        if length <= size:
            return size
    return max(length, max_seq_len)


def signature_name(seq_len: int) -> str:
    """Return the name of the fixed-length signature for padded length ``seq_len``."""
    return f"{SIGNATURE_PREFIX}{seq_len}"
