"""The rollout drill's load: clients of real tickets naming no version, and a metrics sampler.

``Clients`` run closed-loop (each of ``clients`` threads sends its next ticket when the last one
answered: the most the stack can serve, used to measure its capacity) or open-loop at a stated
``rate`` (requests leave on a fixed schedule whatever the answers do, and each one's latency is
counted from the moment it was due, so a stall shows up as latency instead of as fewer requests).
The drill measures the shadow's cost open-loop at a fraction of the measured capacity: a closed
loop keeps the model server saturated, so any extra work there (a 100 % shadow doubles it) can
only show up as client latency; with spare capacity, the shadow uses the spare capacity.
"""

from __future__ import annotations

import csv
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import requests

from ops.modelconfig import OpsError
from ops.rollout.metrics import AGREEMENT_COUNT, AGREEMENT_SUM, GatewayMetrics


@dataclass(frozen=True)
class Reply:
    """One client request as the client saw it (times: ``time.monotonic()``)."""

    started: float
    finished: float
    status: int  # 0: no HTTP answer
    version: int | None
    label: str = ""  # the top-1 label of the answer
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.version is not None


@dataclass
class Clients:
    """Clients sending one ticket per ``:classify`` request, naming no version.

    ``rate`` None: ``clients`` closed-loop threads. A rate (requests/s): a dispatcher releases
    one request every ``1 / rate`` s to ``clients`` sender threads (the most in flight at once);
    a request that finds every sender busy waits, and its latency counts from when it was due.
    """

    url: str
    model: str
    texts: list[str]
    clients: int
    rate: float | None = None
    timeout_s: float = 60.0
    replies: list[Reply] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._due: queue.Queue[tuple[float, int] | None] = queue.Queue()
        target = self._closed if self.rate is None else self._open
        self._threads = [
            threading.Thread(target=target, args=(i,), daemon=True) for i in range(self.clients)
        ]
        if self.rate is not None:
            self._threads.append(threading.Thread(target=self._dispatch, daemon=True))

    def start(self) -> Clients:
        """Start the clients; return self."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Reply]:
        """Stop the clients; return every reply in start order."""
        self._stop.set()
        for _ in range(self.clients):
            self._due.put(None)
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        return sorted(self.replies, key=lambda r: r.started)

    def since(self, t: float) -> list[Reply]:
        """Return the replies started at or after ``t`` so far."""
        with self._lock:
            return [r for r in self.replies if r.started >= t]

    def _send(self, session: requests.Session, i: int, due: float | None = None) -> Reply:
        endpoint = f"{self.url}/v1/models/{self.model}:classify"
        reply = classify(session, endpoint, self.texts[i % len(self.texts)], self.timeout_s)
        if due is not None:  # open loop: the wait for a free sender is the client's latency too
            reply = Reply(min(due, reply.started), *_rest(reply))
        with self._lock:
            self.replies.append(reply)
        return reply

    def _closed(self, index: int) -> None:
        session = requests.Session()
        i = index * 7919  # each client walks the tickets from its own offset
        while not self._stop.is_set():
            reply = self._send(session, i)
            i += 1
            if reply.status == 0:
                time.sleep(0.05)  # the gateway is gone: do not spin

    def _dispatch(self) -> None:
        assert self.rate is not None
        interval = 1.0 / self.rate
        due = time.monotonic()
        i = 0
        while not self._stop.is_set():
            self._due.put((due, i))
            i += 7919
            due += interval
            self._stop.wait(max(0.0, due - time.monotonic()))

    def _open(self, index: int) -> None:
        session = requests.Session()
        while True:
            item = self._due.get()
            if item is None or self._stop.is_set():
                return
            self._send(session, item[1], due=item[0])


def _rest(reply: Reply) -> tuple:
    return reply.finished, reply.status, reply.version, reply.label, reply.error


def measure_capacity(url: str, model: str, texts: list[str], clients: int, seconds: float) -> float:
    """Return the answers per second ``clients`` closed-loop clients get (the stack's capacity)."""
    load = Clients(url, model, texts, clients).start()
    started = time.monotonic()
    time.sleep(seconds)
    done = [r for r in load.since(started) if r.ok and r.finished <= time.monotonic()]
    elapsed = time.monotonic() - started
    load.stop()
    if not done:
        raise OpsError(f"no answer in {seconds:g}s of closed-loop load: cannot measure capacity")
    return len(done) / elapsed


def classify(session: requests.Session, endpoint: str, text: str, timeout_s: float) -> Reply:
    """Send one ticket; return what came back."""
    started = time.monotonic()
    try:
        resp = session.post(
            endpoint, data=orjson.dumps({"texts": [text]}),
            headers={"Content-Type": "application/json"}, timeout=timeout_s,
        )  # fmt: skip
    except requests.RequestException as exc:
        return Reply(started, time.monotonic(), 0, None, error=type(exc).__name__)
    finished = time.monotonic()
    try:
        payload = orjson.loads(resp.content)
        version = int(payload["model"]["version"]) if resp.status_code == 200 else None
        label = str(payload["predictions"][0]["label"]) if version is not None else ""
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError):
        return Reply(started, finished, resp.status_code, None, error="unexpected body")
    error = "" if version is not None else str(payload.get("error", payload))[:80]
    return Reply(started, finished, resp.status_code, version, label, error)


class Sampler:
    """Every second: the gateway's cumulative top-1 agreement, and each model server's CPU time."""

    def __init__(self, url: str, model: str, server_pids: Sequence[int]):
        self.metrics = GatewayMetrics([url])
        self.model = model
        self.pids = tuple(server_pids)
        # (t, agreement sum, agreement count, CPU seconds of each of server_pids)
        self.rows: list[tuple[float, float, float, tuple[float, ...]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                samples = self.metrics.snapshot(self.model)
            except OpsError:
                samples = {}
            total = count = 0.0
            for (name, labels), value in samples.items():
                if dict(labels).get("measure") == "top1":
                    total += value if name == AGREEMENT_SUM else 0.0
                    count += value if name == AGREEMENT_COUNT else 0.0
            cpus = tuple(cpu_seconds(pid) for pid in self.pids)
            self.rows.append((time.monotonic(), total, count, cpus))
            self._stop.wait(1.0)

    def cpu_between(self, start: float, end: float, which: int = 0) -> float:
        """Return CPU seconds per second of the ``which``-th server between two times (NaN if
        unknown)."""
        inside = [(t, cpus[which]) for t, _, _, cpus in self.rows if start <= t <= end]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return float("nan")
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def cpu_seconds(pid: int) -> float:
    """Return user + system CPU seconds of process ``pid`` and its waited-for children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def read_tickets(path: Path) -> list[str]:
    """Return the ticket texts of a ``text<TAB>label`` file with a header."""
    with open(path, encoding="utf-8", newline="") as fh:
        return [row["text"] for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)]
