"""Pieces shared by the drills: gateway clients that record every answer, a model-status monitor,
and the per-second timeline.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import requests

from modelformat import layout, serverconfig
from ops import modelconfig
from ops.modelconfig import OpsError
from ops.server import ModelServer


@dataclass(frozen=True)
class Answer:
    """One gateway request as a client saw it (times are ``time.monotonic()``)."""

    client: int
    label: str  # '' = no label (the gateway's default version); '@N' = explicit version N
    started: float
    finished: float
    status: int  # HTTP status, 0 when no HTTP answer came back at all
    version: int | None
    error: str = ""
    json_error: bool = True  # a non-200 answer carried {"error": {"code", "message"}}

    @property
    def ok(self) -> bool:
        """Return True for a 200 answer naming a version."""
        return self.status == 200 and self.version is not None


@dataclass
class Load:
    """Closed-loop clients sending ``:verb`` requests to a gateway until stopped.

    Client ``i`` asks for ``labels[i % len(labels)]``: a label, ``''`` (the default version) or
    ``'@N'`` (version N explicitly). With ``interval_s`` each client sends a request every
    ``interval_s`` seconds (at once when it is late), not back to back: a fixed offered load.
    """

    url: str
    model: str
    verb: str
    labels: list[str]
    clients: int
    timeout_s: float = 30.0
    answers: list[Answer] = field(default_factory=list)
    interval_s: float = 0.0

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(i,), daemon=True)
            for i in range(self.clients)
        ]

    def start(self) -> Load:
        """Start the clients; return self."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Answer]:
        """Stop the clients, wait for their last requests, and return every answer."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 5)
        return sorted(self.answers, key=lambda a: a.started)

    def _client(self, index: int) -> None:
        label = self.labels[index % len(self.labels)]
        session = requests.Session()
        body: dict[str, object] = {"texts": [f"drill client {index} says hello"]}
        if label.startswith("@"):
            body["version"] = int(label[1:])
        elif label:
            body["label"] = label
        data = orjson.dumps(body)
        endpoint = f"{self.url}/v1/models/{self.model}:{self.verb}"
        # paced clients start spread over one interval, not all at once
        due = time.monotonic() + self.interval_s * index / max(1, self.clients)
        while not self._stop.is_set():
            if self.interval_s:
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    break
                due = max(due + self.interval_s, time.monotonic())
            answer = self._send(session, endpoint, data, index, label)
            with self._lock:
                self.answers.append(answer)
            if answer.status == 0:
                time.sleep(0.05)  # the gateway itself is gone: do not spin

    def _send(
        self, session: requests.Session, endpoint: str, data: bytes, index: int, label: str
    ) -> Answer:
        started = time.monotonic()
        try:
            resp = session.post(
                endpoint, data=data, headers={"Content-Type": "application/json"},
                timeout=self.timeout_s,
            )  # fmt: skip
        except requests.RequestException as exc:
            return Answer(index, label, started, time.monotonic(), 0, None, type(exc).__name__)
        finished = time.monotonic()
        try:
            payload = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            return Answer(
                index, label, started, finished, resp.status_code, None, "not JSON", False
            )
        if resp.status_code == 200:
            version = payload.get("model", {}).get("version")
            return Answer(index, label, started, finished, 200, int(version) if version else None)
        error = payload.get("error") if isinstance(payload, dict) else None
        well_formed = isinstance(error, dict) and {"code", "message"} <= set(error)
        code = error.get("code", "") if isinstance(error, dict) else str(payload)[:80]
        return Answer(
            index, label, started, finished, resp.status_code, None, str(code), well_formed
        )


class StatusMonitor:
    """Polls GetModelStatus and remembers when each version was seen AVAILABLE, and (given the
    serving config) which versions a label named at the same moments."""

    def __init__(
        self,
        server: ModelServer,
        model: str,
        every_s: float = 0.1,
        config_path: Path | None = None,
    ):
        self.server = server
        self.model = model
        self.every_s = every_s
        self.config_path = config_path
        self.seen: list[tuple[float, frozenset[int]]] = []  # (time, AVAILABLE versions)
        self.labelled: list[tuple[float, frozenset[int]]] = []  # (time, versions labels name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StatusMonitor:
        """Start polling; return self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                states = self.server.status(self.model)
            except OpsError:
                time.sleep(self.every_s)
                continue  # no answer is not "nothing AVAILABLE": it would fake unloads
            available = frozenset(s.version for s in states if s.state == "AVAILABLE")
            self.seen.append((time.monotonic(), available))
            if self.config_path is not None:
                try:
                    model = modelconfig.find_model(
                        modelconfig.load_config(self.config_path), self.model
                    )
                    self.labelled.append(
                        (time.monotonic(), frozenset(model.version_labels.values()))
                    )
                except OpsError:
                    pass  # replaced by rename, so never half-written; a failed read is skipped
            time.sleep(self.every_s)

    def transitions(self) -> list[tuple[float, str]]:
        """Return (time, 'vN AVAILABLE' / 'vN unloaded') for every change the monitor saw."""
        out: list[tuple[float, str]] = []
        previous: frozenset[int] | None = None
        for t, versions in self.seen:
            if previous is not None:
                out += [(t, f"v{v} AVAILABLE") for v in sorted(versions - previous)]
                out += [(t, f"v{v} unloaded") for v in sorted(previous - versions)]
            previous = versions
        return out

    def unload_gaps(self) -> dict[int, float]:
        """Return, per unloaded version a label had named, a lower bound of the seconds between
        the label moving off it and its unload: from the first config read without the label
        to the last status in which the version was still AVAILABLE."""
        gaps: dict[int, float] = {}
        for (t_before, before), (_, after) in itertools.pairwise(self.seen):
            for version in sorted(before - after):
                named = [t for t, names in self.labelled if version in names and t <= t_before]
                if not named:
                    continue  # never labelled: only explicit-version requests could use it
                moved = [t for t, _ in self.labelled if t > max(named)]
                gap = t_before - (moved[0] if moved else float("inf"))
                gaps[version] = min(gaps.get(version, float("inf")), gap)
        return gaps

    def available_during(self, version: int, start: float, end: float, slack_s: float) -> bool:
        """Return True if ``version`` was seen AVAILABLE within [start - slack, end + slack] or
        by the sightings just before and just after it: a monitor slowed by a loaded machine
        polls less often than ``every_s``, and its pace, not a wall clock, bounds what it saw."""
        before = [v for t, v in self.seen if t < start - slack_s][-1:]
        inside = [v for t, v in self.seen if start - slack_s <= t <= end + slack_s]
        after = [v for t, v in self.seen if t > end + slack_s][:1]
        return any(version in versions for versions in (*before, *inside, *after))


def add_pace(parser: argparse.ArgumentParser) -> None:
    """Add ``--pace``: the seconds between one client's requests (``Load.interval_s``)."""
    parser.add_argument(
        "--pace", type=float, default=0.0,
        help="seconds between one client's requests (0, the default: back to back, the most "
        "load the clients can offer; a pace leaves the cores to what the drill steps start)",
    )  # fmt: skip


def timeline(answers: Iterable[Answer], t0: float, events: dict[int, list[str]]) -> str:
    """Return a per-second table: answers per version, failures, and the drill's events."""
    per_second: dict[int, Counter[str]] = defaultdict(Counter)
    for a in answers:
        key = f"v{a.version}" if a.ok else f"fail:{a.status}"
        per_second[int(a.finished - t0)][key] += 1
    lines = []
    for second in range(0, max([*per_second, *events, 0]) + 1):
        counts = per_second.get(second, Counter())
        cells = "  ".join(f"{k}:{counts[k]}" for k in sorted(counts))
        note = "   <- " + "; ".join(events[second]) if second in events else ""
        lines.append(f"t={second:>3}s  {cells or '-'}{note}")
    return "\n".join(lines)


def counts(answers: Iterable[Answer]) -> dict[str, int]:
    """Return totals: answers, failures, and answers per version and per status."""
    out: Counter[str] = Counter()
    for a in answers:
        out["requests"] += 1
        out["ok" if a.ok else "failed"] += 1
        out[f"version {a.version}" if a.ok else f"status {a.status} {a.error}"] += 1
    return dict(out)


def print_checks(checks: dict[str, bool]) -> None:
    """Print one ``[PASS]``/``[FAIL]`` line per check, as every drill ends."""
    for name, passed in checks.items():
        print(f"[{'PASS' if passed else 'FAIL'}] {name}")


def run_in_tmp(name: str, json_path: Path | None, run: Callable[[Path], dict[str, Any]]) -> int:
    """Run a drill in a fresh temporary directory; return its exit status.

    0 when every one of the result's ``checks`` passed, 1 otherwise or when the drill failed
    (``OpsError``, ``RuntimeError``, ``TimeoutError``: printed as ``<name>: error: ...``). The
    result goes to ``json_path`` as JSON when one is given.
    """
    try:
        with tempfile.TemporaryDirectory(prefix=f"{name.replace('_', '-')}-") as tmp:
            result = run(Path(tmp))
    except (OpsError, RuntimeError, TimeoutError) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 1
    if json_path:
        json_path.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(result["checks"].values()) else 1


def copy_newest(
    spawn: Path, model: str, base: Path, as_version: int | None = None
) -> tuple[Path, int]:
    """Copy the newest exported version of ``model`` under ``spawn`` to ``base/<model>/<v>``
    (``v``: its own number, or ``as_version``); return the source directory and ``v``."""
    src = spawn.resolve() / model
    versions = layout.list_versions(src)
    if not versions:
        raise OpsError(f"no exported version under {src}")
    version = versions[-1] if as_version is None else as_version
    source = src / str(versions[-1])
    shutil.copytree(source, base / model / str(version))
    return source, version


def newest_config(spawn: Path, model: str, work: Path) -> Path:
    """Copy the newest exported version of ``model`` under ``work/models`` and write
    ``work/models.config`` serving it (no labels); return the config's path."""
    base = work / "models"
    copy_newest(spawn, model, base)
    config_path = work / "models.config"
    serverconfig.write_atomic(config_path, modelconfig.full_config(
        f'model_config_list {{ config {{ name: "{model}" '
        f'base_path: "{base / model}" model_platform: "tensorflow" }} }}'
    ))  # fmt: skip
    return config_path


def pinned_config(model: str, base: Path, version: int) -> str:
    """Return a models.config serving only ``version`` of ``model`` (under ``base/<model>``)
    with the stable and canary labels on it."""
    return modelconfig.full_config(f"""model_config_list {{ config {{
        name: "{model}" base_path: "{base / model}" model_platform: "tensorflow"
        model_version_policy {{ specific {{ versions: {version} }} }}
        version_labels {{ key: "stable" value: {version} }}
        version_labels {{ key: "canary" value: {version} }} }} }}""")
