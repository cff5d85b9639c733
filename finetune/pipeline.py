"""Training input: gateway tokenization, then either the tf.data pipeline or the naive loop.

``optimised``: tokenize every text once with the gateway's tokenizer (HF ``tokenizers`` batch
encoding, parallel in Rust), then ``from_tensor_slices`` → parallel ``map`` (ids → the three BERT
inputs) → ``cache`` → ``shuffle`` → ``bucket_by_sequence_length`` on the gateway's bucket rule
(each batch padded to a serving bucket: 16, 32, 64, … ``max_seq_len``) → ``prefetch(AUTOTUNE)``.

``naive``: the baseline the benchmark compares against: tokenize each batch inside the training
loop, pad every batch to ``max_seq_len``, no prefetch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from backend.bucketing import pad_batch
from backend.tokenization import BertTokenizer, TextTokenizer
from modelformat.buckets import bucket_for, buckets

PIPELINES = ("optimised", "naive")
UNCUT = 1 << 30  # a max_seq_len no text reaches: tokenize whole, cut afterwards
Batch = tuple[dict[str, Any], Any]  # (BERT inputs, label ids): numpy or tensors


def make_tokenizer(vocab: Sequence[str], do_lower_case: bool, max_seq_len: int) -> BertTokenizer:
    """Return the gateway's tokenizer for a checkpoint's vocabulary (ids identical to serving)."""
    index: dict[str, int] = {}
    for i, token in enumerate(vocab):
        index.setdefault(token, i)  # a duplicated token keeps its first id, as read_vocab does
    return BertTokenizer(index, do_lower_case=do_lower_case, max_seq_len=max_seq_len)


def checkpoint_tokenizer(ckpt: Any, max_seq_len: int) -> TextTokenizer:
    """Return the gateway's tokenizer for a checkpoint (``export.checkpoint.Checkpoint``): its
    tokenizer.json exactly as export writes it into the version's assets and the gateway loads
    it (any kind: WordPiece, byte-level BPE, SentencePiece), else the WordPiece of its vocab."""
    assets = getattr(ckpt, "tokenizer", None)
    if assets is None:
        return make_tokenizer(ckpt.vocab, ckpt.do_lower_case, max_seq_len)
    from tokenizers import Tokenizer

    from modelformat.tokenizer import spec_from_info

    tokenizer = Tokenizer.from_str(assets.json_text)
    spec = spec_from_info(tokenizer, assets.entry)
    return TextTokenizer(tokenizer, max_seq_len=max_seq_len, pad_id=spec.pad_id,
                         unk_id=spec.unk_id, truncation_side=spec.truncation_side)  # fmt: skip


def token_ids(tokenizer: TextTokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Return each text's int32 ids ([CLS] … [SEP], cut to the tokenizer's max_seq_len)."""
    return [encoded.ids for encoded in tokenizer.encode(texts)]


def sorted_batches(
    rows: Sequence[np.ndarray],
    size: int,
    max_seq_len: int,
    pad_id: int,
    types: Sequence[np.ndarray] | None = None,
) -> list[tuple[list[int], dict[str, np.ndarray]]]:
    """Return (row indices, padded inputs) per batch for scoring: rows sorted by length (stable),
    ``size`` at a time, each batch padded to the gateway's bucket of its longest row.

    ``types`` (sentence pairs) gives each row's ``token_type_ids``; without it they are 0.
    """
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = []
    for start in range(0, len(order), size):
        chunk = order[start : start + size]
        width = bucket_for(max(len(rows[i]) for i in chunk), max_seq_len)
        feeds = pad_batch([rows[i] for i in chunk], width, pad_id)
        if types is not None:
            for j, i in enumerate(chunk):
                feeds["token_type_ids"][j, : len(types[i])] = types[i]
        out.append((chunk, feeds))
    return out


def pair_token_ids(
    tokenizer: TextTokenizer, texts_a: Sequence[str], texts_b: Sequence[str]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Return each pair's ids and token types exactly as the gateway builds them for this
    checkpoint: its tokenizer.json's pair template (``[CLS] a [SEP] b [SEP]`` with type 1 on
    ``b [SEP]`` for BERT; ``<s> a </s></s> b </s>`` with every type 0 for RoBERTa, XLM-R,
    CamemBERT, MPNet), cut ``longest_first`` to the tokenizer's max_seq_len on its
    truncation side (``backend.tokenization.longest_first``: HF tokenizers' rule), so a long
    answer never pushes the question out and training cuts pairs as serving does.

    Unlike the gateway, which refuses a pair whose first segment alone fills max_seq_len, a
    training pair is kept and cut longest-first (what transformers' tokenizer(a, b) does).
    """
    rows = tokenizer.encode_pairs(list(zip(texts_a, texts_b, strict=True)),
                                  refuse_long_first=False)  # fmt: skip
    types = [np.zeros(len(e.ids), np.int32) if e.type_ids is None else e.type_ids for e in rows]
    return [e.ids for e in rows], types


def bucket_boundaries(max_seq_len: int) -> list[int]:
    """Return ``bucket_by_sequence_length`` boundaries for the gateway's buckets.

    A boundary is exclusive and ``pad_to_bucket_boundary`` pads to boundary − 1, so boundary
    ``L + 1`` pads a batch to exactly the serving bucket ``L``.
    """
    return [length + 1 for length in buckets(max_seq_len)]


def optimised_dataset(
    ids: Sequence[np.ndarray],
    labels: Sequence[int] | np.ndarray | Sequence[np.ndarray],
    types: Sequence[np.ndarray] | None = None,
    *,
    per_token: bool = False,
) -> Any:
    """Return the cached per-example dataset ``({input_ids, attention_mask, token_type_ids}, y)``.

    ``labels``: one int per row (classify), a ``[rows, labels]`` float array (multi-label) or, with
    ``per_token``, one int array per row as long as its ids (tagging). ``types``: each row's
    token types (sentence pairs); 0 without it. Padding happens per batch, in ``bucketed_batches``.
    """
    import tensorflow as tf

    lengths = np.array([len(row) for row in ids], dtype=np.int64)

    def ragged(rows: Sequence[np.ndarray]) -> Any:
        flat = np.concatenate(rows).astype(np.int32) if len(rows) else np.zeros(0, np.int32)
        return tf.RaggedTensor.from_row_lengths(flat, lengths)

    row_types = ragged(types) if types is not None else ragged([np.zeros_like(r) for r in ids])
    y = ragged(labels) if per_token else tf.constant(np.asarray(labels))  # type: ignore[arg-type]
    if y.dtype == tf.int64:
        y = tf.cast(y, tf.int32)
    elif y.dtype == tf.float64:
        y = tf.cast(y, tf.float32)

    def features(row: tf.Tensor, kinds: tf.Tensor, label: tf.Tensor
                 ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:  # fmt: skip
        inputs = {"input_ids": row, "attention_mask": tf.ones_like(row), "token_type_ids": kinds}
        return inputs, label

    dataset = tf.data.Dataset.from_tensor_slices((ragged(ids), row_types, y))
    return dataset.map(features, num_parallel_calls=tf.data.AUTOTUNE).cache()


def bucketed_batches(
    examples: Any,
    batch_size: int,
    max_seq_len: int,
    pad_id: int,
    *,
    seed: int | None,
    skip: int = 0,
    label_pad: int = 0,
) -> Any:
    """Return shuffled (``seed`` None: in order) length-bucketed batches, prefetched.

    Per-token labels are padded with ``label_pad`` (tagging: the ignored index).
    """
    import tensorflow as tf

    dataset = examples
    if seed is not None:
        size = int(dataset.cardinality())
        dataset = dataset.shuffle(max(size, 1), seed=seed, reshuffle_each_iteration=False)
    boundaries = bucket_boundaries(max_seq_len)
    pad = tf.constant(pad_id, tf.int32)
    zero = tf.constant(0, tf.int32)
    label = tf.constant(label_pad, dataset.element_spec[1].dtype)
    dataset = dataset.bucket_by_sequence_length(
        lambda inputs, _label: tf.shape(inputs["input_ids"])[0],
        boundaries,
        [batch_size] * (len(boundaries) + 1),
        padding_values=({"input_ids": pad, "attention_mask": zero, "token_type_ids": zero}, label),
        pad_to_bucket_boundary=True,
    )
    if skip:
        dataset = dataset.skip(skip)
    return dataset.prefetch(tf.data.AUTOTUNE)


def naive_batches(
    tokenizer: TextTokenizer,
    texts: Sequence[str],
    label_ids: Sequence[int],
    batch_size: int,
    *,
    seed: int | None,
    skip: int = 0,
) -> Iterator[Batch]:
    """Yield batches tokenized on the spot and padded to ``max_seq_len`` (the baseline)."""
    order = np.arange(len(texts))
    if seed is not None:
        order = np.random.default_rng(seed).permutation(len(texts))
    starts = range(0, len(texts), batch_size)
    for start in islice(starts, skip, None):
        chunk = order[start : start + batch_size]
        rows = token_ids(tokenizer, [texts[i] for i in chunk])
        inputs = pad_batch(rows, tokenizer.max_seq_len, tokenizer.pad_id)
        yield inputs, np.asarray([label_ids[i] for i in chunk], dtype=np.int32)


def padding_tokens(batches: Iterator[Batch]) -> list[int]:
    """Return the padded (masked-out) positions of each batch."""
    return [int(np.size(inputs["attention_mask"]) - np.sum(inputs["attention_mask"]))
            for inputs, _labels in batches]  # fmt: skip
