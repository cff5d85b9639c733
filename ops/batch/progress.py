"""The batch job's progress on stderr: rows done, rows/s and the time left.

On a terminal one line redrawn in place (a bar); otherwise a plain line every ``every_s``
seconds, as logs and CI want: written by a timer of its own (``start``), so that the line comes
even while a slow call holds the job (rows are counted as each call is answered).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


class Progress:
    """Rows done out of ``total``, their rate and the time left, written to ``stream``."""

    def __init__(
        self, total: int, done: int = 0, stream: TextIO | None = None, every_s: float = 5.0
    ) -> None:
        self.total = total
        self.done = done
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if not self.tty else 0.2
        self.started = time.monotonic()
        self.start_done = done
        self.shown = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None

    def start(self) -> None:
        """Write the line every ``every_s`` seconds, whatever the calls do, until ``close``."""

        def tick() -> None:
            while not self._stop.wait(self.every_s):
                self.show()

        self._timer = threading.Thread(target=tick, name="batch-progress", daemon=True)
        self._timer.start()

    def add(self, rows: int) -> None:
        """Count ``rows`` more done and show the line when it is time."""
        self.done += rows
        now = time.monotonic()
        if self._timer is None and now - self.shown >= self.every_s:
            self.shown = now
            self.show()

    def line(self) -> str:
        """Return the progress line: done/total, percent, rows/s, time left."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (self.done - self.start_done) / elapsed
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        share = self.done / self.total if self.total else 1.0
        eta = "?" if left == float("inf") else _clock(left)
        text = f"{self.done}/{self.total} rows {share:6.1%} {rate:8.1f} rows/s  {eta} left"
        if self.tty:
            filled = int(share * 30)
            text = f"[{'#' * filled}{'.' * (30 - filled)}] {text}"
        return text

    def show(self) -> None:
        """Write the line (in place on a terminal)."""
        with self._lock:
            if self.tty:
                self.stream.write("\r" + self.line())
            else:
                self.stream.write(self.line() + "\n")
            self.stream.flush()

    def close(self) -> None:
        """Stop the timer; write the last line."""
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
        self.show()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
