"""Pure lifecycle rules: version discovery, version policies, availability-preserving choices."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from modelformat.layout import parse_version

log = logging.getLogger(__name__)

START, LOADING, AVAILABLE, UNLOADING, END = 10, 20, 30, 40, 50
STATE_NAMES = {
    0: "UNKNOWN",
    10: "START",
    20: "LOADING",
    30: "AVAILABLE",
    40: "UNLOADING",
    50: "END",
}


def list_version_dirs(base_path: str) -> dict[int, str] | None:
    """Return {version: dir} for the numeric children of ``base_path``; None if it is missing.

    Non-numeric names (``.tmp-3``, ``v1``) are ignored, as TF Serving's storage path source does;
    of duplicates parsing to the same number (``1`` and ``001``) the first name in order wins.
    """
    try:
        names = sorted(os.listdir(base_path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    found: dict[int, str] = {}
    for name in names:
        version = parse_version(name)
        if version is None or not os.path.isdir(os.path.join(base_path, name)):
            continue
        if version in found:
            log.warning("Duplicate version directories detected: %s/%s", base_path, name)
            continue
        found[version] = os.path.join(base_path, name)
    return found


def aspired_versions(policy: Any, on_disk: Iterable[int]) -> set[int]:
    """Return the versions a ServableVersionPolicy aspires to, given the versions on disk."""
    available = sorted(on_disk)
    choice = policy.WhichOneof("policy_choice") if policy is not None else None
    if choice == "all":
        return set(available)
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return wanted & set(available)
    count = 1
    if choice == "latest" and policy.latest.num_versions > 0:
        count = policy.latest.num_versions
    return set(available[-count:]) if available else set()


def versions_to_unload(ready: set[int], aspired: set[int]) -> list[int]:
    """Return ready versions to unload now, lowest first, under AvailabilityPreservingPolicy.

    An un-aspired ready version goes only when another ready version keeps the model
    available, or when an aspired version is already ready.
    """
    unaspired = sorted(ready - aspired)
    out: list[int] = []
    remaining = set(ready)
    for version in unaspired:
        others_ready = remaining - {version}
        if not others_ready and not (aspired & remaining):
            continue
        out.append(version)
        remaining.discard(version)
    return out
