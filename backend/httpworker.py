"""gunicorn's gthread worker, with keep-alive connections served on in the thread that has them.

gunicorn's ``ThreadWorker`` sends every request of a keep-alive connection across two threads:
the poller hands the readable socket to a pool thread (a Future, a queue put), the pool thread
answers and hands the connection back (a done-callback, a queue and a pipe write that wake the
poller, which re-registers the socket with epoll), and the poller waits for the next request.
Measured on the gateway, that round trip was about 40 % of the worker's Python time per
one-text request. ``LingeringThreadWorker`` keeps that design for idle connections and new
ones, and adds one thing: after an answer that keeps the connection alive, the pool thread
waits on that socket itself for the connection's next request and serves it directly, as long
as another pool thread stays free for other connections (so a new connection never waits for a
lingering one) and at most ``keepalive`` seconds (gunicorn's own idle limit, after which the
connection is closed, as gthread closes it). When the pool gets busy, or the worker stops, the
connection goes back to the poller exactly as before.
"""

from __future__ import annotations

import select
import threading
import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

# How often a lingering thread looks up from its socket to check whether the pool still has a
# free thread and the worker is still running: the longest a new connection can wait for a
# thread when every other one lingers.
LINGER_SLICE_S = 0.01


class LingeringThreadWorker(ThreadWorker):
    """``gthread`` whose pool threads serve a keep-alive connection's next request directly."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._busy = 0  # pool threads inside handle(), lingering ones included
        self._busy_lock = threading.Lock()

    def handle(self, conn: Any) -> Any:
        """Serve ``conn``'s request, then its next ones while they come soon enough."""
        with self._busy_lock:
            self._busy += 1
        try:
            keep = super().handle(conn)
            while keep is True:
                came = self._linger(conn)
                if came is None:
                    break  # the pool got busy, or a stop: the poller's keep-alive from now
                if not came:
                    return False  # quiet for keepalive seconds: closed, as gthread closes it
                keep = super().handle(conn)
            return keep
        finally:
            with self._busy_lock:
                self._busy -= 1

    def _linger(self, conn: Any) -> bool | None:
        """Wait on ``conn`` for its next request while lingering is free: True when it came,
        False when it stayed quiet for ``keepalive`` seconds, None when lingering must stop."""
        if conn.is_http2:
            return None  # gunicorn serves an HTTP/2 connection's streams in one handle()
        if conn.parser.unreader.buf.getvalue():
            return True  # read ahead already (a pipelined request or a drained body's excess)
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        deadline = time.monotonic() + self.cfg.keepalive
        while self.alive and self._busy < self.cfg.threads:
            if poller.poll(LINGER_SLICE_S * 1000):
                return True
            if time.monotonic() >= deadline:
                return False
        return None
