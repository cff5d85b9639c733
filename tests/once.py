"""Session artifacts built once per run, not once per xdist worker (exports of tiny models).

Each xdist worker runs its own session fixtures, so a fixture that exports models ran once per
worker: the same CPU spent twice for the same bytes. ``built_once`` builds under the run's
shared temporary root, behind a file lock: the first worker to ask builds, the others wait for
it, and each gets its own copy (a test may add versions to it). A bare ``pytest`` builds in
place.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """Return a new directory of this worker holding what ``build`` wrote into the (empty)
    directory it was given, ``build`` having run once in the whole run for ``name``."""
    own = factory.mktemp(name)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        build(own)
        return own
    shared = factory.getbasetemp().parent / "built-once"  # the run's root: every worker's
    shared.mkdir(exist_ok=True)
    done = shared / name
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.is_dir():
            partial = shared / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            partial.rename(done)
    shutil.copytree(done, own, dirs_exist_ok=True, symlinks=True)
    return own
