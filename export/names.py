"""Tensor names: the canonical form every reader fills, Google BERT's spellings, the students.

Hugging Face spellings of every architecture are export/architectures/' (one module each)."""

from __future__ import annotations

from dataclasses import dataclass

from export.config import BertConfig

# A shape entry that is a string is a size fixed by the checkpoint itself (the number of labels).
Dim = int | str


@dataclass(frozen=True)
class TensorName:
    """One weight: canonical name and shape (kernels ``[in, out]``), and where a format keeps it."""

    canonical: str
    shape: tuple[Dim, ...]
    source: str
    transposed: bool = False  # the format stores the kernel as [out, in] (torch Linear)
    optional: bool = False
    head: bool = False  # outside the encoder: no "bert." prefix in Hugging Face checkpoints


# (canonical suffix, HF name, Google name, is a kernel) for the tensors of one encoder layer.
_LAYER = [
    ("query/kernel", "attention.self.query.weight", "attention/self/query/kernel", True),
    ("query/bias", "attention.self.query.bias", "attention/self/query/bias", False),
    ("key/kernel", "attention.self.key.weight", "attention/self/key/kernel", True),
    ("key/bias", "attention.self.key.bias", "attention/self/key/bias", False),
    ("value/kernel", "attention.self.value.weight", "attention/self/value/kernel", True),
    ("value/bias", "attention.self.value.bias", "attention/self/value/bias", False),
    (
        "attention_out/kernel",
        "attention.output.dense.weight",
        "attention/output/dense/kernel",
        True,
    ),
    ("attention_out/bias", "attention.output.dense.bias", "attention/output/dense/bias", False),
    (
        "attention_ln/gamma",
        "attention.output.LayerNorm.weight",
        "attention/output/LayerNorm/gamma",
        False,
    ),
    (
        "attention_ln/beta",
        "attention.output.LayerNorm.bias",
        "attention/output/LayerNorm/beta",
        False,
    ),
    ("intermediate/kernel", "intermediate.dense.weight", "intermediate/dense/kernel", True),
    ("intermediate/bias", "intermediate.dense.bias", "intermediate/dense/bias", False),
    ("output/kernel", "output.dense.weight", "output/dense/kernel", True),
    ("output/bias", "output.dense.bias", "output/dense/bias", False),
    ("output_ln/gamma", "output.LayerNorm.weight", "output/LayerNorm/gamma", False),
    ("output_ln/beta", "output.LayerNorm.bias", "output/LayerNorm/beta", False),
]


def _layer_shapes(config: BertConfig) -> dict[str, tuple[Dim, ...]]:
    h, i = config.hidden_size, config.intermediate_size
    return {
        "query/kernel": (h, h), "query/bias": (h,), "key/kernel": (h, h), "key/bias": (h,),
        "value/kernel": (h, h), "value/bias": (h,), "attention_out/kernel": (h, h),
        "attention_out/bias": (h,), "attention_ln/gamma": (h,), "attention_ln/beta": (h,),
        "intermediate/kernel": (h, i), "intermediate/bias": (i,), "output/kernel": (i, h),
        "output/bias": (h,), "output_ln/gamma": (h,), "output_ln/beta": (h,),
    }  # fmt: skip


def tensor_names(config: BertConfig, fmt: str = "google") -> list[TensorName]:
    """Return every tensor a Google BERT checkpoint (+ optional run_classifier head) has.

    google-research/bert names, ``[in, out]`` kernels. Hugging Face checkpoints of every
    architecture: export/architectures/ (``tensor_names``).
    """
    if fmt != "google":
        raise ValueError(f"tensor_names reads Google checkpoints, not {fmt!r}")
    h = config.hidden_size
    out = [
        TensorName(c, s, f"bert/embeddings/{n}")
        for c, s, n in (
            ("embeddings/word", (config.vocab_size, h), "word_embeddings"),
            ("embeddings/position", (config.max_position, h), "position_embeddings"),
            ("embeddings/token_type", (config.type_vocab_size, h), "token_type_embeddings"),
        )
    ]
    out += [
        TensorName("embeddings_ln/gamma", (h,), "bert/embeddings/LayerNorm/gamma"),
        TensorName("embeddings_ln/beta", (h,), "bert/embeddings/LayerNorm/beta"),
    ]
    shapes = _layer_shapes(config)
    for layer in range(config.num_layers):
        for suffix, _, google_name, _ in _LAYER:
            source = f"bert/encoder/layer_{layer}/{google_name}"
            out.append(TensorName(f"layer_{layer}/{suffix}", shapes[suffix], source))
    out += [
        TensorName("pooler/kernel", (h, h), "bert/pooler/dense/kernel", optional=True),
        TensorName("pooler/bias", (h,), "bert/pooler/dense/bias", optional=True),
        # run_classifier keeps the classifier as [labels, hidden]
        TensorName("classifier/kernel", (h, "labels"), "output_weights",
                   transposed=True, optional=True, head=True),
        TensorName("classifier/bias", ("labels",), "output_bias", optional=True, head=True),
    ]  # fmt: skip
    return out


def exit_tensor_names(config: BertConfig) -> list[TensorName]:
    """Return the early-exit students' tensors: one after each layer but the last.

    ``exits.{k}`` is the student after layer k+1: a dense layer (hidden → width, tanh) and a
    classifier (width → labels), torch layouts, outside ``bert.`` (transformers ignores them).
    """
    h = config.hidden_size
    out = []
    for k in range(config.num_layers - 1):
        for part, shape in (("dense", (h, "exit_width")), ("classifier", ("exit_width", "labels"))):
            out += [
                TensorName(f"exit_{k}/{part}/kernel", shape, f"exits.{k}.{part}.weight",
                           transposed=True, optional=True, head=True),
                TensorName(f"exit_{k}/{part}/bias", shape[1:], f"exits.{k}.{part}.bias",
                           optional=True, head=True),
            ]  # fmt: skip
    return out
