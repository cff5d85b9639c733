"""The fine-tuned checkpoint on disk: Hugging Face layout, written to a temp dir and renamed.

``<out>/config.json`` (with ``id2label``/``label2id``, so ``export build --task classify`` needs no
labels flag), ``model.safetensors`` (the architecture's own HF names, torch layouts), the
source's tokenizer files (``tokenizer.json``...; ``vocab.txt`` for a vocab.txt-only source) and
``metrics.json``. The directory appears complete or not at all: it is filled under
``<parent>/.tmp-<name>-<random>``, fsynced and renamed (the same rule export publishes versions
by, modelformat/publish.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from export.architectures import architecture, tensor_names
from export.config import BertConfig
from export.names import TensorName
from finetune.errors import FinetuneError
from modelformat.publish import TEMP_PREFIX, fsync_tree, remove_tree

METRICS_JSON = "metrics.json"


def state_dir(out: Path) -> Path:
    """Return where a run keeps its resumable training state (beside ``out``, non-final name)."""
    return out.parent / f"{TEMP_PREFIX}{out.name}.train"


def hf_tensors(config: BertConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Return canonical weights under the architecture's task-model names (torch layouts).

    Where an architecture names one canonical tensor twice (RoBERTa's ``classifier.out_proj``
    after its head's dense, ``classifier`` in a token classifier), a model with the head's
    dense (``pooler/*``) takes the first, one without it the last.
    """
    specs: dict[str, list[TensorName]] = {}
    for spec in tensor_names(config):
        specs.setdefault(spec.canonical, []).append(spec)
    prefix = architecture(config.model_type).prefix
    pooled = "pooler/kernel" in weights
    out = {}
    for canonical, candidates in specs.items():
        if canonical not in weights:
            continue
        spec = candidates[0] if pooled else candidates[-1]
        name = spec.source if spec.head else f"{prefix}{spec.source}"
        value = weights[canonical]
        out[name] = np.ascontiguousarray(value.T if spec.transposed else value, dtype=np.float32)
    return out


def hf_config(
    config: BertConfig,
    labels: Sequence[str],
    max_seq_len: int,
    head: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the ``config.json`` of a ``BertForSequenceClassification`` with these labels.

    ``head`` (finetune/tasks.py ``Task.config``) replaces ``architectures`` and ``problem_type``
    and adds its own keys (``text_pair``, ``thresholds``, ``label_scheme``); a head without a
    ``problem_type`` (token classification, a one-logit cross-encoder) gets none, as
    transformers' own checkpoints of those kinds have none. Another architecture than BERT keeps
    the ``source`` checkpoint's config.json (its own keys) with the labels and head replaced, and
    the head's class named as that architecture names it (``RobertaForTokenClassification``).
    """
    out = _base_config(config, labels, max_seq_len)
    if config.model_type != "bert":
        out = {**(source or {}), **{k: out[k] for k in _HEAD_KEYS}}
        for key in ("text_pair", "thresholds", "label_scheme", "sentence_transformers"):
            out.pop(key, None)
    if head is not None:
        out.pop("problem_type")
        out.update(head)
    if config.model_type != "bert":
        classes = architecture(config.model_type).classes
        token = "BertForTokenClassification" in out.get("architectures", [])
        out["architectures"] = [classes["tag" if token else "classify"]]
    return out


# what a fine-tuned checkpoint of another architecture takes over from BERT's config.json
_HEAD_KEYS = ("architectures", "problem_type", "id2label", "label2id", "finetune_max_seq_len")


def _base_config(config: BertConfig, labels: Sequence[str], max_seq_len: int) -> dict[str, Any]:
    return {
        "architectures": ["BertForSequenceClassification"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.layer_norm_eps,
        "initializer_range": 0.02,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "classifier_dropout": None,
        "problem_type": "single_label_classification",
        "id2label": {str(i): label for i, label in enumerate(labels)},
        "label2id": {label: i for i, label in enumerate(labels)},
        "finetune_max_seq_len": max_seq_len,
    }


def write_checkpoint(
    dest: Path,
    config: BertConfig,
    weights: dict[str, np.ndarray],
    labels: Sequence[str],
    vocab: Sequence[str],
    do_lower_case: bool,
    max_seq_len: int,
    metrics: dict[str, Any],
    head: dict[str, Any] | None = None,
    source: dict[str, Any] | None = None,
    tokenizer_files: dict[str, str] | None = None,
) -> None:
    """Write the HF-layout files into the (temporary) directory ``dest`` (``head``: the task's
    config.json keys, ``source``: the input checkpoint's config.json, see ``hf_config``;
    ``tokenizer_files``: the input checkpoint's tokenizer files, name → text, written as they
    are instead of a BERT vocab.txt and tokenizer_config.json)."""
    from safetensors.numpy import save_file

    save_file(hf_tensors(config, weights), str(dest / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    written = hf_config(config, labels, max_seq_len, head, source)
    (dest / "config.json").write_text(json.dumps(written, indent=2) + "\n", encoding="utf-8")
    if tokenizer_files:
        for name, text in tokenizer_files.items():
            (dest / Path(name).name).write_text(text, encoding="utf-8")
        (dest / METRICS_JSON).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        return
    (dest / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case,
        "model_max_length": max_seq_len, "unk_token": "[UNK]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
    }  # fmt: skip
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n",
                                                encoding="utf-8")  # fmt: skip
    (dest / METRICS_JSON).write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def publishing(out: Path) -> Iterator[Path]:
    """Yield a temp dir beside ``out``; rename it to ``out`` on success, remove it on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.parent / f"{TEMP_PREFIX}{out.name}-{secrets.token_hex(4)}"
    try:
        temp.mkdir()
        yield temp
        fsync_tree(temp)
        if out.exists():
            raise FinetuneError(f"{out} appeared while training; not replaced")
        os.rename(temp, out)
        fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)  # make the rename itself durable
        finally:
            os.close(fd)
    except OSError as exc:  # disk full, read-only, permissions
        raise FinetuneError(f"writing {exc.filename or out} failed: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(OSError):  # best effort; the temp name is never final
            remove_tree(temp)  # a no-op after the rename
