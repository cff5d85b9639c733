"""Which version serves a request, and that version's assets (vocabulary, model.json, labels).

The gateway decides the version *before* tokenizing, then sends exactly that version upstream:
- an explicit ``version`` is used as given (after checking its assets exist);
- a ``label`` is looked up in the serving config file (GATEWAY_MODEL_CONFIG_FILE). TF Serving has
  no API that lists labels, and sending ``version_label`` would tell us the version only after
  we had already tokenized; the config file is the source TF Serving itself reads, its content
  re-read every GATEWAY_LABELS_CACHE_S (not trusting stat(): shared volumes cache attributes);
- otherwise the newest AVAILABLE version from GetModelStatus, cached GATEWAY_STATUS_CACHE_S.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from backend import metrics
from backend.early_exit import EarlyExit, parse_early_exit
from backend.embeddings import EmbeddingInfo, embedding_info
from backend.errors import (
    LabelNotFound,
    ModelAssetsError,
    ModelNotFound,
    NotFound,
    UpstreamTimeout,
    UpstreamUnavailable,
    VersionNotFound,
)
from backend.reloading import ReloadingFile
from backend.tokenization import TextTokenizer
from modelformat import serverconfig
from modelformat.heads import Head, head_from_info
from modelformat.names import valid_model_name
from modelformat.outputs import Outputs, parse_outputs
from modelformat.sparse_idf import read_idf
from modelformat.status import VersionStatus, newest_available
from modelformat.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelAssets:
    """What the gateway needs from one version directory's assets/."""

    model: str
    version: int
    task: str  # "classify", "embed" or "tag" (the head's task)
    max_seq_len: int
    labels: tuple[str, ...]
    tokenizer: TextTokenizer = field(repr=False)
    info: dict[str, Any] = field(repr=False, default_factory=dict)
    # padded length → its fixed-length signature (``seq_<L>``); empty for older exports
    bucket_signatures: dict[int, str] = field(default_factory=dict)
    # the exits of an early-exit version (it takes ``speed``, returns ``exit_layer``); else None
    early_exit: EarlyExit | None = None
    # what the head is (model.json's task, problem_type, score_activation, text_pair, ...)
    head: Head = field(default_factory=Head)
    # an embedding model's prompts and whether it normalizes (sentence-transformers' modules)
    embedding: EmbeddingInfo = field(default_factory=EmbeddingInfo)
    # an embed version's output kinds (model.json's outputs; None for other tasks)
    outputs: Outputs | None = None
    # inference-free sparse queries: weight by token id (the IDF asset); else None
    sparse_idf: np.ndarray | None = field(default=None, repr=False)


def check_model_name(model: str) -> str:
    """Return ``model`` if it is a safe directory name, else raise 404 (no path tricks)."""
    if not valid_model_name(model):
        raise ModelNotFound(f"model {model!r} is not served")
    return model


def load_assets(base_path: Path, model: str, version: int) -> ModelAssets:
    """Return the assets of ``base_path/model/version``; 404 when the version does not exist."""
    model_dir = base_path / check_model_name(model)
    version_path = model_dir / str(version)
    if not model_dir.is_dir():
        raise ModelNotFound(f"model {model!r} is not served")
    if not version_path.is_dir():
        raise VersionNotFound(f"model {model!r} has no version {version}")
    assets = version_path / "assets"
    if not (assets / "model.json").is_file():  # once per version: the assets are cached
        raise ModelAssetsError(
            f"model {model!r} version {version} has no assets/model.json: the gateway serves "
            "versions `python -m export build` wrote; export the checkpoint it was made from "
            "(docs/guides/coming-from-other-servers.md)"
        )
    try:
        info = json.loads((assets / "model.json").read_text(encoding="utf-8"))
        labels_file = assets / "labels.txt"
        labels = info.get("labels") or (
            labels_file.read_text(encoding="utf-8").splitlines() if labels_file.is_file() else []
        )
        max_seq_len = int(info.get("max_seq_len", 128))
        # assets/tokenizer.json, or an older version's vocab.txt (model.json's do_lower_case)
        loaded, spec = load_tokenizer(version_path, info)
        tokenizer = TextTokenizer(
            loaded, max_seq_len=max_seq_len, pad_id=spec.pad_id, unk_id=spec.unk_id,
            truncation_side=spec.truncation_side,
        )  # fmt: skip
        bucket_signatures = {
            int(length): str(name) for length, name in info.get("bucket_signatures", {}).items()
        }
        early_exit = parse_early_exit(info)
        head = head_from_info(info)  # a value no reader knows is unreadable assets, not a guess
        embedding = embedding_info(info)
        outputs = parse_outputs(info)
        sparse_idf = _sparse_idf(assets, outputs, tokenizer.vocab_size)
    except Exception as exc:  # OSError, ValueError, ...; tokenizers raises its own types
        raise ModelAssetsError(
            f"model {model!r} version {version} has unreadable assets: {exc}"
        ) from exc
    return ModelAssets(
        model=model,
        version=version,
        task=head.task,
        max_seq_len=max_seq_len,
        labels=tuple(str(label) for label in labels),
        tokenizer=tokenizer,
        info=info,
        bucket_signatures=bucket_signatures,
        early_exit=early_exit,
        head=head,
        embedding=embedding,
        outputs=outputs,
        sparse_idf=sparse_idf,
    )


def _sparse_idf(assets: Path, outputs: Outputs | None, vocab_size: int) -> np.ndarray | None:
    """Return the IDF table of an inference-free sparse query side (None: the model has none)."""
    spec = outputs.sparse if outputs is not None else None
    if spec is None or spec.query_form != "idf":
        return None
    if not spec.query_asset:
        raise ValueError("model.json outputs.sparse.query names no idf asset")
    return read_idf(assets / spec.query_asset, vocab_size)


def version_identity(base_path: Path, model: str, version: int) -> tuple[int, int, int]:
    """Return what changes when a version number is deleted and published again.

    Export renames a new directory into place, so a republished version has a new inode (and a
    new model.json); (-1, -1, -1) when it does not exist, which ``load_assets`` then reports.
    """
    try:
        directory = os.stat(base_path / model / str(version))
        info = os.stat(base_path / model / str(version) / "assets" / "model.json")
    except OSError:
        return (-1, -1, -1)
    return (directory.st_ino, info.st_ino, info.st_mtime_ns)


class AssetCache:
    """ModelAssets per (model, version), loaded once per published directory.

    A version directory never changes once published, but it may be deleted and a new one
    published under the same number: a hit older than ``recheck_s`` is checked against the
    directory's identity (two ``stat`` calls), so the new version's vocabulary and labels are
    used from then on. (The model server itself sees such a republish only when it reloads the
    version; the gateway's view of version states lags by ``GATEWAY_STATUS_CACHE_S`` too.)
    Single flight: requests that miss the same version together wait for one load (reading a
    vocabulary and building its tokenizer), not one load each.
    """

    def __init__(self, base_path: str | Path, capacity: int = 16, recheck_s: float = 1.0) -> None:
        self.base_path = Path(base_path)
        self.capacity = capacity
        self.recheck_s = recheck_s
        # (model, version) -> (identity, checked at, assets)
        self._items: OrderedDict[tuple[str, int], tuple[Any, float, ModelAssets]] = OrderedDict()
        self._loading: dict[tuple[str, int], _Load] = {}  # loads in flight
        self._lock = threading.Lock()

    def get(self, model: str, version: int) -> ModelAssets:
        """Return the assets of ``model`` ``version``, loading them on first use."""
        key = (model, version)
        now = time.monotonic()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and now - hit[1] < self.recheck_s:
                self._items.move_to_end(key)
                return hit[2]  # checked recently: no stat on the hot path
        identity = version_identity(self.base_path, check_model_name(model), version)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and hit[0] == identity:
                self._items[key] = (identity, now, hit[2])
                self._items.move_to_end(key)
                return hit[2]
            load = self._loading.get(key)
            leader = load is None or load.identity != identity
            if leader:
                load = self._loading[key] = _Load(identity)
        assert load is not None
        if not leader:
            load.done.wait()
            if load.error is not None:
                # a copy: one exception raised in many threads would gather all their frames
                raise copy.copy(load.error).with_traceback(None)
            assert load.assets is not None
            return load.assets
        try:
            load.assets = load_assets(self.base_path, model, version)  # outside the lock: I/O
        except BaseException as exc:
            load.error = exc
            raise
        finally:
            with self._lock:
                if self._loading.get(key) is load:
                    del self._loading[key]
                if load.assets is not None:
                    self._items[key] = (identity, now, load.assets)
                    self._items.move_to_end(key)
                    while len(self._items) > self.capacity:
                        self._items.popitem(last=False)
            load.done.set()
        return load.assets


class _Load:
    """One version's assets being loaded, awaited by every request that missed them meanwhile."""

    def __init__(self, identity: tuple[int, int, int]) -> None:
        self.identity = identity
        self.done = threading.Event()
        self.assets: ModelAssets | None = None
        self.error: BaseException | None = None


# What one look-up can add to GATEWAY_LABELS_CACHE_S before a worker serves a rewritten
# config's labels: the read and parse of a small file, with room for a loaded volume.
LABELS_READ_MARGIN_S = 1.0


def label_staleness_bound_s(labels_cache_s: float) -> float:
    """Return how long after models.config is replaced a gateway worker may still use old labels.

    ``LabelTable`` reads the file's content every ``labels_cache_s`` (not only when stat() says it
    changed), so the bound holds on NFS/EFS whatever their attribute caches hide; push_model's
    ``--reader-wait`` is derived from it.
    """
    return labels_cache_s + LABELS_READ_MARGIN_S


def parse_version_labels(text: str) -> dict[str, dict[str, int]]:
    """Return model → label → version from a text-format ModelServerConfig."""
    return serverconfig.version_labels(serverconfig.parse(text))


class LabelTable:
    """Version labels from the serving config file, re-read every ``recheck_s``.

    ``backend.reloading.ReloadingFile``: the file's content is read on every recheck and parsed
    only when its hash changes, so a label change is seen within ``recheck_s`` plus one read
    whatever an NFS/EFS attribute cache hides (see ``label_staleness_bound_s``); an unreadable
    file keeps the last good labels and raises ``gateway_model_config_stale``.
    """

    def __init__(self, config_file: str, recheck_s: float = 1.0) -> None:
        self.path = Path(config_file) if config_file else None
        self.recheck_s = recheck_s
        self._file: ReloadingFile[dict[str, dict[str, int]]] | None = None
        if self.path is not None:
            self._file = ReloadingFile(
                self.path, lambda data: parse_version_labels(data.decode("utf-8")), {},
                recheck_s=recheck_s, what="serving config", errors=metrics.MODEL_CONFIG_ERRORS,
                stale=metrics.MODEL_CONFIG_STALE, logger=log,
            )  # fmt: skip

    def version_for(self, model: str, label: str) -> int:
        """Return the version ``label`` points at for ``model``; 404 if there is none."""
        labels = self._current().get(model, {})
        if label not in labels:
            where = self.path or "no GATEWAY_MODEL_CONFIG_FILE configured"
            raise LabelNotFound(f"model {model!r} has no version label {label!r} ({where})")
        return int(labels[label])

    def labels(self, model: str) -> dict[str, int]:
        """Return every label of ``model``."""
        return dict(self._current().get(model, {}))

    def models(self) -> list[str]:
        """Return the names of the models the serving config lists, in its order."""
        return list(self._current())

    def _current(self) -> dict[str, dict[str, int]]:
        return self._file.get() if self._file is not None else {}

    def refresh(self) -> None:
        """Re-check the file on the next look-up, whatever ``recheck_s`` says."""
        if self._file is not None:
            self._file.refresh()


# Unknown model names whose 404 a worker remembers (for ``GATEWAY_STATUS_CACHE_S``) at most: a
# few hundred bytes each, so a client inventing names can't grow the worker.
NEGATIVE_CAPACITY = 1024


class _Fetch:
    """One GetModelStatus call in flight, shared by every thread that needs its answer."""

    def __init__(self, background: bool = False) -> None:
        self.background = background  # callers get the last answer meanwhile
        self.superseded = False  # ``invalidate`` came after it started: its answer is not kept
        self.done = threading.Event()
        self.statuses: list[VersionStatus] = []
        self.error: BaseException | None = None


# Background status refreshes a worker runs at once (each bounded by the fetch's own timeout).
REFRESH_THREADS = 4


class StatusCache:
    """The model server's version states per model, cached for ``ttl_s``.

    Single flight: when the entry is missing, one thread fetches and the others wait for its
    answer (or its error), at most ``wait_s``, instead of each calling the model server. When the
    entry has expired, the last answer is served while one background fetch refreshes it, so a
    slow refresh (a hung replica) never holds a request; but only an answer less than
    ``2 * ttl_s`` old is served so (or while the refresh it started runs). An older one was
    fetched before a quiet spell: a worker whose default requests all went to versions the
    routing file named never asked, and serving the answer it kept from before a version loaded
    once the routing entry was removed sent default traffic to the old version (a rollout's
    promotion did). Such an answer is refetched in the foreground, as a missing one is, so the
    newest AVAILABLE version a request resolves to is at most ``2 * ttl_s`` plus one fetch old.
    An unknown model's 404 is cached for
    ``ttl_s`` too, so requests for it don't fan out to every replica each time: as a fact (its
    error class and message), never the exception itself, whose traceback would keep the frames
    of the request that raised it (its parsed body) alive; and only for the ``negative_capacity``
    names asked for last, so a client naming a new model per request grows nothing.
    ``invalidate`` marks a fetch in flight superseded, so a fetch that started before it can't
    store its older answer (nothing is kept per model name beyond the two caches).
    """

    def __init__(
        self,
        fetch: Callable[[str], list[VersionStatus]],
        ttl_s: float = 1.0,
        wait_s: float = 10.0,
        negative_capacity: int = NEGATIVE_CAPACITY,
    ) -> None:
        self._fetch = fetch
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.negative_capacity = negative_capacity
        self._items: dict[str, tuple[float, list[VersionStatus]]] = {}
        # model -> (when, the 404's class, its message), oldest first
        self._missing: OrderedDict[str, tuple[float, type[NotFound], str]] = OrderedDict()
        self._flights: dict[str, _Fetch] = {}
        self._lock = threading.Lock()
        # background refreshes, one per model at a time (threads made on first use)
        self._refresher = ThreadPoolExecutor(REFRESH_THREADS, thread_name_prefix="status")

    def close(self) -> None:
        """Stop taking background refreshes (one already running finishes on its own)."""
        self._refresher.shutdown(wait=False, cancel_futures=True)

    def get(self, model: str, *, fresh: bool = False) -> list[VersionStatus]:
        """Return ``model``'s version states (fetched at most once per ttl, by one thread);
        ``fresh``: fetched now (or by the fetch already in flight), and kept for the next."""
        now = time.monotonic()
        with self._lock:
            hit = None if fresh else self._items.get(model)
            if hit is not None and now - hit[0] < self.ttl_s:
                return hit[1]
            missing = None if fresh else self._missing.get(model)
            if missing is not None and now - missing[0] < self.ttl_s:
                metrics.child(metrics.STATUS_REFRESHES, "negative").inc()
                raise missing[1](missing[2])
            flight = self._flights.get(model)
            leader = flight is None
            if hit is not None and not (
                now - hit[0] < 2 * self.ttl_s or (flight is not None and flight.background)
            ):
                hit = None  # too old to serve while refreshing: fetch it as if missing
            if flight is None:
                flight = _Fetch(background=hit is not None)
                self._flights[model] = flight
        if hit is not None:
            # Expired: serve the last answer; one background fetch brings the next. Handed to a
            # waiting thread, not a new one: Thread.start() returns only once the new thread has
            # run up to its first blocking call (its fetch's Python, ~1 ms under the GIL), which
            # the request that found the answer stale then paid in its resolve stage.
            if leader:
                self._refresher.submit(self._lead, model, flight)
            metrics.child(metrics.STATUS_REFRESHES, "stale").inc()
            return hit[1]
        if not leader:
            if not flight.done.wait(self.wait_s):
                raise UpstreamTimeout(
                    f"the model server's version states for {model!r} did not come in "
                    f"{self.wait_s:g}s"
                )
            if flight.error is not None:
                raise flight.error
            return flight.statuses
        self._lead(model, flight)
        if flight.error is not None:
            raise flight.error
        return flight.statuses

    def _lead(self, model: str, flight: _Fetch) -> None:
        try:
            flight.statuses = self._fetch(model)
            metrics.child(metrics.STATUS_REFRESHES, "fresh").inc()
        except BaseException as exc:  # handed to the waiters (and raised by a foreground leader)
            flight.error = exc
        finally:
            with self._lock:
                if self._flights.get(model) is flight:
                    del self._flights[model]
                current = not flight.superseded
                if flight.error is None and current:
                    self._items[model] = (time.monotonic(), flight.statuses)
                    self._missing.pop(model, None)
                elif isinstance(flight.error, NotFound) and current:
                    self._remember_missing(model, flight.error)
                    self._items.pop(model, None)
                elif current:
                    # No replica answered: stop serving the old answer, so the next look-up
                    # (a request, /readyz) asks again and reports the outage.
                    self._items.pop(model, None)
            flight.done.set()

    def _remember_missing(self, model: str, error: NotFound) -> None:
        """Keep that ``model`` is not served (under the lock): expired and surplus names go."""
        now = time.monotonic()
        self._missing.pop(model, None)
        self._missing[model] = (now, type(error), error.message)
        while self._missing:
            oldest, (when, _, _) = next(iter(self._missing.items()))
            if now - when < self.ttl_s and len(self._missing) <= self.negative_capacity:
                break
            del self._missing[oldest]

    def newest_available(self, model: str) -> int:
        """Return the newest AVAILABLE version of ``model``; 503 if none is loaded yet."""
        newest = newest_available(self.get(model))
        if newest is None:
            raise UpstreamUnavailable(f"model {model!r} has no AVAILABLE version yet")
        return newest

    def invalidate(self, model: str) -> None:
        """Forget ``model``'s cached states, and any answer a fetch in flight would store."""
        with self._lock:
            self._items.pop(model, None)
            self._missing.pop(model, None)
            flight = self._flights.pop(model, None)
            if flight is not None:
                flight.superseded = True


class VersionResolver:
    """Decides the version of each request: explicit, label, or newest AVAILABLE."""

    def __init__(self, statuses: StatusCache, labels: LabelTable) -> None:
        self.statuses = statuses
        self.labels = labels

    def resolve(self, model: str, version: int | None, label: str | None) -> int:
        """Return the version that will serve ``model`` for this request."""
        check_model_name(model)
        if version is not None:
            return version
        if label is not None:
            return self.labels.version_for(model, label)
        return self.statuses.newest_available(model)
