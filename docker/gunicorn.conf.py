"""gunicorn settings for the gateway.

Run: ``gunicorn -c docker/gunicorn.conf.py 'backend.app:create_app()'``.

- gthread workers: requests spend most of their time waiting on the model server, so threads
  overlap that wait; one process per usable CPU core (affinity/cgroup, not the host's count)
  runs tokenization and JSON in parallel. The CPU work scales through ``workers``; the threads
  per worker only cover requests waiting upstream, so their number does not follow the cores.
  The worker class is gthread's subclass ``backend.httpworker.LingeringThreadWorker``: a pool
  thread serves its keep-alive connection's next request itself while another thread is free,
  instead of the two thread hand-offs gthread makes per request (GATEWAY_WORKER_CLASS=gthread
  for gunicorn's own). Both thread classes of that module (``GuardedThreadWorker``, and the
  lingering one built on it) hand a connection to a pool thread only once a whole request has
  come: its head within GATEWAY_HEADER_TIMEOUT_S of its first byte, its body within
  GATEWAY_BODY_TIMEOUT_S of the head (else 408), so clients that send slowly or not at all
  never hold the threads.
- Timeouts follow GATEWAY_TIMEOUT_S: the app answers 504 at GATEWAY_TIMEOUT_S, so gunicorn's
  worker timeout (a silent, stuck worker) and the graceful stop are set above it.
- The app is preloaded in the master (imports shared copy-on-write), and each worker creates its
  upstream client in post_fork: gRPC channels and thread pools must not cross a fork.
- Prometheus multiprocess mode: PROMETHEUS_MULTIPROC_DIR is set here, before the app (and so
  prometheus_client) is imported.
- Access log: one JSON object per line.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def _cpu_count() -> int:
    """Return the CPUs this process may run on (cgroup affinity, not the host's count).

    The rule of ``export.hardware.usable_cores``, repeated: the gateway image ships backend/ only.
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _seconds(name: str, default: str) -> float:
    """Return a positive number of seconds from the environment, refusing anything else."""
    raw = os.environ.get(name) or default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise SystemExit(f"{name}={raw!r}: a positive number of seconds")
    return value


def _keep_large_blocks_mmapped() -> None:
    """Fix glibc's mmap threshold at its default (128 KiB), inherited by every forked worker.

    glibc raises the threshold to the size of each mmapped block freed (up to 32 MiB), after which
    a request's large blocks (a 1 MiB body, its parsed lists) come from the heap and stay in the
    worker's RSS once freed: the hostile drill measured +93 MiB over two workers after bodies of
    400,000 token ids that were all refused. With the threshold fixed they are unmapped on free.
    """
    path = ctypes.util.find_library("c")
    if path is None:  # not glibc (musl): nothing to set
        return
    try:
        ctypes.CDLL(path).mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return


_keep_large_blocks_mmapped()

_timeout_s = float(os.environ.get("GATEWAY_TIMEOUT_S", "10"))
# How long a client may take to send a request's head (from its first byte) and then its body;
# past either it is answered 408 and the connection closed (backend/httpworker.py).
HEADER_TIMEOUT_S = _seconds("GATEWAY_HEADER_TIMEOUT_S", "10")
BODY_TIMEOUT_S = _seconds("GATEWAY_BODY_TIMEOUT_S", "10")

bind = [os.environ.get("GATEWAY_BIND", "0.0.0.0:8000")]
# A second listener for /metrics alone (the app refuses everything else there, and /metrics on
# GATEWAY_BIND): a NetworkPolicy can then open it to the monitoring namespace only.
if os.environ.get("GATEWAY_METRICS_BIND"):
    bind.append(os.environ["GATEWAY_METRICS_BIND"])
# gthread, with keep-alive connections served on by the thread that has them
# (backend/httpworker.py); GATEWAY_WORKER_CLASS=gthread is gunicorn's own.
worker_class = os.environ.get("GATEWAY_WORKER_CLASS") or "backend.httpworker.LingeringThreadWorker"
workers = int(os.environ.get("GATEWAY_WORKERS") or max(1, _cpu_count()))
# 32: a lingering thread serves its keep-alive connection only while another thread is free, so
# the threads cover the connections a worker keeps (16 clients per worker and some to spare);
# with 8, 16 clients' requests went through gthread's poller round trip: 1.63-1.66 ms of worker
# CPU per one-text request instead of 1.41-1.47 ms (AVX-512 + bf16, docs/performance/).
threads = int(os.environ.get("GATEWAY_THREADS", "32"))
preload_app = True
timeout = int(max(30.0, 3 * _timeout_s))
graceful_timeout = int(_timeout_s + 5)
# how long an idle keep-alive connection (or a new one that sends nothing) stays open
keepalive = max(1, round(_seconds("GATEWAY_KEEPALIVE_S", "5")))
# a worker restarts (gracefully: a request already sent is answered) after this many requests,
# give or take a tenth; 0: never
max_requests = int(os.environ.get("GATEWAY_MAX_REQUESTS") or 0)
max_requests_jitter = max_requests // 10
accesslog = os.environ.get("GATEWAY_ACCESS_LOG", "-") or None  # "" turns it off
errorlog = "-"
loglevel = os.environ.get("GATEWAY_LOG_LEVEL", "info")
logger_class = "backend.access_log.JsonAccessLogger"
# gunicorn 27's control socket has one default path per user: several gateways on one host
# (tests, the local stack) would fight over it, so it is opt-in.
control_socket_disable = not os.environ.get("GATEWAY_CONTROL_SOCKET")
if os.environ.get("GATEWAY_CONTROL_SOCKET"):
    control_socket = os.environ["GATEWAY_CONTROL_SOCKET"]

_own_metrics_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if _own_metrics_dir:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")


def on_starting(server: Any) -> None:
    """Empty the metrics directory: files from a previous run would be summed in."""
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def pre_request(worker: Any, req: Any) -> None:
    """Answer a body over GATEWAY_MAX_BODY_BYTES, or a chunked one, with "Connection: close".

    The app refuses an oversize body (413) without reading it, and gunicorn would drain at most
    64 KiB before closing the connection it had just called keep-alive: the client's next
    request on that connection would be lost. Said up front, the client opens a new one.
    """
    from backend.app import body_may_stay_unread

    worker.log.debug("%s %s", req.method, req.path)
    if body_may_stay_unread(worker.wsgi, req.headers):
        req.force_close()


def post_fork(server: Any, worker: Any) -> None:
    """Create this worker's Gateway (gRPC channel or HTTP connections, chunks) after the fork."""
    from backend.worker import start_worker

    app = worker.app.wsgi()
    # backend/httpworker.py's worker classes: read deadlines, and the body size worth waiting for
    worker.header_timeout_s = HEADER_TIMEOUT_S
    worker.body_timeout_s = BODY_TIMEOUT_S
    worker.max_body_bytes = int(app.config.get("MAX_CONTENT_LENGTH") or 1_048_576)
    start_worker(app, threads=worker.cfg.threads)  # they size the REST upstream's pool


def worker_exit(server: Any, worker: Any) -> None:
    """Close the worker's upstream connections."""
    from backend.worker import stop_worker

    app = getattr(worker, "wsgi", None)
    if app is not None:
        stop_worker(app)


def child_exit(server: Any, worker: Any) -> None:
    """Drop a dead worker's live metrics."""
    from backend.metrics import mark_worker_dead

    mark_worker_dead(worker.pid)


def on_exit(server: Any) -> None:
    """Remove the metrics directory this config created."""
    if _own_metrics_dir:
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
