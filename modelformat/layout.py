"""The model-version layout on disk: directory names, files, model.json.

Contract 1 of docs/architecture.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

_VERSION_RE = re.compile(r"^\d+$")

SAVED_MODEL_FILE = "saved_model.pb"
MODEL_JSON = Path("assets") / "model.json"
VOCAB_TXT = Path("assets") / "vocab.txt"
LABELS_TXT = Path("assets") / "labels.txt"
WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"


def parse_version(name: str) -> int | None:
    """Return the version number a directory name stands for, or None for non-numeric names.

    TF Serving ignores non-numeric children (``.tmp-3``, ``v1``, ``0.1``), which is what makes
    publishing through a temporary sibling directory safe.
    """
    return int(name) if _VERSION_RE.match(name) else None


def list_versions(model_dir: str | Path) -> list[int]:
    """Return the complete versions (numeric dirs with ``saved_model.pb``), ascending."""
    base = Path(model_dir)
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        version = parse_version(child.name)
        if version is not None and (child / SAVED_MODEL_FILE).is_file():
            found.append(version)
    return sorted(found)


def numbered_entries(model_dir: str | Path) -> list[int]:
    """Return every numeric name under ``model_dir`` (complete or not), ascending."""
    base = Path(model_dir)
    found = [parse_version(p.name) for p in base.iterdir()] if base.is_dir() else []
    return sorted(v for v in found if v is not None)


def next_version(model_dir: str | Path) -> int:
    """Return one more than the highest numeric name under ``model_dir`` (complete or not).

    Incomplete numeric names count: a version directory being copied in by hand must not be
    given the same number.
    """
    taken = numbered_entries(model_dir)
    return (taken[-1] + 1) if taken else 1


def latest_version(model_dir: str | Path) -> int | None:
    """Return the newest complete version under ``model_dir``, or None."""
    versions = list_versions(model_dir)
    return versions[-1] if versions else None


def version_dir(model_dir: str | Path, version: int) -> Path:
    """Return the directory of ``version`` under ``model_dir`` (whether or not it exists)."""
    return Path(model_dir) / str(version)


def read_model_info(version_path: str | Path) -> dict[str, Any] | None:
    """Return the parsed ``assets/model.json`` of a version directory, or None if it has none."""
    path = Path(version_path) / MODEL_JSON
    if not path.is_file():
        return None
    info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return info
