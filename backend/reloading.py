"""A small file the gateway re-reads while it runs (models.config's labels, the API keys).

One rule for both: the file's bytes are read every ``recheck_s`` (not only when ``stat()`` says it
changed: NFS/EFS cache attributes for up to ~60 s, while ``open()`` revalidates) and parsed only
when their hash changes; a file that can't be read or parsed keeps the last good value, counts in
``errors``, sets ``stale`` to 1 and is logged once per distinct failure.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class ReloadingFile(Generic[T]):
    """The parsed content of ``path``, at most ``recheck_s`` old (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        parse: Callable[[bytes], T],
        empty: T,
        *,
        recheck_s: float,
        what: str,
        errors: Any,
        stale: Any,
        logger: logging.Logger = log,
    ) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._parse = parse
        self._value = empty
        self._what = what
        self._errors = errors
        self._stale = stale
        self._log = logger
        self._digest: bytes | None = None
        self._checked = -float("inf")
        self._failing: str | None = None
        self._lock = threading.Lock()

    @property
    def value(self) -> T:
        """The value as last parsed (no re-read)."""
        return self._value

    def get(self) -> T:
        """Return the current value, re-reading the file when ``recheck_s`` has passed."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked < self.recheck_s:
                return self._value
            self._checked = now
            try:
                data = self.path.read_bytes()
                digest = hashlib.blake2b(data, digest_size=16).digest()
                if digest != self._digest:
                    self._value = self._parse(data)
                    self._digest = digest
            except (OSError, ValueError) as exc:  # UnicodeDecodeError and parse errors included
                self._failed(str(exc))
            else:
                self._recovered()
            return self._value

    def refresh(self) -> None:
        """Re-read the file on the next ``get``, whatever ``recheck_s`` says."""
        with self._lock:
            self._checked = -float("inf")

    def _failed(self, error: str) -> None:
        self._errors.inc()
        if error != self._failing:  # once per distinct failure, not once per recheck
            self._log.warning("%s %s is unreadable (%s); keeping the last good one",
                              self._what, self.path, error)  # fmt: skip
            self._stale.set(1)
        self._failing = error

    def _recovered(self) -> None:
        if self._failing is not None:
            self._log.warning("%s %s is readable again", self._what, self.path)
            self._stale.set(0)
        self._failing = None
