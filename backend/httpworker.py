"""gunicorn's gthread worker, hardened against clients that send slowly or never close, and
with keep-alive connections served on in the thread that has them.

``GuardedThreadWorker`` is gthread with three rules for hostile or merely idle clients:

- A pool thread never waits for a client. A connection is handed to a thread only when a whole
  request has arrived: its head, and its body when the head announces one of at most the app's
  body limit (``Content-Length`` or chunked). Until then the connection waits on the worker's
  poller, not in a thread; each time it is readable a thread reads what has come without
  blocking and gives it back. gthread reads a request blocking, with no timeout, once its first
  byte has come: one client per pool thread sending half a request line froze a worker.
- A request must arrive in time: its head within ``header_timeout_s`` of its first byte, its
  body within ``body_timeout_s`` of the head's end. Past that the client gets
  ``408 Request Timeout`` with ``Connection: close`` (RFC 9110 section 15.5.9) and the
  connection is closed. A connection that sends nothing at all is closed silently after
  gunicorn's ``keepalive``, as gthread closes an idle one. What a thread still reads or writes
  blocking (a body behind ``Expect: 100-continue``, the answer) has ``body_timeout_s`` per
  socket operation.
- Closing never waits on the worker's main loop. gthread closes a connection whose answer said
  ``close`` with ``close_graceful``, which waits up to 2 s for the client's FIN on the loop that
  accepts and dispatches every connection: pooled clients (requests, httpx, so the OpenAI and
  Cohere SDKs) do not send one, and each such close stalled the worker. Here the write side is
  shut and the socket waits for the client's FIN on the poller (at most
  ``CLOSE_LINGER_S``) while the loop goes on.

``LingeringThreadWorker`` adds one thing: after an answer that keeps the connection alive, the
pool thread waits on that socket itself for the connection's next request and serves it
directly, as long as another pool thread stays free for other connections (so a new
connection never waits for a lingering one) and at most ``keepalive`` seconds (gunicorn's own
idle limit, after which the thread closes the connection itself, at once, as gthread's poller
closes an idle one). gthread's round trip per keep-alive request (a Future, a done-callback, a
queue and a pipe write that wake the poller, which re-registers the socket) was about 40 % of
the worker's Python time per one-text request. When the pool gets busy, or the worker stops,
the connection goes back to the poller as before; a request already sent on it is then
answered (with ``Connection: close`` when stopping), never dropped.

Only plain HTTP/1 is guarded: with TLS or cleartext HTTP/2 configured the worker is gthread's.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import os
import select
import selectors
import socket
import threading
import time
from typing import Any

from gunicorn import util
from gunicorn.workers.gthread import TConn, ThreadWorker

# A lingering thread waits on its socket and on the worker's wake pipe, which is readable while
# the pool has no free thread or the worker stops: it sleeps until one of them stirs, not in
# 10 ms slices (with 30 threads lingering on idle pooled connections, 3,000 wake-ups a second,
# each taking the GIL from the requests being served). It still looks up this often, in case
# the worker stopped by a path that wakes no one (its parent gone).
LINGER_CHECK_S = 1.0
# How long a closed connection's socket waits for the client's FIN after the server's, reading
# and dropping what the client still sends (so the kernel does not answer it with a reset that
# could cut off the last answer): gunicorn's close_graceful waits as long, but blocking.
CLOSE_LINGER_S = 2.0
CLOSE_DRAIN_BYTES = 65536
READ_BYTES = 65536
MAX_READ_BYTES = 1 << 22  # one recv() of a body's rest, at most

# handle()'s results besides gthread's True (keep-alive) and False (close):
WAIT = "wait"  # the request is not whole yet: the poller waits for more, a thread does not
GONE = "gone"  # the thread closed the connection itself (quiet for keepalive)

TIMEOUT_BODY = (
    b'{"error": {"code": "request_timeout", "message": '
    b'"the request did not arrive in time (its head, or its body, took too long)"}}'
)
TIMEOUT_ANSWER = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(TIMEOUT_BODY)
    + TIMEOUT_BODY
)


def request_complete(data: bytes, max_head: int, max_body: int) -> bool:
    """Whether ``data`` holds a whole request that a thread can serve without waiting.

    True also when gunicorn or the app will refuse the request without reading more (a head or
    a body over its limit, a malformed length) and for ``Expect: 100-continue`` once the head
    is in (the client waits for the 100 before it sends the body).
    """
    start = len(data) - len(data.lstrip(b"\r\n"))  # empty lines before a request are allowed
    end = data.find(b"\r\n\r\n", start)
    if end < 0:
        return len(data) - start > max_head
    length, chunked = 0, False
    for line in data[start:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            if not value.isdigit():
                return True
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"expect" and value == b"100-continue":
            return True
    body = data[end + 4 :]
    if chunked:
        return chunked_complete(body, max_body)
    return length > max_body or len(body) >= length


def request_end(data: bytes) -> int | None:
    """Return how many bytes of ``data`` the request at its start takes, head and body, when its
    head is in and announces a body by ``Content-Length`` alone (None otherwise: no head yet,
    chunked, ``Expect``, a malformed length): the rest of it is then counted, not parsed."""
    start = len(data) - len(data.lstrip(b"\r\n"))
    end = data.find(b"\r\n\r\n", start)
    if end < 0:
        return None
    length = 0
    for line in data[start:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if name == b"content-length" and value.isdigit():
            length = int(value)
        elif name in (b"content-length", b"transfer-encoding", b"expect"):
            return None
    return end + 4 + length


def chunked_complete(body: bytes, max_body: int) -> bool:
    """Whether a chunked ``body`` has come to its last chunk and trailers (or past the limit)."""
    pos = 0
    while True:
        line_end = body.find(b"\r\n", pos)
        if line_end < 0:
            return len(body) > max_body
        try:
            size = int(body[pos:line_end].split(b";")[0].strip(), 16)
        except ValueError:
            return True  # malformed: gunicorn refuses it
        if size == 0:
            rest = body[line_end + 2 :]
            return rest.startswith(b"\r\n") or b"\r\n\r\n" in rest or len(body) > max_body
        pos = line_end + 2 + size + 2
        if pos > len(body):
            return len(body) > max_body


class GuardedThreadWorker(ThreadWorker):
    """gthread whose threads serve only whole requests, with read deadlines, closing off-loop."""

    # set from GATEWAY_HEADER_TIMEOUT_S / GATEWAY_BODY_TIMEOUT_S and the app's body limit by
    # docker/gunicorn.conf.py's post_fork
    header_timeout_s = 10.0
    body_timeout_s = 10.0
    max_body_bytes = 1_048_576

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._guarded = not self.cfg.is_ssl and self.cfg.http2_cleartext == "off"
        # connections waiting on the poller for (the rest of) a request, and closing ones:
        # heaps of (deadline, n, conn); an entry is current while conn.gw_entry is its n
        self._waiting: list[tuple[float, int, Any]] = []
        self._closing: list[tuple[float, int, Any]] = []
        self._entries = itertools.count()
        self._stop_deadline: float | None = None
        cfg = self.cfg
        self._max_head = (
            cfg.limit_request_line + 2 + cfg.limit_request_fields
            * (cfg.limit_request_field_size + 2) + 2
        )  # fmt: skip

    # -- a connection waits on the poller until its request is whole -----------------------

    def accept(self, listener: Any) -> None:
        """Accept a connection; it waits on the poller for its first bytes, not in a thread."""
        if not self._guarded:
            super().accept(listener)
            return
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())
        self._next_request(conn)
        self._wait(conn)

    @staticmethod
    def _next_request(conn: Any) -> None:
        """Start the clocks of ``conn``'s next request (none of its bytes have come)."""
        conn.gw_started = None  # monotonic time of the request's first byte
        conn.gw_head_done = None  # and of its head's end
        conn.gw_end = None  # its length in bytes once its head says (request_end)
        conn.gw_entry = None  # its current entry in a heap of the loop (waiting, closing)

    def _deadline(self, conn: Any) -> float:
        """When ``conn``'s current request must have come in whole (or, before its first byte,
        the end of gunicorn's keepalive)."""
        if conn.gw_head_done is not None:
            return float(conn.gw_head_done + self.body_timeout_s)
        if conn.gw_started is not None:
            return float(conn.gw_started + self.header_timeout_s)
        return time.monotonic() + self.cfg.keepalive

    def _wait(self, conn: Any) -> None:
        """Put ``conn`` on the poller until it is readable or its deadline passes."""
        conn.sock.setblocking(False)
        conn.gw_entry = next(self._entries)
        heapq.heappush(self._waiting, (self._deadline(conn), conn.gw_entry, conn))
        self.poller.register(conn.sock, selectors.EVENT_READ, lambda _sock: self._readable(conn))

    def _readable(self, conn: Any) -> None:
        self.poller.unregister(conn.sock)
        conn.gw_entry = None
        conn.data_ready = True
        self.enqueue_req(conn)

    def _fill(self, conn: Any) -> bool | str:
        """Read what has come on ``conn`` without waiting (in a pool thread): True when a whole
        request is buffered, WAIT when more must come, False when the client went away."""
        conn.init()
        if not hasattr(conn, "gw_started"):
            self._next_request(conn)
        unreader = conn.parser.unreader
        conn.sock.setblocking(False)
        while True:
            buf = unreader.buf
            buf.seek(0, 2)
            have = buf.tell()
            if conn.gw_end is not None:  # the head said how long: count, don't copy the body
                if have >= conn.gw_end:
                    return True
            else:
                data = buf.getvalue()
                now = time.monotonic()
                if data and conn.gw_started is None:
                    conn.gw_started = now
                if data and conn.gw_head_done is None and b"\r\n\r\n" in data.lstrip(b"\r\n"):
                    conn.gw_head_done = now
                if data and request_complete(data, self._max_head, self.max_body_bytes):
                    return True
                if conn.gw_head_done is not None:
                    conn.gw_end = request_end(data)
            wanted = READ_BYTES if conn.gw_end is None else conn.gw_end - have
            try:
                chunk = conn.sock.recv(min(max(wanted, READ_BYTES), MAX_READ_BYTES))
            except (BlockingIOError, InterruptedError):
                return WAIT
            except OSError:
                return False
            if not chunk:
                return False  # closed by the client before a whole request
            unreader.buf.seek(0, 2)
            unreader.buf.write(chunk)

    def handle(self, conn: Any) -> Any:
        """Serve ``conn``'s request once it is whole; until then give the connection back."""
        if not self._guarded or conn.is_http2:
            return super().handle(conn)
        try:
            ready = self._fill(conn)
        except Exception:  # a failed init or read: the connection closes
            return False
        if ready is not True:
            return ready
        try:
            return super().handle(conn)
        finally:
            self._next_request(conn)

    def handle_request(self, req: Any, conn: Any) -> Any:
        """gthread's, with every blocking socket operation bounded by ``body_timeout_s``."""
        if self._guarded:
            conn.sock.settimeout(self.body_timeout_s)
        return super().handle_request(req, conn)

    # -- the main loop: what handle() returns, deadlines, closing ---------------------------

    def finish_request(self, conn: Any, fs: Any) -> None:
        """gthread's, but a close never waits on this loop, and WAIT / GONE are understood."""
        try:
            result = fs.result() if not fs.cancelled() else False
        except Exception:  # gthread closes it too
            result = False
        if result == WAIT:
            self._wait(conn)
        elif result == GONE:
            self.nr_conns -= 1
        elif result is False:
            self._close_later(conn)
        else:
            super().finish_request(conn, fs)

    def _close_later(self, conn: Any) -> None:
        """Send FIN, then wait for the client's on the poller (not on this loop), then close."""
        sock = conn.sock
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
            self.poller.register(sock, selectors.EVENT_READ, lambda _s: self._drain(conn))
        except (OSError, ValueError, KeyError):
            util.close(sock)
            self.nr_conns -= 1
            return
        conn.gw_entry = next(self._entries)
        conn.gw_drained = 0
        deadline = time.monotonic() + CLOSE_LINGER_S
        heapq.heappush(self._closing, (deadline, conn.gw_entry, conn))

    def _drain(self, conn: Any) -> None:
        try:
            data = conn.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.gw_drained += len(data)
        if not data or conn.gw_drained > CLOSE_DRAIN_BYTES:
            self._closed(conn)

    def _closed(self, conn: Any) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        conn.gw_entry = None
        util.close(conn.sock)
        self.nr_conns -= 1

    def murder_pending(self) -> None:
        """gthread's, then the connections whose request is late, and closes that took too long."""
        super().murder_pending()
        now = time.monotonic()
        while self._closing and (self._closing[0][0] <= now or self._stop_deadline_passed(now)):
            _deadline, entry, conn = heapq.heappop(self._closing)
            if conn.gw_entry == entry:
                self._closed(conn)
        while self._waiting and self._waiting[0][0] <= now:
            _deadline, entry, conn = heapq.heappop(self._waiting)
            if conn.gw_entry == entry:
                self._expire(conn)
        if self._stop_deadline_passed(now):
            # stopping: connections that have sent nothing of a request go now, as gthread's
            # kept-alive ones do; a request already coming in keeps its deadline
            for _deadline, entry, conn in list(self._waiting):
                if conn.gw_entry == entry and getattr(conn, "gw_started", None) is None:
                    self._expire(conn)

    def _stop_deadline_passed(self, now: float) -> bool:
        return self._stop_deadline is not None and now >= self._stop_deadline

    def _expire(self, conn: Any) -> None:
        """Close a connection whose request did not come in time: 408 when part of one came."""
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)
        conn.gw_entry = None
        if getattr(conn, "gw_started", None) is None:
            util.close(conn.sock)  # idle: closed silently, as gthread closes an idle one
            self.nr_conns -= 1
            return
        self.log.info("request timeout: %s sent part of a request and stalled", conn.client)
        with contextlib.suppress(OSError):
            conn.sock.send(TIMEOUT_ANSWER)  # small: fits the socket's buffer, never blocks
        self._close_later(conn)

    def _cap_keepalive(self, deadline: float) -> None:
        """gthread's stop rule for kept-alive connections, for idle waiting ones too."""
        super()._cap_keepalive(deadline)
        self._stop_deadline = deadline

    def murder_keepalived(self, force: bool = False) -> None:
        super().murder_keepalived(force)
        if force:  # the worker is going: everything still open closes now
            for heap in (self._waiting, self._closing):
                while heap:
                    _deadline, entry, conn = heapq.heappop(heap)
                    if conn.gw_entry == entry:
                        self._closed(conn)


class LingeringThreadWorker(GuardedThreadWorker):
    """``GuardedThreadWorker`` whose pool threads serve a keep-alive connection's next request."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._busy = 0  # pool threads inside handle(), lingering ones included
        self._busy_lock = threading.Lock()
        # readable while lingering must stop: the pool is full, or the worker stops (made after
        # fork, in init_process: each worker its own)
        self._wake_r, self._wake_w = -1, -1
        self._woken = False  # a byte is in the pipe for a full pool (under _busy_lock)
        self._stopping = False

    def init_process(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        super().init_process()

    def _full(self, full: bool) -> None:
        """Make the wake pipe readable while the pool is full (call with ``_busy_lock`` held)."""
        if full == self._woken or self._stopping:
            return
        self._woken = full
        with contextlib.suppress(OSError):
            if full:
                os.write(self._wake_w, b"x")
            else:
                os.read(self._wake_r, 64)

    def _wake_for_stop(self) -> None:
        """Wake every lingering thread for good: the worker stops."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"s")

    def handle_exit(self, sig: Any, frame: Any) -> None:
        super().handle_exit(sig, frame)
        self._wake_for_stop()

    def handle_quit(self, sig: Any, frame: Any) -> None:
        self._wake_for_stop()
        super().handle_quit(sig, frame)

    def handle_request(self, req: Any, conn: Any) -> Any:
        """gthread's (and the guard's); a worker that stops after it (max_requests) wakes the
        lingering threads."""
        try:
            return super().handle_request(req, conn)
        finally:
            if not self.alive and not self._stopping:
                self._wake_for_stop()

    def handle(self, conn: Any) -> Any:
        """Serve ``conn``'s request, then its next ones while they come soon enough."""
        with self._busy_lock:
            self._busy += 1
            self._full(self._busy >= self.cfg.threads)
        try:
            keep = super().handle(conn)
            while keep is True:
                came = self._linger(conn)
                if came is None:
                    break  # the pool got busy, or a stop: the poller's keep-alive from now
                if not came:
                    # quiet for keepalive seconds: closed here, at once, as gthread's poller
                    # closes an idle connection (nothing was sent that a reset could cut off)
                    util.close(conn.sock)
                    return GONE
                keep = super().handle(conn)
            return keep
        finally:
            with self._busy_lock:
                self._busy -= 1
                self._full(self._busy >= self.cfg.threads)

    def _linger(self, conn: Any) -> bool | None:
        """Wait on ``conn`` for its next request while lingering is free: True when it came,
        False when it stayed quiet for ``keepalive`` seconds, None when lingering must stop."""
        if conn.is_http2:
            return None  # gunicorn serves an HTTP/2 connection's streams in one handle()
        if conn.parser.unreader.buf.getvalue():
            return True  # read ahead already (a pipelined request or a drained body's excess)
        poller = select.poll()
        sock = conn.sock.fileno()
        poller.register(sock, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        deadline = time.monotonic() + self.cfg.keepalive
        while self.alive and self._busy < self.cfg.threads:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            events = poller.poll(min(left, LINGER_CHECK_S) * 1000)
            if any(fd == sock for fd, _ in events):
                return True
        return None
