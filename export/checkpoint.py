"""Read BERT-family checkpoints (HF directory of a supported architecture, or Google's TF BERT
checkpoint) into one canonical form.

The canonical form is a dict of float32 numpy arrays with kernels laid out ``[in, out]`` (the
TensorFlow matmul layout), so the model builder never needs to know where the weights came from.
Every inconsistency raises ``ExportError`` naming the file or tensor before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from export.architectures import SUPPORTED_ACTIVATIONS as SUPPORTED_ACTIVATIONS
from export.architectures import architecture, config_from, supported
from export.architectures import tensor_names as architecture_tensor_names
from export.calibration import checked_calibration
from export.config import BertConfig
from export.errors import ExportError
from export.names import TensorName, tensor_names
from export.tokenizer_assets import TokenizerAssets, read_tokenizer

HEAD_KEYS = ("architectures", "problem_type", "thresholds", "text_pair")


@dataclass
class Checkpoint:
    """Weights, vocabulary and metadata of one checkpoint, in canonical names."""

    config: BertConfig
    weights: dict[str, np.ndarray]
    vocab: list[str]
    do_lower_case: bool
    labels: list[str]
    has_head: bool
    source: dict[str, str] = field(default_factory=dict)
    # config.json's "early_exits" (pooling, width, per-layer agreement) when every student's
    # weights are present (finetune distill-exits wrote them), else None
    exits: dict[str, Any] | None = None
    # what config.json says of the head (Hugging Face checkpoints; Google ones say nothing):
    # ``architectures``, ``problem_type``, ``thresholds`` (label -> float), ``text_pair``
    head_config: dict[str, Any] = field(default_factory=dict)
    # the checkpoint's tokenizer.json (or the one built from its vocab.txt), for the assets
    tokenizer: TokenizerAssets | None = None


def read_checkpoint(
    path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    do_lower_case: bool | None = None,
) -> Checkpoint:
    """Return the checkpoint at ``path`` (HF directory, Google directory or Google ckpt prefix)."""
    path = Path(path)
    if path.is_dir() and (path / "config.json").is_file():
        return _read_hf(path, labels, do_lower_case)
    if path.is_dir() and (path / "bert_config.json").is_file():
        return _read_google(path, _google_prefix(path), labels, do_lower_case)
    if not path.is_dir() and Path(f"{path}.index").is_file():
        return _read_google(path.parent, path, labels, do_lower_case)
    if not path.exists():
        raise ExportError(f"checkpoint not found: {path}")
    raise ExportError(
        f"{path}: not a checkpoint (expected config.json + model.safetensors of one of "
        f"{', '.join(supported())}, or bert_config.json + bert_model.ckpt.* + vocab.txt)"
    )


def read_labels_file(path: str | Path) -> list[str]:
    """Return the labels of a file with one label per line (blank lines skipped)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot read labels file {path}: {exc}") from exc
    labels = [line.strip() for line in lines if line.strip()]
    if not labels:
        raise ExportError(f"labels file {path} has no labels")
    return labels


def _layer_norm_aliases(name: str) -> tuple[str, ...]:
    """Return older spellings of a LayerNorm tensor name (``gamma``/``beta`` before 2020)."""
    if name.endswith("LayerNorm.weight"):
        return (name[: -len("weight")] + "gamma",)
    if name.endswith("LayerNorm.bias"):
        return (name[: -len("bias")] + "beta",)
    return ()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ExportError(f"missing file: {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ExportError(f"{path}: expected a JSON object")
    return data


def _config_from(data: dict[str, Any], path: Path, *, google: bool = False) -> BertConfig:
    """Return the encoder config of a config.json (any supported architecture; Google: BERT)."""
    if google and data.get("model_type", "bert") != "bert":
        raise ExportError(f"{path}: a Google TF checkpoint is BERT (model_type 'bert')")
    return config_from(data, path)


def _sha256(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _collect(
    config: BertConfig,
    names: list[TensorName],
    fetch: Any,
    where: str,
) -> dict[str, np.ndarray]:
    """Return canonical weights fetched with ``fetch(spec) -> (name, array | None)``, checked."""
    weights: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    bound: dict[str, int] = {}  # symbolic dims ("labels") take the size first seen
    for spec in names:
        name, value = fetch(spec)
        sources[spec.canonical] = name
        if value is None:
            if spec.optional:
                continue
            raise ExportError(f"{where}: missing tensor {name}")
        value = np.asarray(value)
        got = tuple(reversed(value.shape)) if spec.transposed else tuple(value.shape)
        expected = tuple(bound.setdefault(d, n) if isinstance(d, str) else d
                         for d, n in zip(spec.shape, got, strict=False))  # fmt: skip
        if got != expected or len(got) != len(spec.shape):
            stored = tuple(reversed(expected)) if spec.transposed else expected
            raise ExportError(
                f"{where}: tensor {name} has shape {list(value.shape)}, expected {list(stored)}"
            )
        value = value.T if spec.transposed else value
        weights[spec.canonical] = np.ascontiguousarray(value, dtype=np.float32)
    for prefix in ("pooler", "classifier"):  # a head is all there or not there
        kernel, bias = f"{prefix}/kernel", f"{prefix}/bias"
        if bias in sources and (kernel in weights) != (bias in weights):
            missing = bias if kernel in weights else kernel
            raise ExportError(f"{where}: missing tensor {sources[missing]}")
    students = [n for n in sources if n.startswith("exit_")]
    present = [n for n in students if n in weights]
    if present and len(present) != len(students):  # the students are all there or none
        missing = next(n for n in students if n not in weights)
        raise ExportError(f"{where}: missing tensor {sources[missing]} (early-exit students)")
    return weights


def _resolve_labels(
    given: Sequence[str] | None, from_config: list[str], width: int | None, where: str
) -> list[str]:
    labels = list(given) if given is not None else from_config
    bad = [label for label in labels if not label.strip() or "\n" in label or "\r" in label]
    if bad:
        raise ExportError(f"labels must be non-empty single-line strings, got {bad}")
    if len(set(labels)) != len(labels):
        raise ExportError(f"labels must be unique, got {labels}")
    if width is not None and labels and len(labels) != width:
        raise ExportError(
            f"{where}: {len(labels)} labels {labels} but the classifier head has {width} outputs"
        )
    return labels


def read_bf16_tensor(path: Path, name: str) -> np.ndarray:
    """Return a BF16 tensor of a safetensors file as float32 (the numpy loader cannot).

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
    shape and byte offsets, then the data; bfloat16 is the top half of a float32.
    """
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        entry = json.loads(fh.read(header_len))[name]
        if entry["dtype"] != "BF16":
            raise ExportError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        fh.seek(8 + header_len + begin)
        raw = np.frombuffer(fh.read(end - begin), dtype="<u2")
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _read_hf(path: Path, labels: Sequence[str] | None, lower: bool | None) -> Checkpoint:
    from safetensors import safe_open  # lazy: keeps `import export.checkpoint` light

    config_path = path / "config.json"
    data = _read_json(config_path)
    config = _config_from(data, config_path)
    base = architecture(config.model_type).prefix
    weights_path = path / "model.safetensors"
    if not weights_path.is_file():
        other = sorted(p.name for p in path.glob("*.bin"))
        hint = (
            f" (found {other}: a torch pickle, which export never loads; re-save the model with "
            "safetensors, e.g. model.save_pretrained(dir, safe_serialization=True), where torch "
            "is installed)"
            if other
            else ""
        )
        raise ExportError(f"missing weights file: {weights_path}{hint}")
    try:
        with safe_open(str(weights_path), framework="numpy") as handle:
            keys = set(handle.keys())
            # a task checkpoint keeps the encoder under the base prefix, a base model has none
            prefix = base if any(k.startswith(base) for k in keys) else ""

            def fetch(spec: TensorName) -> tuple[str, np.ndarray | None]:
                name = spec.source if spec.head else prefix + spec.source
                for candidate in (name, *_layer_norm_aliases(name)):
                    if candidate in keys:
                        try:
                            return candidate, np.asarray(handle.get_tensor(candidate))
                        except TypeError:  # numpy has no bfloat16
                            return candidate, read_bf16_tensor(weights_path, candidate)
                return name, None

            weights = _collect(config, architecture_tensor_names(config), fetch, str(weights_path))
    except ExportError:
        raise
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise ExportError(f"cannot read {weights_path}: {exc}") from exc
    tokenizer = read_tokenizer(path, weights["embeddings/word"].shape[0], lower)
    has_head = "classifier/kernel" in weights
    id2label = data.get("id2label") or {}
    try:
        config_labels = [str(id2label[k]) for k in sorted(id2label, key=int)] if has_head else []
    except ValueError as exc:
        raise ExportError(f"{config_path}: id2label keys must be integers") from exc
    width = weights["classifier/kernel"].shape[1] if has_head else None
    return Checkpoint(
        config=config,
        weights=weights,
        vocab=tokenizer.vocab,
        do_lower_case=tokenizer.do_lower_case,
        labels=_resolve_labels(labels, config_labels, width, str(config_path)),
        has_head=has_head,
        source={"format": "hf", "path": str(path.resolve()), "sha256": _sha256([weights_path])},
        exits=_exits(data, weights, config_path),
        head_config={k: data[k] for k in HEAD_KEYS if data.get(k) is not None},
        tokenizer=tokenizer,
    )


def _exits(data: dict[str, Any], weights: dict[str, np.ndarray], where: Path) -> dict | None:
    """Return config.json's ``early_exits`` when the students' weights are there, else None."""
    have = "exit_0/dense/kernel" in weights
    entry = data.get("early_exits")
    if not have:
        return None
    if not isinstance(entry, dict):
        raise ExportError(f"{where}: model.safetensors has early-exit students but config.json "
                          "has no \"early_exits\" entry")  # fmt: skip
    if "classifier/kernel" not in weights:
        raise ExportError(f"{where}: early-exit students without a trained classifier head")
    pooling = entry.get("pooling", "mean")
    if pooling not in ("mean", "cls"):
        raise ExportError(f"{where}: early_exits.pooling must be mean or cls, got {pooling!r}")
    calibration = checked_calibration(entry.get("calibration"), where)
    return {**entry, "pooling": pooling, **({"calibration": calibration} if calibration else {})}


def _google_prefix(path: Path) -> Path:
    import tensorflow as tf  # the checkpoint reader is TensorFlow's

    latest = tf.train.latest_checkpoint(str(path))
    if latest:
        return Path(latest)
    indexes = sorted(path.glob("*.index"))
    if len(indexes) == 1:
        return indexes[0].with_suffix("")
    if not indexes:
        raise ExportError(f"{path}: no checkpoint (*.ckpt.index) next to bert_config.json")
    raise ExportError(f"{path}: several checkpoints {[p.name for p in indexes]}; pass one prefix")


def _read_google(
    path: Path, prefix: Path, labels: Sequence[str] | None, lower: bool | None
) -> Checkpoint:
    import tensorflow as tf

    config_path = path / "bert_config.json"
    config = _config_from(_read_json(config_path), config_path, google=True)
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        shapes = reader.get_variable_to_shape_map()

        def fetch(spec: TensorName) -> tuple[str, np.ndarray | None]:
            found = spec.source in shapes
            return spec.source, reader.get_tensor(spec.source) if found else None

        weights = _collect(config, tensor_names(config, "google"), fetch, str(prefix))
    except ExportError:
        raise
    except Exception as exc:  # tf.errors.* for missing or corrupt shards
        raise ExportError(f"cannot read checkpoint {prefix}: {exc}") from exc
    rows = weights["embeddings/word"].shape[0]
    tokenizer = read_tokenizer(path, rows, True if lower is None else lower)
    has_head = "classifier/kernel" in weights
    width = weights["classifier/kernel"].shape[1] if has_head else None
    if has_head and labels is None:
        labels = [f"LABEL_{i}" for i in range(width or 0)]
    files = sorted(path.glob(f"{prefix.name}.*"))
    return Checkpoint(
        config=config,
        weights=weights,
        vocab=tokenizer.vocab,
        do_lower_case=tokenizer.do_lower_case,
        labels=_resolve_labels(labels, [], width, str(prefix)) if has_head else [],
        has_head=has_head,
        source={"format": "google", "path": str(prefix.resolve()), "sha256": _sha256(files)},
        tokenizer=tokenizer,
    )
