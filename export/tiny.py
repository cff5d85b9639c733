"""Tiny random BERT checkpoints and exported versions for tests and benchmarks (no TF at import).

Nothing here imports TensorFlow or torch at import time: ``export_tiny_model`` imports
``export.build`` (and so TensorFlow) only when it is called. Weights are drawn with a larger
spread than BERT's initialiser so that different seeds give visibly different outputs, which is
what makes a version switch observable in gateway and modelserver tests.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

_PUNCT = list(".,!?'\"-:;()/#$%&*+=@")
_DIGITS = list("0123456789")
_WORDS_TEXT = """
the a an and or but if to of in on at for with from by about as is are was were be been am
i you he she it we they me my your his her our their this that these those there here what
when where why how who which not no yes do does did done have has had can could will would
should please thanks thank hello hi hey world help need want get got make made see know
card cards credit debit account accounts password login log sign email phone number address
order orders ordered package delivery deliver delivered shipping shipped ship track tracking
refund refunds return returned money charge charged charges twice double payment paid pay
bill billing invoice price cost fee fees subscription cancel cancelled plan upgrade
app website page error errors crash crashed broken bug slow work working works load loading
still yet late day days week weeks month today yesterday tomorrow time again never always
good great bad terrible awful love hate happy sad angry fine ok okay problem issue issues
item items product products wrong missing lost arrived arrive received receive store shop
reset change update locked access open close new old one two three first last more less
very really so too just only also all any some every much many
"""
_PIECES = ["##s", "##ing", "##ed", "##er", "##ly", "##es", "##d", "##n", "##t", "##y", "##e"]
TAG_LABELS = ("O", "B-ORDER", "I-ORDER", "B-EMAIL", "I-EMAIL")
CLASSIFY_LABELS = ("negative", "neutral", "positive")
_CHINESE = list("我的订单还没到你好是不了在有人这个们中来上大为和国地以说时要就出会可也")


def tiny_vocab() -> list[str]:
    """Return a small WordPiece vocabulary: specials (ids 0..4), punctuation, digits, words, CJK."""
    seen: set[str] = set()
    vocab: list[str] = []
    for token in [*SPECIAL_TOKENS, *_PUNCT, *_DIGITS, *_WORDS_TEXT.split(), *_PIECES, *_CHINESE]:
        if token not in seen:
            seen.add(token)
            vocab.append(token)
    return vocab


def _bert_tensors(
    rng: np.random.Generator,
    *,
    vocab_size: int,
    hidden: int,
    layers: int,
    intermediate: int,
    max_position: int,
) -> dict[str, np.ndarray]:
    """Return BertModel weights in Hugging Face names (torch Linear layout: [out, in])."""

    def normal(*shape: int, std: float = 0.2) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    def layer_norm(prefix: str) -> dict[str, np.ndarray]:
        return {
            f"{prefix}.LayerNorm.weight": (1.0 + normal(hidden, std=0.1)),
            f"{prefix}.LayerNorm.bias": normal(hidden, std=0.1),
        }

    def dense(prefix: str, n_in: int, n_out: int) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": normal(n_out, n_in), f"{prefix}.bias": normal(n_out, std=0.05)}

    out: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": normal(vocab_size, hidden, std=1.0),
        "embeddings.position_embeddings.weight": normal(max_position, hidden, std=0.3),
        "embeddings.token_type_embeddings.weight": normal(2, hidden, std=0.3),
        **layer_norm("embeddings"),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            out.update(dense(f"{p}.attention.self.{part}", hidden, hidden))
        out.update(dense(f"{p}.attention.output.dense", hidden, hidden))
        out.update(layer_norm(f"{p}.attention.output"))
        out.update(dense(f"{p}.intermediate.dense", hidden, intermediate))
        out.update(dense(f"{p}.output.dense", intermediate, hidden))
        out.update(layer_norm(f"{p}.output"))
    out.update(dense("pooler.dense", hidden, hidden))
    return out


def write_hf_checkpoint(
    dest: str | Path,
    *,
    task: str = "classify",
    labels: Sequence[str] | None = None,
    seed: int = 0,
    vocab: Sequence[str] | None = None,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    intermediate: int = 37,
    max_position: int = 128,
    do_lower_case: bool = True,
    exits: bool = False,
    exit_width: int = 8,
    problem_type: str | None = None,
    thresholds: Mapping[str, float] | None = None,
    text_pair: bool = False,
) -> Path:
    """Write a random Hugging Face BERT directory and return its path.

    ``classify`` writes ``BertForSequenceClassification`` names (``bert.*`` + ``classifier.*``)
    and ``id2label`` (default labels negative/neutral/positive); ``problem_type`` goes into
    config.json when given (``multi_label_classification`` also writes ``thresholds``: the given
    ones, else 0.5 per label), ``text_pair`` writes ``"text_pair": true`` (a sentence-pair model).
    ``tag`` writes ``BertForTokenClassification`` names (``bert.*`` without the pooler,
    ``classifier.*`` of shape [labels, hidden]) with BIO labels (default ``TAG_LABELS``).
    ``embed`` writes plain ``BertModel`` names. ``exits`` adds random early-exit students after
    layers 1..L-1 (``exits.{k}.*``) and config.json's ``early_exits``.
    """
    from safetensors.numpy import save_file  # light, but only needed here

    if task not in ("classify", "embed", "tag"):
        raise ValueError(f"task must be classify, embed or tag, got {task!r}")
    if labels is None:
        labels = TAG_LABELS if task == "tag" else CLASSIFY_LABELS
    tokens = list(vocab) if vocab is not None else tiny_vocab()
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = _bert_tensors(
        rng,
        vocab_size=len(tokens),
        hidden=hidden,
        layers=layers,
        intermediate=intermediate,
        max_position=max_position,
    )
    config: dict[str, object] = {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": len(tokens),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": intermediate,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": max_position,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
    }
    if task in ("classify", "tag"):
        tensors = {f"bert.{name}": value for name, value in tensors.items()}
        if task == "tag":  # BertForTokenClassification has no pooler
            tensors = {k: v for k, v in tensors.items() if not k.startswith("bert.pooler.")}
        tensors["classifier.weight"] = rng.normal(0.0, 0.5, (len(labels), hidden)).astype(
            np.float32
        )
        tensors["classifier.bias"] = rng.normal(0.0, 0.1, (len(labels),)).astype(np.float32)
        config["architectures"] = [
            "BertForTokenClassification" if task == "tag" else "BertForSequenceClassification"
        ]
        config["id2label"] = {str(i): label for i, label in enumerate(labels)}
        config["label2id"] = {label: i for i, label in enumerate(labels)}
        config.update(_head_config(task, labels, problem_type, thresholds, text_pair))
    if exits:
        if task != "classify" or problem_type not in (None, "single_label_classification"):
            raise ValueError("exits need a classifier: task classify")
        for k in range(layers - 1):
            for part, n_in, n_out in (("dense", hidden, exit_width),
                                      ("classifier", exit_width, len(labels))):  # fmt: skip
                tensors[f"exits.{k}.{part}.weight"] = rng.normal(0.0, 0.5, (n_out, n_in)).astype(
                    np.float32
                )
                tensors[f"exits.{k}.{part}.bias"] = rng.normal(0.0, 0.1, (n_out,)).astype(
                    np.float32
                )
        agreement = {str(k + 1): 0.0 for k in range(layers - 1)}  # random: not distilled
        config["early_exits"] = {
            "pooling": "mean", "width": exit_width, "layers": list(range(1, layers)),
            "agreement": agreement,
        }  # fmt: skip
    save_file(tensors, str(dest / "model.safetensors"))
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (dest / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    tokenizer_config = {
        "do_lower_case": do_lower_case,
        "tokenizer_class": "BertTokenizer",
        "model_max_length": max_position,
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return dest


def _head_config(
    task: str,
    labels: Sequence[str],
    problem_type: str | None,
    thresholds: Mapping[str, float] | None,
    text_pair: bool,
) -> dict[str, object]:
    """Return config.json's head keys: problem_type, thresholds, text_pair (classify only)."""
    if task != "classify":
        return {}
    out: dict[str, object] = {}
    if problem_type is not None:
        out["problem_type"] = problem_type
    if problem_type == "multi_label_classification" or thresholds:
        out["thresholds"] = {label: 0.5 for label in labels} | dict(thresholds or {})
    if text_pair:
        out["text_pair"] = True
    return out


def export_tiny_model(
    base_path: str | Path,
    name: str,
    *,
    task: str = "classify",
    version: int | None = None,
    seed: int = 0,
    precision: str = "fp32",
    max_seq_len: int = 64,
    vocab: Sequence[str] | None = None,
    warmup: bool = True,
    early_exit: bool = False,
    default_speed: float = 0.0,
    layers: int = 2,
    labels: Sequence[str] | None = None,
    problem_type: str | None = None,
    thresholds: Mapping[str, float] | None = None,
    text_pair: bool = False,
) -> Path:
    """Export a tiny random BERT as ``<base_path>/<name>/<version>`` and return that directory.

    ``task`` is classify, embed or tag; ``labels``, ``problem_type``, ``thresholds`` and
    ``text_pair`` describe the head as in ``write_hf_checkpoint`` (defaults: its defaults).
    ``early_exit`` exports random students with it (``--early-exit``; ``layers`` ≥ 2).
    """
    from export.build import build  # imports TensorFlow: only when a test actually exports

    with tempfile.TemporaryDirectory(prefix="tiny-bert-") as tmp:
        checkpoint = write_hf_checkpoint(
            Path(tmp) / "ckpt", task=task, seed=seed, vocab=vocab, exits=early_exit, layers=layers,
            labels=labels, problem_type=problem_type, thresholds=thresholds, text_pair=text_pair,
        )  # fmt: skip
        result = build(
            checkpoint,
            name,
            base_path,
            version=version,
            task=task,
            precision=precision,
            max_seq_len=max_seq_len,
            warmup=warmup,
            early_exit=early_exit,
            default_speed=default_speed,
        )
    return result.path


def _google_name(hf_name: str) -> tuple[str, bool]:
    """Return the google-research/bert name of a HF tensor and whether it must be transposed."""
    if hf_name == "classifier.weight":
        return "output_weights", False  # run_classifier keeps [labels, hidden] like torch
    if hf_name == "classifier.bias":
        return "output_bias", False
    name = hf_name.removeprefix("bert.")
    name = name.replace("encoder.layer.", "encoder.layer_").replace(".", "/")
    if name.endswith("_embeddings/weight"):
        return "bert/" + name.removesuffix("/weight"), False
    if "LayerNorm/" in name:
        return "bert/" + name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
    if name.endswith("/weight"):
        return "bert/" + name.removesuffix("/weight") + "/kernel", True
    return "bert/" + name, False


def write_google_checkpoint(hf_dir: str | Path, dest: str | Path) -> Path:
    """Rewrite a HF checkpoint from ``write_hf_checkpoint`` as a Google BERT TF checkpoint dir.

    Writes ``bert_config.json``, ``vocab.txt`` and ``bert_model.ckpt.*`` with raw variable names
    (``tf.raw_ops.SaveV2``, no graph code) and returns ``dest``. Imports TensorFlow.
    """
    import tensorflow as tf
    from safetensors.numpy import load_file

    hf_dir, dest = Path(hf_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    keys = [
        "attention_probs_dropout_prob",
        "hidden_act",
        "hidden_dropout_prob",
        "hidden_size",
        "initializer_range",
        "intermediate_size",
        "max_position_embeddings",
        "num_attention_heads",
        "num_hidden_layers",
        "type_vocab_size",
        "vocab_size",
    ]
    (dest / "bert_config.json").write_text(json.dumps({k: config[k] for k in keys}, indent=2))
    (dest / "vocab.txt").write_bytes((hf_dir / "vocab.txt").read_bytes())
    names, tensors = [], []
    for hf_name, value in sorted(load_file(str(hf_dir / "model.safetensors")).items()):
        name, transpose = _google_name(hf_name)
        names.append(name)
        tensors.append(tf.constant(value.T if transpose else value))
    tf.raw_ops.SaveV2(
        prefix=str(dest / "bert_model.ckpt"),
        tensor_names=names,
        shape_and_slices=[""] * len(names),
        tensors=tensors,
    )
    return dest
