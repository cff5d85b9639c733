"""The naming rules: which model names and version labels the format accepts."""

from __future__ import annotations

import re

# A model name is a directory name and a URL path segment: no separators, no dot-dot.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # and no ".." (valid_model_name)
_MODEL_NAME_RE = re.compile(MODEL_NAME_PATTERN)
MODEL_NAME_RULE = "must be 1-128 letters, digits, '_', '-', '.', starting with a letter or digit"
# TF Serving's REST route takes a label as ``/labels/<label>`` (no '/' or ':'), and a label that
# is all digits would read as a version number: labels start with a letter.
LABEL_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,127}$"
_LABEL_RE = re.compile(LABEL_PATTERN)
LABEL_RULE = "must be 1-128 letters, digits, '_', '-', '.', starting with a letter"


def valid_model_name(name: str) -> bool:
    """Return True when ``name`` is a safe model directory name (no path tricks)."""
    return bool(_MODEL_NAME_RE.fullmatch(name)) and ".." not in name


def valid_label(label: str) -> bool:
    """Return True when ``label`` is a version label TF Serving's REST routes can address."""
    return bool(_LABEL_RE.fullmatch(label))
