"""One comparison of JSON answers for the result cache's tests: the same answer up to the last
bits of its floats (a text computed alone or in another batch: backend/cache.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest


def assert_alike(got: bytes, want: bytes, why: Any) -> None:
    """Assert two JSON answers are one answer up to the last bits of their floats."""

    def alike(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(alike(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(alike(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, float) or isinstance(b, float):
            return bool(a == pytest.approx(b, rel=1e-5, abs=1e-6))
        return bool(a == b)

    assert alike(orjson.loads(got), orjson.loads(want)), (why, got, want)
