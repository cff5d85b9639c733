"""``inspect`` and ``verify``: what a published version holds, and how far two versions differ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from export.errors import ExportError
from export.gates import Tolerance, measure, within
from modelformat.heads import head_from_info
from modelformat.layout import SAVED_MODEL_FILE, VOCAB_TXT, WARMUP_FILE, read_model_info
from modelformat.publish import tree_size


def _require_version(path: Path) -> None:
    if not (path / SAVED_MODEL_FILE).is_file():
        raise ExportError(f"{path}: not a model version (no {SAVED_MODEL_FILE})")


def _signature(path: Path) -> dict[str, Any]:
    """Return serving_default's inputs/outputs as ``{name: "dtype[shape]"}`` from saved_model.pb."""
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        proto = saved_model_pb2.SavedModel.FromString((path / SAVED_MODEL_FILE).read_bytes())
        sig = proto.meta_graphs[0].signature_def["serving_default"]
    except Exception as exc:  # a corrupt or foreign saved_model.pb
        raise ExportError(f"{path / SAVED_MODEL_FILE}: cannot read serving_default: {exc}") from exc

    def describe(info: Any) -> str:
        dims = ["?" if d.size < 0 else str(d.size) for d in info.tensor_shape.dim]
        return f"{tf.dtypes.as_dtype(info.dtype).name}[{', '.join(dims)}]"

    return {
        "inputs": {k: describe(v) for k, v in sorted(sig.inputs.items())},
        "outputs": {k: describe(v) for k, v in sorted(sig.outputs.items())},
    }


def inspect_version(path: str | Path) -> dict[str, Any]:
    """Return a version's signature, model.json, sizes and warmup record count."""
    path = Path(path)
    _require_version(path)
    info = read_model_info(path) or {}
    warmup = path / WARMUP_FILE
    records = 0
    if warmup.is_file():
        from export.warmup import read_warmup_inputs

        records = len(read_warmup_inputs(path))
    return {
        "path": str(path),
        "signature": _signature(path),
        "model": info,
        "size_bytes": tree_size(path),
        "variables_bytes": tree_size(path / "variables"),
        "warmup_records": records,
    }


def _probe_for(path: Path, info: dict[str, Any], vocab_size: int) -> dict[str, np.ndarray]:
    """Return a probe batch using ids both versions know and this version's [CLS]/[SEP]."""
    from export.build import special_ids
    from export.warmup import token_batch

    vocab_file = path / VOCAB_TXT
    vocab = vocab_file.read_text(encoding="utf-8").splitlines() if vocab_file.is_file() else []
    cls_id, sep_id = special_ids(vocab)
    seq = min(64, int(info.get("max_seq_len", 64)))
    # speed 0 for an early-exit version: the full model, comparable with any other version
    speed = 0.0 if "early_exit" in info else None
    return token_batch(8, seq, vocab_size, cls_id, sep_id, seed=99, speed=speed)


def verify_version(
    path: str | Path,
    against: str | Path | None = None,
    tolerance: Tolerance | None = None,
) -> dict[str, Any]:
    """Run a version on its warmup records (and a probe batch ``against`` another version).

    Returns the figures: output shapes checked, all values finite, and with ``against`` the
    differences from that version plus ``within_tolerance``.
    """
    from export.predictor import PersistentPredictor

    path = Path(path)
    _require_version(path)
    predictor = PersistentPredictor(path)
    info = predictor.model_info or {}
    out: dict[str, Any] = {"path": str(path), "load_time_s": round(predictor.load_time_s, 3)}
    from export.warmup import read_warmup_records

    batches = read_warmup_records(path)
    finite = True
    for signature, feeds in batches:
        result = predictor.predict(feeds, signature)
        finite = finite and all(np.isfinite(v).all() for v in result.values())
    out.update({"warmup_records_run": len(batches), "all_finite": finite})
    if against is not None:
        other_path = Path(against)
        _require_version(other_path)
        other = PersistentPredictor(other_path)
        other_info = other.model_info or {}
        if info.get("outputs") != other_info.get("outputs"):
            raise ExportError(
                f"{path} and {other_path} have different outputs: "
                f"{info.get('outputs')} vs {other_info.get('outputs')}"
            )
        vocab = min(int(info.get("vocab_size", 100)), int(other_info.get("vocab_size", 100)))
        probe = _probe_for(path, info, vocab)
        scale = info.get("zero_shot_scale") if info.get("zero_shot") else None
        figures = measure(other.predict(probe), predictor.predict(probe), scale,
                          head=head_from_info(info), labels=info.get("labels") or [],
                          attention_mask=probe["attention_mask"])  # fmt: skip
        out.update({"against": str(other_path), **figures})
        out["within_tolerance"] = within(figures, tolerance or Tolerance())
    return out
