"""Migrate an embedder to another vector space under load: queries by label throughout, the label
moved once, every answer from the version its label named.

  python scripts/migration_drill.py --spawn models/ --model minilm --from 1 --to 2 --clients 8

``--spawn`` holds the two versions (``<model>/<from>`` and ``<model>/<to>``: two embedders of
different spaces, e.g. the demo MiniLM and the same weights exported with another pooling); they
are copied into a temporary base path served by a model server and a gunicorn gateway, with
``stable`` on ``--from`` and the model's default traffic pinned to it in the routing file, as a
refused weighted canary of ``--to`` leaves it (``python -m ops.rollout``: two vector spaces). A
corpus of ``--corpus-rows`` texts is written, ``--clients`` closed-loop clients send ``:embed``
requests by label (``stable``) and ``--unlabelled-clients`` send them naming no version or label
(default traffic) for the whole run, and after ``--warmup-s`` the drill runs ``python -m
ops.rollout migrate MODEL --to V --corpus FILE`` in process (default traffic pinned to the old
version, the batch job pinned to V, its output checked, the spaces compared, the label moved,
then default traffic moved with it).

Checks (exit status 1 if one fails): 0 failed requests; the migration succeeded; the label moved
exactly once (models.config polled throughout); every answer by label names the version the label
named while it was in flight (the old one before the move, the new one once the gateway's label
cache can no longer hold the old: ``GATEWAY_LABELS_CACHE_S`` after it, either in between); every
unlabelled answer names the version default traffic was pinned to (the old one until the routing
file changed after the label moved, the new one from ``GATEWAY_LABELS_CACHE_S`` after that) and
default traffic ends on the label's version; per client, never the old version after the new;
every answer's vector is the named version's own (cosine >= 0.999 with that version's direct
answer to the same text, asked by version at the end).
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import requests

from backend.settings import load_settings
from modelformat import serverconfig
from modelformat.routing import ModelRoute
from ops import modelconfig, stack
from ops.drills import common
from ops.modelconfig import OpsError
from ops.rollout import migrate
from ops.rollout.spaces import sample_texts, unit
from ops.rollout.state import read_routing, routing_path_for, write_route

LABEL = "stable"


@dataclass(frozen=True)
class Query:
    """One client's request by label as it saw it (times: ``time.time()``)."""

    client: int
    text: str
    started: float
    finished: float
    status: int
    version: int | None
    vector: tuple[float, ...] = ()
    labelled: bool = True  # by label (else default traffic: no version, no label)


def embed(session: requests.Session, url: str, model: str, text: str, **spec: Any) -> Any:
    """Return the gateway's ``:embed`` answer (the JSON) to one text; raise on a non-200."""
    body = orjson.dumps({"texts": [text], **spec})
    reply = session.post(f"{url}/v1/models/{model}:embed", data=body, timeout=30,
                         headers={"Content-Type": "application/json"})  # fmt: skip
    reply.raise_for_status()
    return reply.json()


class LabelLoad:
    """Closed-loop clients asking ``:embed`` by label (the first ``clients``) and naming no
    version or label (``unlabelled`` more), each answer's vector kept."""

    def __init__(self, url: str, model: str, clients: int, unlabelled: int = 0):
        self.url, self.model, self.clients = url, model, clients
        self.queries: list[Query] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(clients + unlabelled)]  # fmt: skip

    def start(self) -> LabelLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> list[Query]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=40)
        return sorted(self.queries, key=lambda q: q.started)

    def text(self, client: int) -> str:
        return f"drill client {client} searches the corpus"

    def _client(self, index: int) -> None:
        session = requests.Session()
        text = self.text(index)
        labelled = index < self.clients
        spec = {"label": LABEL} if labelled else {}
        while not self._stop.is_set():
            started = time.time()
            try:
                answer = embed(session, self.url, self.model, text, **spec)
                query = Query(index, text, started, time.time(), 200,
                              int(answer["model"]["version"]),
                              tuple(answer["embeddings"][0]), labelled)  # fmt: skip
            except requests.HTTPError as exc:
                query = Query(index, text, started, time.time(), exc.response.status_code, None,
                              labelled=labelled)  # fmt: skip
            except (requests.RequestException, ValueError, KeyError):
                query = Query(index, text, started, time.time(), 0, None, labelled=labelled)
            with self._lock:
                self.queries.append(query)


class LabelWatch:
    """Polls models.config's label and the routing file's entry of the model every 20 ms;
    remembers each change and when it was seen (the entry as its pinned version, None for no
    entry: the newest AVAILABLE version)."""

    def __init__(self, config: Path, model: str):
        self.config, self.model = config, model
        self.changes: list[tuple[float, int]] = []
        self.routes: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LabelWatch:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join()
        return self.changes

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                config = modelconfig.load_config(self.config)
                now = dict(modelconfig.find_model(config, self.model).version_labels)[LABEL]
            except Exception:  # a config mid-replace: read again
                continue
            if not self.changes or self.changes[-1][1] != now:
                self.changes.append((time.time(), now))
            try:
                route = read_routing(routing_path_for(self.config)).route(self.model)
            except OpsError:  # cannot happen with atomic writes; read again
                continue
            pinned = route.weights[0][0] if route is not None and route.weights else None
            if not self.routes or self.routes[-1][1] != pinned:
                self.routes.append((time.time(), pinned))


def check(
    queries: list[Query],
    direct: dict[tuple[str, int], np.ndarray],
    changes: list[tuple[float, int]],
    old: int,
    new: int,
    migrated: bool,
    stale_s: float,
    routes: Sequence[tuple[float, int | None]] = (),
) -> dict[str, Any]:
    """Return the drill's checks and figures (pure, over what was recorded)."""
    failed = [q for q in queries if q.status != 200]
    moved = changes[1][0] if len(changes) > 1 else float("inf")
    # default traffic: pinned to ``old`` until the routing entry changed after the label moved
    followed = next((t for t, v in routes if t >= moved and v != old), float("inf"))
    wrong_version: list[Query] = []
    wrong_unlabelled: list[Query] = []
    wrong_vector: list[Query] = []
    flapped: list[Query] = []
    for q in queries:
        if q.status != 200 or q.version is None:
            continue
        # the label (the pin) named ``old`` until ``moved`` (``followed``); the gateway may
        # resolve from its label (routing) cache for up to ``stale_s`` after that
        switch = moved if q.labelled else followed
        allowed = {old} if q.finished < switch else {new} if q.started > switch + stale_s else {
            old, new}  # fmt: skip
        if q.version not in allowed:
            (wrong_version if q.labelled else wrong_unlabelled).append(q)
        reference = direct.get((q.text, q.version))
        vector = unit(np.asarray([q.vector], np.float32))[0]
        if reference is None or float(vector @ reference) < 0.999:
            wrong_vector.append(q)
    last: dict[int, int] = {}
    for q in queries:
        if q.version is None:
            continue
        if last.get(q.client) == new and q.version == old:
            flapped.append(q)
        last[q.client] = q.version
    by_version = {f"v{v}": sum(q.version == v for q in queries) for v in (old, new)}
    unlabelled = [q for q in queries if not q.labelled and q.version is not None]
    default_by_version = {f"v{v}": sum(q.version == v for q in unlabelled) for v in (old, new)}
    checks = {
        "0 failed requests": not failed,
        "the migration succeeded": migrated,
        "the label moved exactly once": [v for _, v in changes] == [old, new],
        "every answer from the version its label named while it was in flight": not wrong_version,
        "every unlabelled answer from the label's version (pinned, then following it)": (
            not wrong_unlabelled
        ),
        "every answer's vector is the named version's own": not wrong_vector,
        "no client got the old version after the new one": not flapped,
        "both versions answered": all(by_version.values()),
    }
    if unlabelled:
        checks["default traffic ended on the label's version"] = (
            followed < float("inf") and routes[-1][1] in (new, None)
            and unlabelled[-1].version == new
        )  # fmt: skip
    return {
        "checks": checks, "requests": len(queries), "failed": len(failed),
        "answers_by_version": by_version, "unlabelled_by_version": default_by_version,
        "wrong_version": len(wrong_version), "wrong_unlabelled": len(wrong_unlabelled),
        "wrong_vector": len(wrong_vector), "flapped": len(flapped),
        "label_changes": [v for _, v in changes], "routes": [v for _, v in routes],
        "label_cache_s": stale_s, "failed_examples": [q.status for q in failed[:5]],
    }  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Spawn the stack, load it by label, migrate, check; return the result."""
    base = work / "models"
    for version in (args.old, args.new):
        shutil.copytree(args.spawn / args.model / str(version), base / args.model / str(version))
    config = work / "models.config"
    serverconfig.write_atomic(config, modelconfig.full_config(
        f'model_config_list {{ config {{ name: "{args.model}" base_path: "{base / args.model}" '
        f'model_platform: "tensorflow" model_version_policy {{ specific {{ versions: {args.old} '
        f'versions: {args.new} }} }} version_labels {{ key: "{LABEL}" value: {args.old} }} }} }}'
    ))  # fmt: skip
    corpus = work / "corpus.jsonl"
    corpus.write_bytes(
        b"".join(
            orjson.dumps({"id": f"doc-{i}", "text": t}) + b"\n"
            for i, t in enumerate(sample_texts(args.corpus_rows, seed=3))
        )
    )
    # as a refused weighted canary of the new version leaves it: default traffic on the old one
    write_route(routing_path_for(config), args.model, ModelRoute(((args.old, 100.0),)))
    server, grpc_port, rest_port = stack.start_modelserver(config, work, batching=False)
    gateway = None
    try:
        gateway, url = stack.start_gateway("grpc", grpc_port, rest_port, base, config, work)
        watch = LabelWatch(config, args.model).start()
        load = LabelLoad(url, args.model, args.clients, args.unlabelled_clients).start()
        time.sleep(args.warmup_s)
        print(f"== migrating {args.model} v{args.old} -> v{args.new} under load", flush=True)
        code = migrate.main([
            args.model, "--to", str(args.new), "--corpus", str(corpus),
            "--output", str(work / "migrated"), "--server", f"127.0.0.1:{grpc_port}",
            "--config", str(config), "--base-path", str(base), "--log", str(work / "log.jsonl"),
            "--reader-wait", str(args.reader_wait), "--timeout", "60",
        ])  # fmt: skip
        time.sleep(args.after_s)
        queries = load.stop()
        changes = watch.stop()
        session = requests.Session()
        direct = {
            (load.text(c), v): unit(np.asarray(
                embed(session, url, args.model, load.text(c), version=v)["embeddings"],
                np.float32))[0]
            for c in range(args.clients + args.unlabelled_clients) for v in (args.old, args.new)
        }  # fmt: skip
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()
    events = [json.loads(line) for line in (work / "log.jsonl").read_text().splitlines()]
    report: dict[str, Any] = next((e for e in events if e["event"] == "migrated"), {})
    stale_s = load_settings().labels_cache_s
    result = check(queries, direct, changes, args.old, args.new, code == 0, stale_s, watch.routes)
    result["migration"] = {k: report.get(k) for k in ("batch", "output", "spaces")}
    result["events"] = [e["event"] for e in events]
    print(json.dumps({k: v for k, v in result.items() if k != "checks"}, indent=1, default=str))
    common.print_checks(result["checks"])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--spawn", type=Path, required=True, help="base path holding both versions")
    p.add_argument("--model", default="minilm")
    p.add_argument("--from", dest="old", type=int, default=1, help="stable's version (1)")
    p.add_argument("--to", dest="new", type=int, default=2, help="the new space's version (2)")
    p.add_argument("--clients", type=int, default=4, help="clients querying by label (4)")
    p.add_argument("--unlabelled-clients", type=int, default=2,
                   help="clients naming no version or label: default traffic (2)")  # fmt: skip
    p.add_argument("--corpus-rows", type=int, default=2000, help="texts in the corpus (2000)")
    p.add_argument("--warmup-s", type=float, default=3.0, help="load before the migration (3)")
    p.add_argument("--after-s", type=float, default=None,
                   help="load after it (default: GATEWAY_LABELS_CACHE_S + 2)")  # fmt: skip
    p.add_argument("--reader-wait", type=float, default=None,
                   help="migrate's --reader-wait (default: push_model's bound)")  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    args = p.parse_args(argv)
    if args.after_s is None:
        args.after_s = load_settings().labels_cache_s + 2
    if args.reader_wait is None:
        from ops.lifecycle import push

        args.reader_wait = push.default_reader_wait_s()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return common.run_in_tmp("migration_drill", args.json, lambda work: run(args, work))
