"""Real processes on free ports, started and stopped as groups: one helper for scripts and tests.

Every child runs in its own session (so ``stop`` takes its workers with it), logs to a file, and
gets the repository importable and TensorFlow quiet through ``child_env``.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import closing, suppress
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# "i/n": this process tree draws its ports from the i-th of n equal slices of the range below the
# kernel's ephemeral one, so that n trees on one host (the suite's xdist workers) never draw the
# same port between one's draw and its server's bind. Unset: the whole range.
PORT_SLICE = "BERT_GATEWAY_PORT_SLICE"
_handed_out: set[int] = set()
_pick = random.Random()


def free_port() -> int:
    """Return a TCP port that is free right now, outside the kernel's ephemeral range.

    ``bind(0)`` hands out a port of the ephemeral range, which every outgoing connection draws
    its local port from too: between this call and the server's own bind, a client socket of
    any process can take it (a replica drill's model server once failed with "Address already
    in use" that way). Below the range only a listener can. Not the same port twice from one
    process; free on every IPv4 and IPv6 address, as servers binding 0.0.0.0 or :: need.
    """
    start, end = _port_range()
    if end - start > 1_000:
        for _ in range(500):
            port = _pick.randrange(start, end)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))  # no room below the range: the kernel's choice
        return int(sock.getsockname()[1])


def _port_range() -> tuple[int, int]:
    """Return [start, end) of the ports free_port draws from: 10000 to the ephemeral range's
    start, or this tree's slice of it (``PORT_SLICE``)."""
    start, end = 10_000, _ephemeral_low()
    index, _, count = os.environ.get(PORT_SLICE, "0/1").partition("/")
    if index.isdigit() and count.isdigit() and 0 <= int(index) < int(count):
        width = (end - start) // int(count)
        start, end = start + int(index) * width, start + (int(index) + 1) * width
    return start, end


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _bindable(port: int) -> bool:
    """Return True when ``port`` can be bound on the IPv4 and (where there is one) IPv6 wildcard."""
    for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with closing(sock):
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Return True when something accepts TCP connections on host:port."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def http_ok(url: str) -> bool:
    """Return True when GET ``url`` answers 200."""
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


def child_env(**extra: str) -> dict[str, str]:
    """Return a child's environment: the repo importable, TensorFlow quiet, ``extra`` on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def python_cmd(*args: str) -> list[str]:
    """Return a command line running the current interpreter with ``args``."""
    return [sys.executable, *args]


class ServerProcess:
    """A child process in its own session, appending to ``log_path``; ``stop()`` ends the group."""

    def __init__(
        self,
        cmd: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        name: str | None = None,
    ):
        self.cmd = list(cmd)
        self.log_path = Path(log_path)
        self.env = env or child_env()
        self.name = name or " ".join(self.cmd[:3])
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            return subprocess.Popen(
                self.cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        """The process id (also the process group id)."""
        return self.proc.pid

    def restart(self) -> None:
        """Start the same command again (after a kill)."""
        self.proc = self._spawn()

    def wait_until(self, ready: Callable[[], bool], timeout_s: float = 60.0) -> None:
        """Poll ``ready``; raise with the log tail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f}s:\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        """Return the last ``n`` lines of the log (split at newlines only: a JSON log line may
        hold U+2028 and the like, which orjson writes unescaped and str.splitlines splits at)."""
        lines = self.log_path.read_text(errors="replace").rstrip("\n").split("\n")
        return "\n".join(lines[-n:])

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process group and, for SIGKILL, reap it."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
            if sig == signal.SIGKILL:
                self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the group, SIGKILL it after ``timeout_s``."""
        if self.proc.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)


def stop_group(pid: int, timeout_s: float = 5.0) -> bool:
    """SIGTERM process group ``pid``, SIGKILL it after ``timeout_s``; False if it was gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return sig != signal.SIGTERM
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _exited(pid):
                return True
            time.sleep(0.1)
    return True


def _exited(pid: int) -> bool:
    """True once ``pid`` has exited: gone, or a zombie. A child of this process stays a zombie
    until it is reaped (it is, here), so signal 0 alone would find it alive for good and every
    stop would wait out both timeouts."""
    with suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # another parent's zombie: it exited
